"""The policy benchmark (repository root) end to end through benchopt, and its run configs."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import yaml
from conftest import REPO, run_benchopt_test
from policy.helpers import TRAIN_COLUMNS, TRAIN_PHASES

from scopebench.runs import run_benchopt

TRAIN_COLUMNS = [*TRAIN_COLUMNS, "val_loss", "train_loss"]


def solver_parameters(name: str) -> dict:
    spec = importlib.util.spec_from_file_location(name, REPO / "solvers" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Solver.parameters


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy") / "quickstart.parquet"
    run = run_benchopt(REPO, REPO / "configs" / "quickstart.yml", output=out)
    return pd.read_parquet(run.parquet)


@pytest.mark.slow
def test_quickstart_columns_and_phases(quickstart):
    df = quickstart
    train = df[df.solver_name.str.startswith("Pi05Train")]
    loader = df[df.solver_name.str.startswith("Pi05Dataloader")]
    infer = df[df.solver_name.str.startswith("Pi05Inference")]
    assert len(train) == 7 and len(loader) == 7 and len(infer) == 14  # stop_val 0..6, two profiler modes
    recorded = train[train["objective_total_time_sec"].notna()]
    for column in TRAIN_COLUMNS:
        assert recorded[f"objective_{column}"].notna().all(), column
    for phase in TRAIN_PHASES:
        assert (recorded[f"objective_{phase}_time_sec"] > 0).all(), phase
    assert (recorded["objective_peak_flops_source"] == "measured_cpu_matmul").all()
    assert train["objective_setup_time_sec"].nunique() == 1  # a constant column
    step = recorded["objective_total_time_sec"] - recorded["objective_callback_time_sec"]
    assert (recorded["objective_samples_per_sec"] - 4 / step).abs().max() < 1e-6
    loaded = loader[loader["objective_total_time_sec"].notna()]
    for column in ("fetch_time_sec", "h2d_time_sec", "batches_per_sec", "samples_per_sec"):
        assert loaded[f"objective_{column}"].notna().all(), column
    for phase in ("preprocess", "prefill", "denoise", "postprocess"):
        assert infer[f"objective_{phase}_time_sec"].notna().any(), phase
        assert infer[f"objective_{phase}_cpu_sec"].notna().any(), phase
    assert train["objective_val_loss"].notna().all()
    assert infer["objective_action_mse"].notna().all()


@pytest.mark.slow
def test_row_k_carries_iteration_k_minus_1_and_phases_add_up(quickstart):
    """benchopt canary: with warm-up 1, rows 0 and 1 carry no metrics, rows 2.. do."""
    train = quickstart[quickstart.solver_name.str.startswith("Pi05Train")].sort_values("stop_val")
    has = train["objective_total_time_sec"].notna().tolist()
    assert has == [False, False, True, True, True, True, True]
    recorded = train[train["objective_total_time_sec"].notna()]
    regions = recorded[[f"objective_{p}_time_sec" for p in TRAIN_PHASES]].sum(axis=1)
    assert (recorded["objective_total_time_sec"] >= regions).all()
    step = recorded["objective_total_time_sec"] - recorded["objective_callback_time_sec"]
    assert recorded["objective_untracked_time_sec"].median() < 0.1 * step.median()


@pytest.mark.slow
def test_two_ranks_through_benchopt(tmp_path):
    config = tmp_path / "two_ranks.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "dataset": ["synthetic_robot"],
                "solver": [{"Pi05Train": {"nproc_per_node": 2, "find_unused_params": False, "profiler_warmup": 1}}],
                "max-runs": 3,
                "n-repetitions": 1,
                "timeout": 600,
            }
        )
    )
    df = pd.read_parquet(run_benchopt(REPO, config, output=tmp_path / "r.parquet").parquet)
    recorded = df[df["objective_total_time_sec"].notna()]
    assert len(recorded) == 2 and (recorded["objective_world_size"] == 2).all()
    step = recorded["objective_step_time_sec"]  # the slowest rank's step (its own total - callback)
    assert (recorded["objective_samples_per_sec"] - 2 * 4 / step).abs().max() < 1e-6  # both ranks' samples
    assert recorded["objective_max_rss_mb_rank1"].notna().all()
    assert df["objective_setup_time_sec"].nunique() == 1


@pytest.mark.slow
def test_bad_parameter_stops_the_solver_naming_key_and_value(tmp_path):
    config = tmp_path / "bad.yml"
    config.write_text(
        yaml.safe_dump(
            {"dataset": ["synthetic_robot"], "solver": [{"Pi05Train": {"batch_size": "abc"}}], "max-runs": 2}
        )
    )
    run = run_benchopt(REPO, config, output=tmp_path / "bad.parquet", check=False)
    assert "batch_size must be an integer >= 1, got 'abc' (str)" in run.log


RUN_CONFIGS = sorted([*(REPO / "configs").glob("*.yml"), *(REPO / "configs" / "experiments").glob("*.yml")])


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_run_configs_set_a_timeout_and_name_real_parameters(path):
    config = yaml.safe_load(path.read_text())
    assert isinstance(config.get("timeout"), int) and config["timeout"] >= 60
    for entry in config["solver"]:
        ((name, params),) = entry.items()
        known = solver_parameters(
            {"Pi05Train": "pi05_train", "Pi05Dataloader": "pi05_dataloader", "Pi05Inference": "pi05_inference"}[name]
        )
        for key in params:
            for part in key.split(","):
                assert part.strip() in known, f"{path.name}: {name} has no parameter {part.strip()!r}"


@pytest.mark.slow
def test_benchopt_test_passes():
    run_benchopt_test(REPO)
