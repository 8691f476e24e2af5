"""The policy benchmark (repository root) end to end through benchopt."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import REPO, run_benchopt_test

from scopebench.runs import run_benchopt

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy") / "quickstart.parquet"
    run = run_benchopt(REPO, REPO / "configs" / "quickstart.yml", output=out)
    return pd.read_parquet(run.parquet)


def test_quickstart_columns_and_phases(quickstart):
    df = quickstart
    train = df[df.solver_name.str.startswith("Pi05Train")]
    infer = df[df.solver_name.str.startswith("Pi05Inference")]
    assert len(train) == 7 and len(infer) == 14  # stop_val 0..6, two profiler modes
    for phase in ("dataload_wait", "forward", "bwd", "unscale_clip", "optim_step", "zero_grad_sched"):
        assert (train[f"objective_{phase}_time_sec"].dropna() > 0).all(), phase
    for phase in ("preprocess", "prefill", "denoise", "postprocess"):
        assert infer[f"objective_{phase}_time_sec"].notna().any(), phase
        assert infer[f"objective_{phase}_cpu_sec"].notna().any(), phase
    assert train["objective_val_loss"].notna().all()
    assert infer["objective_action_mse"].notna().all()


def test_row_k_carries_iteration_k_minus_1(quickstart):
    """benchopt canary: with warm-up 1, rows 0 and 1 carry no metrics, rows 2.. do."""
    train = quickstart[quickstart.solver_name.str.startswith("Pi05Train")].sort_values("stop_val")
    has = train["objective_total_time_sec"].notna().tolist()
    assert has == [False, False, True, True, True, True, True]
    recorded = train[train["objective_total_time_sec"].notna()]
    regions = recorded.filter(regex=r"^objective_(?!total|callback|untracked).*_time_sec$").sum(axis=1)
    assert (recorded["objective_total_time_sec"] >= regions).all()


def test_benchopt_test_passes():
    run_benchopt_test(REPO)
