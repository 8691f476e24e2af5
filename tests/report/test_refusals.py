"""``scopebench report``: an output folder that cannot be written is refused before any work,
and NaN / inf time values are left out of the statistics with one warning line per column."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scopebench.cli import main

from .helpers import config_rows, write


def report(args, capsys):
    code = main(["report", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def results(tmp_path):
    return write(tmp_path / "results.parquet", config_rows("Pi05Train", {"forward": 0.1, "bwd": 0.2}, n=8))


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_output_folder_that_cannot_be_written_is_refused_in_one_line(results, tmp_path, capsys, where):
    file = tmp_path / "taken"
    file.write_text("a file")
    out_dir = file if where == "file" else file / "report"
    code, out, err = report([results, "-o", str(out_dir)], capsys)
    assert code == 2 and out == "", out
    expected = (
        "is a file, not a directory" if where == "file" else f"cannot be created: {str(file)!r} is not a directory"
    )
    assert err == f"scopebench report: -o/--output={str(out_dir)!r} {expected}\n", err


def test_an_output_folder_in_a_read_only_folder_is_refused(results, read_only_dir, capsys):
    out_dir = read_only_dir / "report"
    code, _, err = report([results, "-o", str(out_dir)], capsys)
    assert code == 2 and err.startswith(f"scopebench report: -o/--output={str(out_dir)!r} is not a writable"), err


def test_an_output_folder_is_refused_before_the_results_are_read(tmp_path, capsys):
    file = tmp_path / "taken"
    file.write_text("a file")
    code, _, err = report([str(tmp_path / "missing.parquet"), "-o", str(file)], capsys)
    assert code == 2 and "-o/--output=" in err and "missing.parquet" not in err, err


def test_non_finite_times_are_left_out_of_the_statistics_with_one_warning_per_column(tmp_path, capsys):
    rows = config_rows("Pi05Train", {"forward": 0.1, "bwd": 0.2}, n=10, noise=0.0)
    recorded = [r for r in rows if "objective_total_time_sec" in r]
    recorded[2]["objective_forward_time_sec"] = math.nan
    recorded[3]["objective_forward_time_sec"] = math.inf
    recorded[4]["objective_bwd_time_sec"] = -math.inf
    path = write(tmp_path / "bad.parquet", rows)
    assert math.isinf(pd.read_parquet(path)["objective_forward_time_sec"].max())
    code, out, err = report([path, "-o", str(tmp_path / "out")], capsys)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: results file {path!r}: 2 non-finite value(s) (NaN or inf) in objective_forward_time_sec "
        "left out of the statistics",
        f"warning: results file {path!r}: 1 non-finite value(s) (NaN or inf) in objective_bwd_time_sec "
        "left out of the statistics",
    ], err
    assert "inf" not in out and "nan" not in out, out
    forward = next(line for line in out.splitlines() if line.startswith("forward "))
    assert "mean=  100.000ms" in forward, forward


def test_nan_outside_the_profiler_window_is_not_warned_about(results, tmp_path, capsys):
    code, _, err = report([results, "-o", str(tmp_path / "out")], capsys)
    assert code == 0 and "warning" not in err, err
