"""The policy training run object: phases, derived columns, no-optim, dataloader task, ranks."""

from __future__ import annotations

import os

import pytest

from scopebench.policy.phases import DATALOADER_PHASES
from scopebench.policy.run.train import PolicyTrainRun
from scopebench.policy.settings import TrainSettings
from scopebench.profiler import ProfilerConfig
from scopebench.stats import median

from .helpers import TRAIN_COLUMNS, TRAIN_PHASES


def run_steps(root, steps: int = 6, warmup: int = 1, task: str = "train", **settings):
    metrics = []
    n = [0]

    def callback() -> bool:
        if n[0]:
            metrics.append(run.metrics())
        n[0] += 1
        return n[0] <= steps

    run = PolicyTrainRun(
        TrainSettings(**settings),
        dataset_root=root,
        chunk_size=8,
        task=task,
        profiler=ProfilerConfig(warmup=warmup),
        keep_rows=True,  # rank_rows: every rank's samples, as the tools read them
    )
    with run:
        run.loop(callback)
    return run, metrics


def test_phases_add_up_and_every_column_is_there(robot_data):
    run, metrics = run_steps(robot_data[1], steps=8, warmup=2)
    recorded = [m for m in metrics if "total_time_sec" in m]
    assert len(recorded) == 6 and all("total_time_sec" not in m for m in metrics[:2])
    for m in recorded:
        assert set(TRAIN_COLUMNS) <= set(m), set(TRAIN_COLUMNS) - set(m)
        regions = sum(m[f"{p}_time_sec"] for p in TRAIN_PHASES)
        step = m["total_time_sec"] - m["callback_time_sec"]
        assert m["total_time_sec"] >= regions
        assert m["samples_per_sec"] == pytest.approx(4 / step)
        assert m["steps_per_sec"] == pytest.approx(1 / step)
        backward = sum(m[f"{p}_time_sec"] for p in ("bwd", "unscale_clip", "optim_step", "zero_grad_sched"))
        assert m["backward_step_time_sec"] == pytest.approx(backward)
        assert 0 < m["mfu"] <= 1 and m["peak_flops_source"] == "measured_cpu_matmul"
        assert m["mfu"] == pytest.approx(m["achieved_flops_per_sec"] / m["peak_flops_per_sec"])
        assert m["world_size"] == 1 and m["max_rss_mb_rank0"] > 0
        assert m["train_loss"] > 0 and m["ce_loss"] > 0 and m["mse_loss"] > 0
    # Nothing of substance runs outside the phases. Medians: on a shared machine a
    # descheduled moment can land between two regions of any single step.
    untracked = median(m["untracked_time_sec"] for m in recorded)
    assert untracked < 0.1 * median(m["total_time_sec"] - m["callback_time_sec"] for m in recorded)
    # set-up is reported once, as a constant, never inside an iteration
    assert len({m["setup_time_sec"] for m in metrics}) == 1 and metrics[0]["setup_time_sec"] > 0


def test_outside_the_window_only_constant_columns(robot_data):
    _, metrics = run_steps(robot_data[1], steps=2, warmup=5)
    assert metrics and all(
        set(m)
        == {"setup_time_sec", "world_size", "peak_flops_per_sec", "peak_flops_source"}
        | {"host_records_json", "load_average_1m_start", "load_average_1m_end"}  # the host, not the window
        for m in metrics
    )


def test_no_optim_leaves_the_weights_alone(robot_data):
    run, metrics = run_steps(robot_data[1], steps=3, warmup=0, no_optim=True)
    before = run_steps(robot_data[1], steps=0, warmup=0)[0]
    assert run.work.optimizer is None and run.work.scheduler is None
    assert run.rank_checks[0]["weights_checksum"] == before.rank_checks[0]["weights_checksum"]
    trained, _ = run_steps(robot_data[1], steps=3, warmup=0)
    assert trained.rank_checks[0]["weights_checksum"] != before.rank_checks[0]["weights_checksum"]
    assert all(p.grad is None for p in run.unwrapped_model.parameters())


def test_gather_every_gates_the_gathers(robot_data):
    calls = []
    run = PolicyTrainRun(TrainSettings(gather_every=3), dataset_root=robot_data[1], chunk_size=8)
    with run:
        memory = run.work.memory  # read once per gather (one process: no collective to count)
        run.work.memory = lambda: calls.append(1) or memory()
        n = [0]
        run.loop(lambda: (n.__setitem__(0, n[0] + 1) or n[0] <= 7))
    assert len(calls) == 3  # steps 0, 3 and 6 of 7


def test_dataloader_task_has_no_model_and_reports_batches(robot_data):
    run, metrics = run_steps(robot_data[1], steps=4, warmup=1, task="dataloader")
    assert run.model is None and run.unwrapped_model is None
    m = metrics[-1]
    assert {f"{p}_time_sec" for p in DATALOADER_PHASES} <= set(m)
    assert not any(f"{p}_time_sec" in m for p in TRAIN_PHASES)
    step = m["total_time_sec"] - m["callback_time_sec"]
    assert m["batches_per_sec"] == pytest.approx(1 / step) and m["samples_per_sec"] == pytest.approx(4 / step)


def test_a_run_restarts_and_releases_accelerate(robot_data):
    from accelerate.state import AcceleratorState

    run = PolicyTrainRun(TrainSettings(), dataset_root=robot_data[1], chunk_size=8)
    for _ in range(2):  # benchopt repetitions start the same run object again
        with run:
            n = [0]
            run.loop(lambda: (n.__setitem__(0, n[0] + 1) or n[0] <= 2))
        assert AcceleratorState._shared_state == {}
        assert "RANK" not in os.environ


def test_an_error_in_the_loop_tears_everything_down(robot_data):
    from accelerate.state import AcceleratorState

    run = PolicyTrainRun(TrainSettings(), dataset_root=robot_data[1], chunk_size=8)
    with pytest.raises(RuntimeError, match="boom"):
        with run:
            run.step = lambda prof: (_ for _ in ()).throw(RuntimeError("boom"))
            run.loop(lambda: True)
    assert AcceleratorState._shared_state == {}


@pytest.mark.slow
def test_two_ranks_share_the_work_and_count_both_in_samples_per_sec(robot_data):
    run, metrics = run_steps(robot_data[1], steps=5, warmup=1, nproc_per_node=2, find_unused_params=False)
    # accelerate sees both ranks on both ranks (DDP, not two single processes) ...
    assert [c["accelerate_num_processes"] for c in run.rank_checks] == [2, 2]
    # ... and DDP keeps the weights identical after the optimizer steps
    assert run.rank_checks[0]["weights_checksum"] == pytest.approx(run.rank_checks[1]["weights_checksum"], rel=1e-9)
    m = metrics[-1]
    step = m["step_time_sec"]  # the slowest rank's own step (max over ranks, not max total - max callback)
    assert m["world_size"] == 2 and m["samples_per_sec"] == pytest.approx(2 * 4 / step)
    assert m["max_rss_mb_rank0"] > 0 and m["max_rss_mb_rank1"] > 0
    assert m["max_rss_mb"] == max(m["max_rss_mb_rank0"], m["max_rss_mb_rank1"], m["max_rss_mb"])
    assert len(run.rank_rows) == 2 and len(run.rank_rows[1]) == 4
    assert len({x["setup_time_sec"] for x in metrics}) == 1


def test_rows_are_kept_only_when_asked_or_written(robot_data):
    run = PolicyTrainRun(TrainSettings(), dataset_root=robot_data[1], chunk_size=8)
    calls = iter([True, True, False])
    with run:
        run.loop(lambda: next(calls))
    assert run.rank_rows == [[]] and run.profiler.last_local["total_time_sec"] > 0


def test_gradient_accumulation_takes_every_micro_batch_into_one_optimizer_step(robot_data):
    run, metrics = run_steps(robot_data[1], steps=3, warmup=0, gradient_accumulation_steps=2, batch_size=2)
    assert run.work.steps == 3 and run.work.batches.position == 6  # two batches per step
    state = next(iter(run.work.optimizer.state_dict()["state"].values()))
    assert int(state["step"]) == 3  # one AdamW step per iteration
    m = metrics[-1]
    assert run.global_batch_size == 4
    assert m["samples_per_sec"] == pytest.approx(4 / (m["total_time_sec"] - m["callback_time_sec"]))


def test_a_checkpoint_resumes_the_data_position_without_loading_the_skipped_batches(robot_data, monkeypatch):
    """Resumed at batch 3, the run takes the batches the uninterrupted one takes next, and the
    sampler skips the first three without the dataset decoding them."""
    from scopebench.policy.data.dataset import RobotDataset

    with PolicyTrainRun(TrainSettings(), dataset_root=robot_data[1], chunk_size=8) as run:
        reference = [next(run.work.batches)["state"] for _ in range(5)]
    loaded = []
    original = RobotDataset.__getitem__
    monkeypatch.setattr(RobotDataset, "__getitem__", lambda self, i: loaded.append(i) or original(self, i))
    with PolicyTrainRun(TrainSettings(), dataset_root=robot_data[1], chunk_size=8) as run:
        run.work.batches.resume(0, 3, run._sampler, samples_per_batch=4)
        resumed = [next(run.work.batches)["state"] for _ in range(2)]
        assert run.training_state() == {"step": 0, "epoch": 0, "position": 5}
    assert all((a == b).all() for a, b in zip(resumed, reference[3:5]))
    assert len(loaded) < 5 * 4  # at most the two batches and accelerate's one-batch look-ahead
