"""``scopebench check-config``: the grid as benchopt expands it, invalid cells and parallel configs refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scopebench.cli import main
from scopebench.cluster import Layout
from scopebench.preflight import expand, load_classes, parse_pattern, preflight

REPO = Path(__file__).resolve().parents[2]
SLURM = str(REPO / "configs" / "parallel" / "slurm.yml")
EXPERIMENTS = {
    "benchmark_inference": sorted((REPO / "benchmark_inference" / "configs" / "experiments").glob("*.yml")),
    "benchmark_training": sorted((REPO / "benchmark_training" / "configs" / "experiments").glob("*.yml")),
}
#: The policy benchmark's benchopt run configs (repository root; configs/policy/ holds `scopebench train` configs).
POLICY = sorted([*(REPO / "configs").glob("*.yml"), *(REPO / "configs" / "experiments").glob("*.yml")])
SHIPPED = [(bench, p) for bench in EXPERIMENTS for p in sorted((REPO / bench / "configs").rglob("*.yml"))]
SHIPPED += [(".", p) for p in POLICY]

FRAMES = "multiframe_superres[image_size=32,num_operators=2,scale=2]"


def _config(tmp_path: Path, cells: str, extra: str = "") -> str:
    path = tmp_path / "run.yml"
    path.write_text(
        f"dataset:\n  - {FRAMES}\nsolver:\n  - PnP:\n      denoiser: tv\n"
        f'      "nproc_per_node, distribute_physics, slurm_ntasks_per_node":\n{cells}{extra}'
    )
    return str(path)


def _benchopt_grid(benchmark: str, patterns, kind: str) -> list[tuple[str, dict]]:
    """What benchopt 1.10 itself expands ``patterns`` to (the reference for :func:`expand`)."""
    from benchopt.benchmark import Benchmark
    from benchopt.utils.parametrized_name_mixin import _get_used_parameters

    bench = Benchmark(REPO / benchmark)
    if isinstance(patterns, (str, dict)):
        patterns = [patterns]
    check = bench.check_solver_patterns if kind == "solver" else bench.check_dataset_patterns
    return [(cls.name, params) for cls, selected in check(patterns) for params in _get_used_parameters(cls, selected)]


@pytest.mark.parametrize("benchmark, path", SHIPPED, ids=lambda v: getattr(v, "name", v))
def test_grid_matches_benchopt_expansion(benchmark, path):
    config = yaml.safe_load(path.read_text())
    classes = load_classes(REPO / benchmark)
    for kind, table in (("solver", classes.solvers), ("dataset", classes.datasets)):
        ours = [(name, full) for name, full, _ in expand(config.get(kind), table, kind)]
        assert ours == _benchopt_grid(benchmark, config.get(kind), kind), (path.name, kind)


def test_string_patterns_read_as_benchopt_reads_them():
    from benchopt.utils.parametrized_name_mixin import _extract_options

    for pattern in (
        "simulated[image_size=32,operator=[blur, inpainting],noise_level=1e-2]",
        "PnP[denoiser=tv, patch_size=None, distribute_physics=True, denoiser_sigma=0.05]",
        "tomography_2d[image='phantom',num_angles=[30, 90]]",
    ):
        name, _, params = _extract_options(pattern)
        assert parse_pattern(pattern) == [(name, params)]


@pytest.mark.parametrize(
    "benchmark, path", [(b, p) for b, ps in EXPERIMENTS.items() for p in ps], ids=lambda v: getattr(v, "name", v)
)
def test_accepts_the_shipped_experiment_configs(benchmark, path, capsys):
    code = main(
        ["check-config", str(REPO / benchmark), "--config", str(path), "--parallel-config", SLURM, "--cluster", "slurm"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "nothing was submitted" in out


def test_rejects_tasks_that_disagree_with_distribution(tmp_path, capsys):
    config = _config(tmp_path, "        - [2, true, 2]\n        - [2, false, 2]\n        - [3, true, 2]\n")
    code = main(
        [
            "check-config",
            str(REPO / "benchmark_inference"),
            "--config",
            config,
            "--parallel-config",
            SLURM,
            "--cluster",
            "slurm",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    lines = {
        line.split(":")[0].strip().split(" ")[0]: line for line in out.splitlines() if line.strip().startswith("#")
    }
    assert lines["#1"].endswith(": ok"), out
    assert "INVALID" in lines["#2"] and "distribute_physics or distribute_denoiser" in lines["#2"], out
    assert (
        "INVALID" in lines["#3"] and "nproc_per_node=3 disagrees with 1 node(s) x 2 task(s) per node" in lines["#3"]
    ), out
    assert "2 invalid cell(s)" in out


def test_a_cell_is_checked_as_inside_its_job(tmp_path):
    """Two SLURM tasks are the two ranks: a 2-task job of a 1-operator problem cannot split its operators."""
    config = tmp_path / "blur.yml"
    config.write_text(
        "dataset:\n  - simulated[image_size=32]\nsolver:\n  - PnP[nproc_per_node=2,distribute_physics=True,slurm_ntasks_per_node=2]\n"
    )
    report = preflight(REPO / "benchmark_inference", config, SLURM, cluster="slurm")
    assert report.errors == {1: "distribute_physics with 2 processes needs at least 2 operators, the problem has 1"}
    assert report.jobs[1]["slurm_ntasks_per_node"] == 2 and report.jobs[1]["slurm_nodes"] == 1


def test_invalid_values_name_their_key(tmp_path):
    config = tmp_path / "sigma.yml"
    config.write_text(
        f"dataset:\n  - {FRAMES}\nsolver:\n  - PnP:\n      denoiser_sigma: [0.01, -1.0]\n      profiler_mode: fast\n"
    )
    report = preflight(REPO / "benchmark_inference", config)
    assert set(report.errors) == {1, 2}
    assert all(
        "profiler" in message or "denoiser_sigma" in message for message in report.errors.values()
    ), report.errors
    assert report.backend is None and report.jobs == {}


def test_declined_cells_are_listed_not_invalid(tmp_path):
    config = tmp_path / "volume.yml"
    config.write_text("dataset:\n  - denoising_3d[volume_size=16]\nsolver:\n  - PnP[denoiser=[tv, median]]\n")
    report = preflight(REPO / "benchmark_inference", config)
    assert report.ok and report.skips == {2: "denoiser='median' only handles 2-D images; denoising_3d is a volume"}


@pytest.mark.parametrize("extra", ["", "n-jobs: 2\n"])
def test_refuses_n_jobs_with_the_submitit_backend(tmp_path, capsys, extra):
    config = _config(tmp_path, "        - [1, false, 1]\n", extra="\n" + extra if extra else "")
    args = ["check-config", str(REPO / "benchmark_inference"), "--config", config, "--parallel-config", SLURM]
    code = main(args + ([] if extra else ["-j", "2"]))
    err = capsys.readouterr().err
    assert code == 2
    assert "-j/n_jobs cannot be combined with backend: submitit" in err


@pytest.mark.parametrize(
    "setting, message",
    [
        ("slurm_python: nsys profile python", "slurm_python is not accepted by benchopt 1.10"),
        ('slurm_time: "00:04:00"', "under 5 minutes"),
        ("slurm_partiton: gpu", "Submitit refuses these settings"),
        ("backend: joblib", "backend must be one of loky, dask, submitit"),
    ],
)
def test_refuses_parallel_configs_benchopt_would_fail_on(tmp_path, setting, message):
    parallel = tmp_path / "parallel.yml"
    parallel.write_text(("" if setting.startswith("backend") else "backend: submitit\n") + setting + "\n")
    with pytest.raises(ValueError, match=message):
        preflight(
            REPO / "benchmark_inference", _config(tmp_path, "        - [1, false, 1]\n"), parallel, cluster="slurm"
        )


def test_json_lists_jobs_and_submissions(tmp_path, capsys):
    config = _config(tmp_path, "        - [1, false, 1]\n        - [2, true, 2]\n        - [2, true, 2]\n")
    (tmp_path / "run.yml").write_text(
        (tmp_path / "run.yml").read_text().replace("denoiser: tv", "denoiser: [tv, median]")
    )
    code = main(
        [
            "check-config",
            str(REPO / "benchmark_inference"),
            "--config",
            config,
            "--parallel-config",
            SLURM,
            "--cluster",
            "slurm",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"]
    assert report["submissions"] == 2  # one job array per distinct resources
    by_tasks = {}
    for cell in report["cells"]:
        by_tasks.setdefault(cell["job"]["slurm_ntasks_per_node"], set()).add(cell["submission"])
        assert cell["job"]["slurm_partition"] == "gpu" and cell["job"]["slurm_time"] == "00:30:00"
    assert len(by_tasks[1]) == len(by_tasks[2]) == 1 and by_tasks[1] != by_tasks[2]
    assert {tuple(sorted(c["solver_params"])) for c in report["cells"]} == {
        ("denoiser", "distribute_physics", "nproc_per_node", "slurm_ntasks_per_node")
    }


def test_sbatch_preview_holds_the_cell_resources(tmp_path, capsys):
    config = _config(tmp_path, "        - [2, true, 2]\n")
    nsys = str(REPO / "configs" / "parallel" / "slurm_nsys.yml")
    code = main(
        [
            "check-config",
            str(REPO / "benchmark_inference"),
            "--config",
            config,
            "--parallel-config",
            nsys,
            "--cluster",
            "slurm",
            "--sbatch",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    for line in (
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --nodes=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --cpus-per-task=4",
    ):
        assert line in out.splitlines(), out
    assert " nsys profile -o 'outputs/nsys/%q{SLURM_JOB_ID}_%q{SLURMD_NODENAME}_rank%q{SLURM_PROCID}'" in out
    # The cell is not profiled with profiler_mode: nvidia, so nsys would record nothing.
    assert "only profiler_mode: nvidia calls" in out


@pytest.mark.parametrize("path", POLICY, ids=lambda p: p.name)
def test_accepts_the_shipped_policy_configs(path, capsys):
    code = main(["check-config", str(REPO), "--config", str(path), "--parallel-config", SLURM, "--cluster", "slurm"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "nothing was submitted" in out and "no preflight hook" not in out, out


def _policy_config(tmp_path: Path, solvers: str) -> Path:
    path = tmp_path / "policy.yml"
    path.write_text(f"dataset:\n  - synthetic_robot\nsolver:\n{solvers}max-runs: 2\n")
    return path


def test_policy_invalid_values_name_their_key(tmp_path):
    config = _policy_config(
        tmp_path, "  - Pi05Train[batch_size=0]\n  - Pi05Dataloader[batch_size=0]\n  - Pi05Inference[num_steps=0]\n"
    )
    report = preflight(REPO, config)
    assert report.errors == {
        1: "batch_size must be an integer >= 1, got 0",
        2: "batch_size must be an integer >= 1, got 0",
        3: "num_steps must be an integer >= 1, got 0",
    }
    assert not report.unchecked


def test_policy_zero_on_one_process_is_declined(tmp_path):
    from scopebench.policy.settings import backend_conflict

    config = _policy_config(
        tmp_path,
        "  - Pi05Train[backend=[ddp, zero2],nproc_per_node=1]\n"
        "  - Pi05Train[backend=zero3,gradient_checkpointing=True,nproc_per_node=2]\n",
    )
    report = preflight(REPO, config)
    assert report.ok, report.errors
    # What Solver.skip returns; benchopt asks it before set_objective, which would refuse cell 3.
    assert report.skips == {
        2: backend_conflict("zero2", False, False, world_size=1),
        3: backend_conflict("zero3", True, False, world_size=2),
    }
    assert "needs at least 2 processes, got 1" in report.skips[2]


def test_policy_slurm_tasks_are_the_ranks(tmp_path, capsys):
    """Under 2 SLURM tasks nproc_per_node is 1 or 2 (nothing spawned), and ZeRO-2 has its 2 ranks."""
    config = _policy_config(
        tmp_path,
        '  - Pi05Train:\n      "backend, nproc_per_node, slurm_ntasks_per_node":\n'
        "        - [zero2, 1, 2]\n        - [ddp, 2, 2]\n        - [ddp, 3, 2]\n",
    )
    code = main(["check-config", str(REPO), "--config", str(config), "--parallel-config", SLURM, "--cluster", "slurm"])
    out = capsys.readouterr().out
    assert code == 1, out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("#")}
    assert lines["#1"].endswith(": ok") and lines["#2"].endswith(": ok"), out
    assert (
        "INVALID" in lines["#3"]
        and "nproc_per_node=3 disagrees with 1 node(s) x 2 task(s) per node (SLURM)" in lines["#3"]
    ), out
    assert "1 invalid cell(s)" in out


def test_each_cell_shows_its_nodes_tasks_and_world_size(tmp_path, capsys):
    """2 nodes x 2 tasks is world size 4 (nproc_per_node 2 or 1); 2 nodes x 1 task with nproc_per_node 2 is refused."""
    config = tmp_path / "nodes.yml"
    config.write_text(
        f"dataset:\n  - {FRAMES.replace('num_operators=2', 'num_operators=4')}\nsolver:\n  - PnP:\n"
        "      denoiser: tv\n      distribute_physics: true\n"
        '      "nproc_per_node, slurm_nodes, slurm_ntasks_per_node":\n'
        "        - [2, 2, 2]\n        - [1, 2, 2]\n        - [2, 2, null]\n        - [2, 1, null]\n"
    )
    command = ["check-config", str(REPO / "benchmark_inference"), "--config", str(config)]
    command += ["--parallel-config", SLURM, "--cluster", "slurm"]
    code = main([*command, "--json"])
    cells = {cell["index"]: cell for cell in json.loads(capsys.readouterr().out)["cells"]}
    assert code == 1
    four = {"nodes": 2, "ranks_per_node": 2, "world_size": 4, "spawned": False}
    assert cells[1]["layout"] == four and cells[2]["layout"] == four, cells
    assert "nproc_per_node=2 disagrees with 2 node(s) x 1 task(s) per node (SLURM)" in cells[3]["error"], cells[3]
    assert cells[4]["layout"] == {"nodes": 1, "ranks_per_node": 2, "world_size": 2, "spawned": True}, cells[4]
    assert cells[1]["error"] is None and cells[2]["error"] is None and cells[4]["error"] is None, cells
    main(command)
    out = capsys.readouterr().out
    assert out.count("ranks: 2 node(s) x 2 task(s) per node = world size 4") == 2, out
    assert "ranks: 1 process spawning 2 on 1 node = world size 2" in out, out


def test_a_cell_without_a_launcher_has_the_ranks_its_process_spawns_in_every_benchmark(tmp_path):
    """No parallel config: each cell is one process spawning ``nproc_per_node`` ranks here
    (:func:`scopebench.cluster.cell_layout`), the same for the three benchmarks' checks and
    for the layout check-config prints. ``slurm_nodes`` > 1 is refused, the SLURM keys still
    follow the rule, and a ``slurm_ntasks_per_node`` of 2 with ``nproc_per_node: 1`` is one rank
    here (it was two for the imaging checks: a one-process PnP ran with ``distribute_physics``)."""
    launch = "slurm_nodes=2 needs a SLURM or torchrun launch; this run is a single local process"
    policy = _policy_config(
        tmp_path,
        '  - Pi05Train:\n      "backend, nproc_per_node, slurm_nodes, slurm_ntasks_per_node":\n'
        "        - [ddp, 1, 2, 1]\n        - [ddp, 3, 1, 2]\n        - [ddp, 2, 1, 2]\n        - [zero2, 1, 1, 2]\n",
    )
    report = preflight(REPO, policy)
    assert report.errors[1] == launch, report.errors
    assert "nproc_per_node=3 disagrees with 1 node(s) x 2 task(s) per node" in report.errors[2], report.errors
    assert 3 not in report.errors and report.layouts[3] == Layout(nodes=1, ranks_per_node=2, spawned=True)
    assert "needs at least 2 processes, got 1" in report.skips[4], report.skips  # ZeRO on the one rank here

    pnp = tmp_path / "pnp.yml"
    pnp.write_text(
        f"dataset:\n  - {FRAMES}\nsolver:\n  - PnP:\n      denoiser: tv\n      distribute_physics: true\n"
        '      "nproc_per_node, slurm_nodes, slurm_ntasks_per_node":\n'
        "        - [1, 1, 2]\n        - [2, 1, 2]\n        - [1, 2, 1]\n"
    )
    report = preflight(REPO / "benchmark_inference", pnp)
    assert "distribute_physics need(s) more than one process, got nproc_per_node=1" in report.errors[1], report.errors
    assert report.layouts[1].world_size == 1 and 2 not in report.errors and report.layouts[2].world_size == 2
    assert report.errors[3] == launch, report.errors

    unrolled = tmp_path / "unrolled.yml"
    unrolled.write_text(
        "dataset:\n  - synthetic\nsolver:\n  - UnrolledPnP:\n      distribute_model: false\n"
        '      "nproc_per_node, slurm_nodes, slurm_ntasks_per_node":\n'
        "        - [1, 1, 2]\n        - [2, 1, 2]\n        - [1, 2, 1]\n"
    )
    report = preflight(REPO / "benchmark_training", unrolled)
    assert 1 not in report.errors and report.layouts[1].world_size == 1, report.errors
    assert report.errors[2].startswith("2 processes need distribute_model=true"), report.errors
    assert report.errors[3] == launch, report.errors
