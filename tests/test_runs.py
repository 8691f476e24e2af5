"""scopebench.runs: checked benchopt runs say when benchopt stopped a solver on its timeout."""

from __future__ import annotations

import time
import warnings

import pandas as pd
import pytest
from conftest import REPO

from scopebench.cli import main
from scopebench.runs import TruncatedRunWarning, _max_runs, read_run_metadata, run_benchopt

BENCH = REPO / "benchmark_training"
CONFIG = BENCH / "configs" / "quickstart.yml"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture
def no_weights_left():
    """The quickstart saves its trained denoiser in outputs/: remove the ones these runs wrote."""
    start = time.time()
    yield
    for path in (BENCH / "outputs").glob("unrolled_pnp_*_denoiser.safetensors"):
        if path.stat().st_mtime >= start:
            path.unlink(missing_ok=True)


def test_max_runs_from_command_line_then_config_then_default(tmp_path):
    assert _max_runs(CONFIG, None) == 60
    assert _max_runs(CONFIG, ["--max-runs", "7"]) == 7 and _max_runs(CONFIG, ["-n", "8"]) == 8
    (tmp_path / "c.yml").write_text("solver: [x]\n")
    assert _max_runs(tmp_path / "c.yml", None) == 100 and _max_runs(None, None) == 100


@pytest.mark.slow
def test_run_stopped_on_timeout_is_reported_by_run_benchopt_and_summary(tmp_path, capsys, no_weights_left):
    out = tmp_path / "short.parquet"
    with pytest.warns(TruncatedRunWarning, match=r"after \d+ rows, before max-runs 1000"):
        run = run_benchopt(
            BENCH, CONFIG, output=out, extra_args=["--timeout", "3", "--max-runs", "1000"], env=ONE_THREAD
        )
    rows = len(pd.read_parquet(out))
    assert 0 < rows < 1001
    (stopped,) = run.stopped_on_timeout
    assert stopped.rows == rows and stopped.solver.startswith("UnrolledPnP[") and stopped.max_runs == 1000
    assert read_run_metadata(out)["stopped_on_timeout"][0]["rows"] == rows
    capsys.readouterr()
    assert main(["summary", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1, lines
    assert f"UnrolledPnP (unrolled_pnp_training) stopped on benchopt's timeout after {rows} rows" in lines[0]
    assert "before max-runs 1000" in lines[0]


@pytest.mark.slow
def test_complete_run_has_no_timeout_warning(tmp_path, capsys, no_weights_left):
    out = tmp_path / "complete.parquet"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedRunWarning)
        run = run_benchopt(BENCH, CONFIG, output=out, extra_args=["--max-runs", "3"], env=ONE_THREAD)
    assert run.stopped_on_timeout == () and len(pd.read_parquet(out)) == 4
    assert read_run_metadata(out) == {"max_runs": 3, "stopped_on_timeout": []}
    assert main(["summary", str(out)]) == 0
    assert "warning:" not in capsys.readouterr().out
