"""The phase table and the ``scopebench summary`` command."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from scopebench.cli import main
from scopebench.report.summary import phase_table


@pytest.fixture
def results(tmp_path):
    rows = []
    for mode in ("custom", "null"):
        for k, total in enumerate([None, 0.010, 0.020, 0.030]):
            recorded = mode == "custom" and total is not None
            rows.append(
                {
                    "solver_name": f"PnP[denoiser=tv,profiler_mode={mode}]",
                    "stop_val": k,
                    "objective_value": -20.0,
                    "objective_total_time_sec": total if recorded else None,
                    "objective_denoise_time_sec": total / 2 if recorded else None,
                    "objective_callback_time_sec": 0.001 if recorded else None,
                }
            )
    path = tmp_path / "r.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_phase_table_statistics_and_share(results):
    rows = phase_table(pd.read_parquet(results))
    by_phase = {r["phase"]: r for r in rows}
    assert {r["solver"] for r in rows} == {"PnP[profiler_mode=custom]"}  # null rows carry no metrics
    assert by_phase["total_time_sec"]["n"] == 3
    assert by_phase["total_time_sec"]["median_ms"] == pytest.approx(20.0)
    assert by_phase["denoise_time_sec"]["share_pct"] == pytest.approx(50.0)
    assert by_phase["callback_time_sec"]["share_pct"] is None


def test_cli_json_and_errors(results, tmp_path, capsys):
    assert main(["summary", str(results), "--json"]) == 0
    assert {r["phase"] for r in json.loads(capsys.readouterr().out)} >= {"total_time_sec", "denoise_time_sec"}
    assert main(["summary", str(tmp_path / "missing.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    assert main(["summary", str(bad)]) == 2
    assert "not a readable parquet" in capsys.readouterr().err
