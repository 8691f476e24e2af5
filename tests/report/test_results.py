"""Reading result files: one clear error per bad input, regions discovered from the columns."""

from __future__ import annotations

import pandas as pd
import pytest

from scopebench.cli import main
from scopebench.report.results import configurations, load_results

from .helpers import config_rows, write


@pytest.fixture
def good(tmp_path):
    return write(tmp_path / "good.parquet", config_rows("Pi05Train", {"forward": 0.01, "bwd": 0.02}))


def _bad_inputs(tmp_path, good):
    truncated = tmp_path / "truncated.parquet"
    data = open(good, "rb").read()
    truncated.write_bytes(data[: len(data) // 2])
    text = tmp_path / "text.parquet"
    text.write_text("not parquet")
    empty = tmp_path / "empty.parquet"
    pd.DataFrame(
        {c: pd.Series(dtype="object") for c in ("objective_name", "dataset_name", "solver_name", "stop_val")}
    ).to_parquet(empty)
    foreign = tmp_path / "foreign.parquet"
    pd.DataFrame({"a": [1, 2], "b": [3.0, 4.0]}).to_parquet(foreign)
    folder = tmp_path / "empty_folder"
    folder.mkdir()
    return [
        (tmp_path / "missing.parquet", "does not exist"),
        (truncated, "not a readable parquet file"),
        (text, "not a readable parquet file"),
        (empty, "holds no rows"),
        (foreign, "is not a benchopt result"),
        (folder, "holds no .parquet results file"),
    ]


@pytest.mark.parametrize("command", ["summary", "report", "compare"])
def test_bad_inputs_get_one_error_naming_the_file(command, tmp_path, good, capsys):
    for path, message in _bad_inputs(tmp_path, good):
        argv = [command, str(path)] + ([good] if command == "compare" else [])
        if command == "report":
            argv += ["-o", str(tmp_path / "out")]
        assert main(argv) == 2, (command, path)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and str(path) in err[0], (command, path, err)
        assert not (tmp_path / "out" / "report.html").exists()


def test_regions_come_from_columns_so_new_regions_need_no_code(tmp_path):
    path = write(
        tmp_path / "r.parquet",
        config_rows("FutureSolver", {"encode": 0.01, "teleport": 0.03}, params={"mode": "custom"}),
        config_rows("FutureSolver", {"encode": 0.02, "teleport": 0.01}, params={"mode": "torch"}, suffix="_cpu_sec"),
        config_rows("Pi05Train", {"forward": 0.01, "bwd": 0.02, "backward_step": 0.025}),
    )
    custom, torch, train = configurations(load_results([path]))
    assert custom.regions == ("encode", "teleport") and custom.region_columns["teleport"] == "teleport_time_sec"
    assert torch.regions == ("encode", "teleport") and torch.region_columns["teleport"] == "teleport_cpu_sec"
    assert train.regions == ("forward", "bwd") and train.composites == ("backward_step",)
    assert (custom.label, torch.label) == ("FutureSolver[mode=custom]", "FutureSolver[mode=torch]")
    # Warm-up rows and the evaluation before the first iteration carry no metrics.
    assert custom.iterations() == list(range(1, 20)) and len(custom.rows) == 21


def test_folder_reads_every_parquet(tmp_path):
    write(tmp_path / "a.parquet", config_rows("A", {"x": 0.01}))
    write(tmp_path / "b.parquet", config_rows("B", {"y": 0.01}))
    df = load_results([tmp_path])
    assert sorted(df["solver_name"].str.partition("[")[0].unique()) == ["A", "B"] and df["result_file"].nunique() == 2


def test_step_comes_from_step_time_sec_and_old_files_fall_back_to_total_minus_callback(tmp_path):
    new = config_rows("New", {"forward": 0.01}, callback=0.002, extra={"step_time_sec": 0.5})
    old = config_rows("Old", {"forward": 0.01}, callback=0.002)
    new_config, old_config = configurations(load_results([write(tmp_path / "r.parquet", new, old)]))
    # A column of its own, not a region; read as is (0.5 is no total - callback of these rows).
    assert "step" not in new_config.regions and new_config.step_values() == [0.5] * 19
    # Old rows in the same frame have an empty step column: each falls back on its own.
    rec = old_config.recorded
    assert rec["objective_step_time_sec"].isna().all()
    expected = (rec["objective_total_time_sec"] - rec["objective_callback_time_sec"]).tolist()
    assert old_config.step_values() == pytest.approx(expected) and len(expected) == 19


def test_results_of_several_files_are_read_without_a_fragmented_frame_warning(tmp_path):
    # make demo printed pandas' PerformanceWarning: the three quickstarts' files concatenated
    # hold a block per column, and the first column added to them warned.
    import warnings

    paths = []
    for b in range(3):
        columns = {"objective_name": ["pi05"] * 2, "dataset_name": ["d"] * 2, "solver_name": [f"S{b}"] * 2}
        columns |= {"stop_val": [1, 2], "objective_total_time_sec": [0.1, 0.2]}
        for i in range(40):  # each file its own columns, strings with a null: one block each
            columns |= {f"objective_r{b}_{i}_time_sec": [0.1, 0.2], f"p_solver_s{b}_{i}": ["a", None]}
        paths.append(tmp_path / f"{b}.parquet")
        pd.DataFrame(columns).to_parquet(paths[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        df = load_results(paths)
        configs = configurations(df)
        df.assign(added=1)  # what a reader of the frame may do
    assert [c.solver for c in configs] == ["S0", "S1", "S2"]
