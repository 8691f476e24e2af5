"""The results page: crafted runs of the validation benchmark in, docs/validation.md's tables out."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scopebench.validation.page import (
    against_performance,
    delay_sweep,
    matrix,
    null_runs,
    run_table,
    runs,
    write_page,
)


def run_rows(fault: str, backend: str = "ddp", mode: str = "custom", seed: int = 0, **final) -> list[dict]:
    """A run's rows as benchopt writes them: an empty first evaluation, then its final score."""
    dataset = {"fault": fault, "phase": final.pop("phase", "bwd"), "delay_ms": final.pop("delay_ms", 100.0),
               "every": final.pop("every", 1), "magnitude": None, "rank": 1, "step": 3, "seed": seed}  # fmt: skip
    solver = {"backend": backend, "profiler_mode": mode, "nproc_per_node": 2, "profiler_memory": False}
    head = {
        "objective_name": "validation",
        "dataset_name": "injected[" + ",".join(f"{k}={v}" for k, v in dataset.items()) + "]",
        "solver_name": "Detect[" + ",".join(f"{k}={v}" for k, v in solver.items()) + "]",
        "idx_rep": 0,
        **{f"p_dataset_{k}": v for k, v in dataset.items()},
        **{f"p_solver_{k}": v for k, v in solver.items()},
    }
    score = {"detected": math.nan, "named_right": math.nan, "error_pct": math.nan, "false_positive": 0.0,
             "false_positive_rules": "", "findings": "", "contended": 0.0, "steps_to_detect": math.nan,
             "overhead_pct": 2.0, "overhead_low_pct": -1.0, "overhead_high_pct": 5.0, "load_average_1m_start": 1.5,
             **final}  # fmt: skip
    return [{**head, "stop_val": 0}, {**head, "stop_val": 1, **{f"objective_{k}": v for k, v in score.items()}}]


@pytest.fixture
def results(tmp_path):
    rows = []
    hit = dict(detected=1.0, named_right=1.0, steps_to_detect=1.0)
    for backend in ("ddp", "fsdp2"):
        rows += run_rows("late_rank", backend, error_pct=2.0, **hit)
        rows += run_rows("late_rank", backend, delay_ms=5.0, detected=0.0, named_right=0.0)
        rows += run_rows("late_rank", backend, delay_ms=20.0, error_pct=4.0, **hit)
        for seed in range(4):
            fp = seed == 0 and backend == "ddp"
            rows += run_rows("none", backend, seed=seed, false_positive=float(fp),
                             false_positive_rules="rank-imbalance" if fp else "", contended=1.0)  # fmt: skip
    path = tmp_path / "validation.parquet"
    other = [{"objective_name": "pi05 policy", "dataset_name": "x", "solver_name": "Pi05Train", "stop_val": 1}]
    pd.DataFrame(rows + other).to_parquet(path)
    return path


def test_each_run_is_its_last_row_with_plain_names(results):
    table = runs([results])
    assert len(table) == 2 * 7  # the policy benchmark's row is not a validation run
    assert {"fault", "delay_ms", "backend", "profiler_mode", "detected", "overhead_pct"} <= set(table.columns)


def test_the_matrix_rates_errors_and_false_positives(results):
    cells = {(m["case"], m["backend"]): m for m in matrix(runs([results]))}
    late = cells[("late_rank bwd 100 ms", "ddp")]
    assert (late["runs"], late["detected_pct"], late["named_right_pct"], late["error_median_pct"]) == (1, 100, 100, 2)
    none = cells[("none", "ddp")]
    assert none["runs"] == 4 and none["false_positive_pct"] == 25.0 and math.isnan(none["detected_pct"])


def test_false_positives_per_100_null_runs_name_their_rules(results):
    by = {n["backend"]: n for n in null_runs(runs([results]))}
    assert by["ddp"]["false_positives_per_100"] == 25.0 and by["ddp"]["rules"] == "rank-imbalance (1)"
    assert by["fsdp2"]["false_positives_per_100"] == 0.0 and by["fsdp2"]["contended_pct"] == 100.0


def test_the_smallest_delay_named_right_from_which_every_larger_one_is(results):
    ddp, fsdp2 = delay_sweep(runs([results]))
    assert ddp["rates"] == {5.0: 0.0, 20.0: 100.0, 100.0: 100.0} and ddp["smallest_ms"] == 20.0


def test_the_overhead_is_set_against_performance_md(results):
    (custom,) = against_performance(runs([results]))
    assert custom["ratio"] == pytest.approx(1.02) and custom["within"] is True  # 0.96 [0.85, 1.04]


def test_the_page_fills_the_template_and_writes_the_matrix(results, tmp_path):
    template = tmp_path / "template.md"
    names = ("CONDITIONS", "MATRIX", "NULL_RUNS", "DELAY_SWEEP", "PERFORMANCE")
    template.write_text("# page\n" + "".join(f"<!-- {n} -->\n" for n in names))
    out = write_page([results], template, tmp_path / "page.md", tmp_path / "report", command="benchopt run x", date="D")
    text = out["page"].read_text()
    assert "<!--" not in text and "`benchopt run x`, D: 14 runs; load average 1.5–1.5" in text
    assert "| late_rank bwd 100 ms | ddp | custom | 1 | 100 % | 100 % | 2.0 % |" in text
    assert out["png"].stat().st_size > 0 and "data:image/png;base64," in out["html"].read_text()
    template.write_text("# no tables\n")
    with pytest.raises(ValueError, match="has no <!-- MATRIX --> line"):
        write_page([results], template, tmp_path / "p.md", tmp_path / "r", command="c", date="d")


def test_results_without_a_validation_run_are_refused(tmp_path):
    frame = pd.DataFrame([{"objective_name": "pi05 policy", "dataset_name": "x", "solver_name": "P", "stop_val": 1}])
    with pytest.raises(ValueError, match="^no run of the validation benchmark in the files given$"):
        run_table(frame)
