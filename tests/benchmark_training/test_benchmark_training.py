"""benchmark_training end to end through benchopt, and its solver's input checks."""

from __future__ import annotations

import os
import time

import pandas as pd
import pytest
from conftest import REPO, run_benchopt_test

from scopebench.imaging.training import build_training_data
from scopebench.runs import run_benchopt

BENCH = REPO / "benchmark_training"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # 2 shared cores: no thread oversubscription


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    start = time.time()
    out = tmp_path_factory.mktemp("training") / "quickstart.parquet"
    run = run_benchopt(BENCH, BENCH / "configs" / "quickstart.yml", output=out, env=ONE_THREAD)
    weights = [p for p in (BENCH / "outputs").glob("unrolled_pnp_*_denoiser.safetensors") if p.stat().st_mtime >= start]
    yield run, pd.read_parquet(run.parquet), weights
    for path in weights:
        path.unlink(missing_ok=True)


@pytest.mark.slow
def test_quickstart_rows_regions_and_learning(quickstart):
    _, df, _ = quickstart
    df = df.sort_values("stop_val")
    assert df["stop_val"].tolist() == list(range(61)) and df["objective_step"].tolist() == list(range(61))
    for region in ("forward", "backward", "optimizer_step"):
        column = f"objective_{region}_time_sec"
        # Warm-up 1: row k carries iteration k - 1, so rows 0 and 1 have no metrics.
        assert df[column].iloc[:2].isna().all() and (df[column].iloc[2:] > 0).all(), column
    recorded = df.iloc[2:]
    regions = recorded[[f"objective_{r}_time_sec" for r in ("forward", "backward", "optimizer_step")]].sum(axis=1)
    assert (recorded["objective_total_time_sec"] >= regions).all()
    assert (recorded["objective_samples_per_sec"] > 0).all()
    evaluated = df[df["objective_val_psnr"].notna()]
    assert evaluated["stop_val"].tolist() == list(range(0, 61, 10))
    # Validation runs inside the callback: its time shows up as callback time of the next row.
    assert (df.set_index("stop_val").loc[[11, 21], "objective_callback_time_sec"] > 0).all()
    assert evaluated["objective_val_psnr"].iloc[-1] >= evaluated["objective_val_psnr"].iloc[1] + 1.0
    assert df["objective_train_loss"].iloc[-10:].mean() < df["objective_train_loss"].iloc[1:11].mean()


@pytest.mark.slow
def test_set_up_is_one_constant_column_outside_every_iteration(quickstart):
    _, df, _ = quickstart
    setup = df["objective_setup_time_sec"]
    assert setup.notna().all() and setup.nunique() == 1 and setup.iloc[0] > 0


@pytest.mark.slow
def test_quickstart_writes_loadable_weights(quickstart):
    from scopebench.imaging.common.weights import load_denoiser_weights, read_denoiser_metadata

    _, _, weights = quickstart
    assert len(weights) == 1
    net = load_denoiser_weights(weights[0])
    assert type(net).__name__ == "DnCNN" and read_denoiser_metadata(weights[0])["train_steps"] == 60


@pytest.mark.slow
def test_benchopt_test_passes():
    run_benchopt_test(BENCH)


@pytest.fixture(scope="module")
def solver_class():
    from benchopt.benchmark import Benchmark

    return next(s for s in Benchmark(BENCH).get_solvers() if s.name == "UnrolledPnP")


@pytest.mark.parametrize(
    "params, message",
    [
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"n_unrolled": 0}, "n_unrolled must be an integer >= 1, got 0"),
        ({"denoiser": "unet"}, "denoiser must be one of"),
        ({"distribute_model": True, "patch_size": 64}, "patch_size=64 is larger than the image"),
        ({"checkpoint_batches": "often"}, "checkpoint_batches must be one of"),
        ({"profiler_mode": "perf"}, "profiler_mode must be one of"),
        ({"distribute_model": True, "patch_size": 8, "overlap": 8}, "^overlap=8 must be smaller than patch_size=8"),
        ({"group_timeout_sec": 0}, "^group_timeout_sec must be a finite number > 0, got 0$"),
        (
            {"nproc_per_node": 255, "distribute_model": True},
            rf"^nproc_per_node=255 exceeds the {os.cpu_count()} CPU cores of this machine",
        ),
    ],
)
def test_solver_rejects_bad_inputs_in_set_objective(solver_class, params, message):
    data = build_training_data(image_size=16, n_train=8, n_val=2)
    solver = solver_class.get_instance(**params)
    with pytest.raises(ValueError, match=message):
        solver.set_objective(data=data, data_params=data.spec.to_dict())
    assert not hasattr(solver, "training")  # nothing was started


def test_unwritable_outputs_are_refused_before_any_work(solver_class, read_only_dir):
    data = build_training_data(image_size=16, n_train=8, n_val=2)
    solver = solver_class.get_instance(profiler_save_file=True)
    solver.output_dir = read_only_dir
    with pytest.raises(ValueError, match=f"^profiler_save_file={str(read_only_dir)!r} is not a writable directory"):
        solver.set_objective(data=data, data_params=data.spec.to_dict())
    assert not hasattr(solver, "training")


def test_solver_declines_ranks_without_a_distributed_model(solver_class):
    data = build_training_data(image_size=16, n_train=8, n_val=2)
    skip, reason = solver_class.get_instance(nproc_per_node=2).skip(data=data, data_params={})
    assert skip and "distribute_model=true" in reason
    assert solver_class.get_instance(nproc_per_node=2, distribute_model=True).skip(data=data, data_params={}) == (
        False,
        None,
    )


def test_the_grid_holds_the_librarys_defaults(solver_class):
    # One source (issue 34): the solver's defaults are those of the configs that validate them.
    from scopebench.imaging.common.denoisers import DenoiserSpec
    from scopebench.imaging.training.trainer import SOLVER_PARAMS, TrainConfig, configs_from_params, solver_defaults
    from scopebench.imaging.training.unrolled import UnrolledConfig

    grid = solver_class.parameters
    assert {key: grid[key] for key in SOLVER_PARAMS} == solver_defaults()
    data = build_training_data(image_size=16, n_train=8, n_val=2)
    unrolled, train = configs_from_params(data.spec, **{key: values[0] for key, values in solver_defaults().items()})
    assert train == TrainConfig(seed=data.spec.seed)
    assert (unrolled.n_unrolled, unrolled.checkpoint) == (UnrolledConfig().n_unrolled, UnrolledConfig().checkpoint)
    assert (unrolled.denoiser.denoiser, unrolled.denoiser.channels) == (
        DenoiserSpec().denoiser,
        DenoiserSpec().channels,
    )
