"""benchmark_inference end to end: benchopt's own checks, the quickstart's columns, and
bad parameters failing with one clear message and nothing left in ``outputs/``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import run_benchopt_test

from scopebench.runs import run_benchopt

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmark_inference"
OUTPUTS = BENCH / "outputs"

pytestmark = pytest.mark.slow


def test_benchopt_test_passes():
    run_benchopt_test(BENCH)


def test_quickstart_writes_every_backend_columns(tmp_path):
    import pandas as pd

    before = sorted(OUTPUTS.iterdir())
    log = run_benchopt(BENCH, BENCH / "configs" / "quickstart.yml", output=tmp_path / "quickstart.parquet").log
    assert log.count("done (not enough run)") == 4, log[-3000:]
    df = pd.read_parquet(tmp_path / "quickstart.parquet")
    mode = df["p_solver_profiler_mode"].fillna("null")
    # benchopt exits 0 even when a solver fails: every backend must have all its rows.
    assert sorted(mode.unique()) == ["custom", "null", "nvidia", "torch"]
    assert (df.groupby(mode)["stop_val"].max() == 4).all()

    def present(m, column):
        return column in df and df.loc[mode == m, column].notna().any()

    for column in (
        "objective_gradient_time_sec",
        "objective_denoise_time_sec",
        "objective_total_time_sec",
        "objective_callback_time_sec",
    ):
        assert present("custom", column), column
    for column in ("objective_gradient_cpu_sec", "objective_denoise_cpu_sec", "objective_total_time_sec"):
        assert present("torch", column), column
    assert present("nvidia", "objective_total_time_sec")
    assert not present("null", "objective_total_time_sec")
    for column in (
        "objective_psnr",
        "objective_ssim",
        "objective_mse",
        "objective_device_name",
        "objective_torch_version",
        "objective_deepinv_version",
        "objective_scopebench_version",
    ):
        assert df[column].notna().all(), column
    assert (df["objective_value"] == -df["objective_psnr"]).all()
    # The row at stop_val = k scores k iterations: TV-PnP keeps improving.
    custom = df[mode == "custom"].sort_values("stop_val")
    assert custom["objective_psnr"].is_monotonic_increasing
    assert sorted(OUTPUTS.iterdir()) == before
    # Set-up is reported once per run, the same on every row, and never inside an iteration.
    setup = df.groupby(mode)["objective_setup_time_sec"]
    assert (setup.nunique() == 1).all() and (setup.min() > 0).all()


def test_bad_parameters_fail_cleanly(tmp_path):
    config = tmp_path / "bad.yml"
    config.write_text(
        "dataset:\n  - simulated[image_size=32]\n"
        "solver:\n"
        "  - PnP[denoiser=drunet]\n"
        "  - PnP[init_method=random]\n"
        "  - PnP[distribute_denoiser=true,patch_size=16]\n"
        "  - Denoiser[nproc_per_node=8,distribute_denoiser=true,patch_size=16]\n"
        "max-runs: 2\n"
    )
    before = sorted(OUTPUTS.iterdir())
    run = run_benchopt(BENCH, config, output=tmp_path / "bad.parquet", check=False)
    log = run.log
    assert "Reason: refused: denoiser='drunet' needs weights and none can be downloaded here" in log
    assert "Reason: refused: init_method must be one of 'zeros', 'adjoint', 'pseudo_inverse', got 'random'" in log
    assert "distribute_denoiser need(s) more than one process, got nproc_per_node=1" in log
    assert (
        "distribute_denoiser with 8 processes needs at least 8 tiles; patch_size=16 cuts the signal (32, 32) into 4"
        in log
    )
    # Errors are raised by scopebench's validation, before torch runs anything.
    assert "site-packages/torch" not in log and "site-packages/deepinv" not in log
    assert sorted(OUTPUTS.iterdir()) == before


def test_a_cell_that_refuses_a_value_says_why_in_one_line_and_fails_a_checked_run(tmp_path):
    """A value refused before any work (by ``check_cell``: an uncreatable ``profiler_trace_dir``;
    by the run object in ``set_objective``: ``group_timeout_sec``) is the cell's skip with a
    one-line reason, not benchopt's traceback; ``run_benchopt`` still fails on it, keeping
    the good cell's rows."""
    (tmp_path / "a_file").write_text("")
    traces = tmp_path / "a_file" / "traces"
    config = tmp_path / "refused.yml"
    trace = {"profiler_mode": "torch", "profiler_per_step": False, "profiler_trace_dir": str(traces)}
    solvers = [{"denoiser": "tv"}, {"denoiser": "tv", **trace}, {"denoiser": "tv", "group_timeout_sec": -1}]
    config.write_text(
        yaml.safe_dump(
            {"dataset": ["simulated[image_size=32]"], "solver": [{"PnP": s} for s in solvers], "max-runs": 2}
        )
    )
    with pytest.raises(RuntimeError) as err:
        run_benchopt(BENCH, config, output=tmp_path / "refused.parquet")
    message = str(err.value)
    assert '2 failure line(s): ["Reason: refused: profiler_trace_dir=' in message, message
    lines = [line.strip() for line in message.splitlines() if line.strip().startswith("Reason: ")]
    assert lines == [
        f"Reason: refused: profiler_trace_dir={str(traces)!r} cannot be created: "
        f"{str(tmp_path / 'a_file')!r} is not a directory",
        "Reason: refused: group_timeout_sec must be a finite number > 0, got -1",
    ], message
    assert "Traceback" not in message and message.count(": skip") == 2, message
    import pandas as pd

    assert pd.read_parquet(tmp_path / "refused.parquet")["stop_val"].max() == 2  # the good cell ran
