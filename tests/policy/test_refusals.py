"""Inputs refused before any work, with one line naming the key or file: a batch larger than
the dataset, an output folder that is a file, an image size too large for memory, an
unwritable ``--json`` path, and a dead rank in ``profile-step`` reported as the run's failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scopebench.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "policy" / "tiny.yml")
#: Each policy tool with its shortest run (were a refusal missing, the test stays short).
POLICY_TOOLS = {
    "profile-step": ["--steps", "1", "--warmup", "0"],
    "profile-dataloader": ["--batches", "1", "--warmup", "0"],
    "bench-inference": ["--n-timed", "1", "--n-warmup", "0"],
    "decompose-latency": ["--num-steps", "1,2", "--repeats", "1"],
    "find-unused-params": [],
}


@pytest.fixture(autouse=True)
def bench_output_dir(tmp_path, monkeypatch):
    """bench-inference's results go under tmp_path, were a refusal to fail (not the working directory)."""
    monkeypatch.setenv("BENCH_OUTPUT_DIR", str(tmp_path / "benchmark_results"))


def tool(args, capsys):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- a batch larger than the dataset -----------------------------------------------------------
def test_a_batch_larger_than_the_dataset_is_refused_at_construction(robot_data):
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings

    root = robot_data[1]  # 4 episodes x 24 frames: 96 samples (one per frame, chunks padded at the end)
    PolicyTrainRun(TrainSettings(batch_size=96), dataset_root=root, chunk_size=8)
    for task in ("train", "dataloader"):
        with pytest.raises(ValueError) as err:
            PolicyTrainRun(TrainSettings(batch_size=97), dataset_root=root, chunk_size=8, task=task)
        assert str(err.value) == (
            f"batch_size 97 is larger than the 96 training samples of the dataset ({root}): lower batch_size "
            "or use a larger dataset (dataset.num_episodes / dataset.episode_length)"
        )


def test_with_ranks_the_batch_is_compared_with_each_rank_s_share(robot_data):
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings

    root = robot_data[1]
    PolicyTrainRun(TrainSettings(batch_size=48, nproc_per_node=2), dataset_root=root, chunk_size=8)
    with pytest.raises(ValueError, match=r"^batch_size 49 is larger than the 48 training samples per rank") as err:
        PolicyTrainRun(TrainSettings(batch_size=49, nproc_per_node=2), dataset_root=root, chunk_size=8)
    assert "(96 over 2 ranks)" in str(err.value) and "\n" not in str(err.value)


def test_profile_step_with_a_batch_larger_than_the_dataset_exits_2_naming_batch_size(data_args, capsys):
    code, _, err = tool(["profile-step", *data_args, "--batch_size", "200", "--steps", "1", "--warmup", "0"], capsys)
    assert code == 2 and err.startswith("scopebench profile-step: batch_size 200 is larger than the 96"), err
    assert len(err.strip().splitlines()) == 1


def test_the_sample_count_needs_no_dataset_written(tmp_path):
    from scopebench.policy.data.dataset import RobotDataset, dataset_samples, synthetic_samples
    from scopebench.policy.data.synthetic import SyntheticRobotConfig, write_synthetic_dataset

    config = SyntheticRobotConfig(num_episodes=3, episode_length=5, image_size=8, num_cameras=1)
    root = write_synthetic_dataset(tmp_path / "d", config)
    for chunk_size in (1, 4, 50):  # padding past an episode's end: every frame is a sample
        assert len(RobotDataset(root, chunk_size=chunk_size)) == 15
    assert dataset_samples(root) == synthetic_samples(3, 5) == 15


def test_check_config_reports_a_batch_larger_than_the_dataset():
    from scopebench.policy.run.solver import TrainSolverMixin

    class Train(TrainSolverMixin):
        task = "train"

    class Dataloader(TrainSolverMixin):
        task = "dataloader"

    spec = {"kind": "synthetic_robot", "num_episodes": 2, "episode_length": 10}
    for solver in (Train, Dataloader):
        assert solver.check_cell({"batch_size": 20}, spec, None) is None
        with pytest.raises(ValueError, match=r"^batch_size 21 is larger than the 20 training samples of the"):
            solver.check_cell({"batch_size": 21}, spec, None)
        with pytest.raises(ValueError, match=r"^batch_size 11 is larger than the 10 training samples per rank"):
            solver.check_cell({"batch_size": 11, "nproc_per_node": 2}, spec, None)
    # the dataset's defaults (4 x 24) when the grid leaves them out
    with pytest.raises(ValueError, match=r"^batch_size 97 is larger than the 96 "):
        Train.check_cell({"batch_size": 97}, {"kind": "synthetic_robot"}, None)


# -- BENCH_OUTPUT_DIR naming a file --------------------------------------------------------------
@pytest.mark.parametrize("how", ["env", "flag"])
def test_bench_inference_refuses_an_output_dir_that_is_a_file(data_args, tmp_path, monkeypatch, capsys, how):
    file = tmp_path / "results.txt"
    file.write_text("not a folder")
    if how == "env":
        monkeypatch.setenv("BENCH_OUTPUT_DIR", str(file))
        extra, key = [], "BENCH_OUTPUT_DIR"
    else:
        extra, key = ["--output-dir", str(file)], "--output-dir"
    code, out, err = tool(["bench-inference", *data_args, "--n-timed", "1", *extra], capsys)
    assert code == 2 and out == "", out
    assert err == f"scopebench bench-inference: {key}={str(file)!r} is a file, not a directory\n", err


def test_check_writable_dir_says_a_file_is_a_file(tmp_path):
    from scopebench.profiler.config import check_writable_dir

    file = tmp_path / "f"
    file.write_text("")
    with pytest.raises(ValueError) as err:
        check_writable_dir("output_dir", file)
    assert str(err.value) == f"output_dir={str(file)!r} is a file, not a directory"


# -- an image size too large for memory --------------------------------------------------------
def test_an_image_size_too_large_for_memory_is_refused_naming_the_bytes(capsys):
    from scopebench.policy.data.synthetic import SyntheticRobotConfig
    from scopebench.policy.settings import DatasetSettings

    size = 200_000  # 2 episodes per file x 24 frames x 200000^2 pixels x 3 bytes x 2 cameras: 11.5 PB
    needed = 2 * 24 * size * size * 3 * 2
    with pytest.raises(ValueError) as err:
        DatasetSettings(image_size=size)
    message = str(err.value)
    assert message.startswith(f"dataset.image_size={size} needs at least {needed} bytes") and "\n" not in message
    assert "available" in message
    with pytest.raises(ValueError, match=r"^image_size=200000 needs at least"):  # the benchopt dataset's key
        SyntheticRobotConfig(image_size=size)
    DatasetSettings(image_size=64)


def test_profile_step_with_a_huge_image_size_exits_2_before_writing(data_args, capsys, robot_data):
    before = sorted(os.listdir(robot_data[0].cache_dir))
    code, _, err = tool(["profile-step", *data_args, "--dataset.image_size=300000", "--steps", "1"], capsys)
    assert code == 2 and err.startswith("scopebench profile-step: dataset.image_size=300000 needs at least"), err
    assert sorted(os.listdir(robot_data[0].cache_dir)) == before


# -- unwritable --json paths ---------------------------------------------------------------------
@pytest.fixture
def unwritable(tmp_path):
    """A folder no JSON can be written into: a file's name (a read-only mode is no use as root)."""
    folder = tmp_path / "ro"
    folder.write_text("a file")
    return folder


@pytest.mark.parametrize("name", POLICY_TOOLS)
def test_every_tool_refuses_an_unwritable_json_path_before_any_work(name, data_args, unwritable, capsys, started):
    path = unwritable / "out.json"
    code, out, err = tool([name, *data_args, *POLICY_TOOLS[name], "--json", str(path)], capsys)
    assert code == 2 and out == "", out
    assert err.startswith(f"scopebench {name}: --json {str(path)!r}: folder={str(unwritable)!r} is a file"), err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", POLICY_TOOLS)
def test_every_tool_refuses_a_json_path_that_is_a_folder(name, data_args, tmp_path, capsys, started):
    code, out, err = tool([name, *data_args, *POLICY_TOOLS[name], "--json", str(tmp_path)], capsys)
    assert code == 2 and out == "", out
    assert err == f"scopebench {name}: --json={str(tmp_path)!r} is a directory, not a file path\n", err


def test_train_refuses_an_unwritable_json_path_before_any_work(data_args, unwritable, tmp_path, capsys, started):
    path = unwritable / "out.json"
    args = ["--output_dir", str(tmp_path / "run"), "--steps", "1", "--json", str(path)]
    code, _, err = tool(["train", *data_args, *args], capsys)
    assert code == 2 and err.startswith(f"scopebench train: --json {str(path)!r}: folder="), err
    assert not (tmp_path / "run").exists()


def test_profile_step_s_json_environment_variable_is_checked_too(data_args, unwritable, monkeypatch, capsys, started):
    path = unwritable / "out.json"
    monkeypatch.setenv("PROFILE_STEP_JSON", str(path))
    code, _, err = tool(["profile-step", *data_args, *POLICY_TOOLS["profile-step"]], capsys)
    assert code == 2 and err.startswith(f"scopebench profile-step: PROFILE_STEP_JSON {str(path)!r}: folder="), err


# -- a dead rank in profile-step -------------------------------------------------------------------
def test_a_dead_rank_in_profile_step_fails_the_run_naming_it(data_args, monkeypatch, capsys):
    import scopebench.policy.run.train as train_run
    from scopebench.distributed import RankFailure

    class DiesOnRank1(train_run.PolicyTrainRun):
        def loop(self, *args, **kwargs):  # what rank 0 raises when the launcher saw rank 1 die
            raise RankFailure("rank 1 died after iteration 3 (exit code -9)")

    monkeypatch.setattr(train_run, "PolicyTrainRun", DiesOnRank1)
    code, out, err = tool(["profile-step", *data_args, "--steps", "1", "--warmup", "0"], capsys)
    assert code == 1, (out, err)
    assert err.endswith("scopebench profile-step: the run failed:\nrank 1 died after iteration 3 (exit code -9)\n"), err
    assert "Traceback" not in err


def test_a_json_path_in_a_read_only_folder_is_refused(data_args, read_only_dir, capsys, started):
    path = read_only_dir / "out.json"
    code, _, err = tool(["profile-step", *data_args, *POLICY_TOOLS["profile-step"], "--json", str(path)], capsys)
    assert code == 2, err
    assert err == (
        f"scopebench profile-step: --json {str(path)!r}: folder={str(read_only_dir)!r} is not a writable directory "
        f"({str(read_only_dir)!r} is read-only)\n"
    ), err
