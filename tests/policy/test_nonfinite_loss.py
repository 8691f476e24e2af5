"""A training loss that turns NaN: ``scopebench train`` stops and keeps the last finite checkpoint
(one rank, two local ranks, ``gather_every`` > 1), ``profile-step`` says it and exits 1, and
``Pi05Train`` raises so that benchopt records the error. The policy is a user policy whose
loss is NaN at its third training step (on every rank, or on one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scopebench.cli import main

from .conftest import TINY

REPO = Path(__file__).resolve().parents[2]

NAN_POLICY = """
import torch
from scopebench.policy import UserPolicy


def make_policy(nan_at: int = 3, rank: int = -1, size: int = 64):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(size, 4, generator=g), torch.randn(size, 1, generator=g))
    calls = [0]

    def loss(model, batch):
        x, y = batch
        mse = torch.nn.functional.mse_loss(model(x), y)
        if torch.is_grad_enabled():  # a training step (the validation loss runs under no_grad)
            calls[0] += 1
            here = rank < 0 or torch.distributed.get_rank() == rank
            if calls[0] == nan_at and here:
                mse = mse * float("nan")
        return mse, {"flow_mse": mse.detach()}

    # a FLOP count given: no measuring call to the loss before training
    return UserPolicy(model=torch.nn.Linear(4, 1), loss=loss, dataset=data, flops_per_sample=10)
"""


@pytest.fixture(scope="module")
def nan_policy(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policies") / "nan_policy.py"
    path.write_text(NAN_POLICY)
    return f"{path}:make_policy"


def _train_args(policy: str, out: Path, *extra: str) -> list[str]:
    return ["train", "--config", TINY, "--policy", policy, "--output_dir", str(out), "--log_freq", "1", *extra]


def _checkpoints(out: Path) -> tuple[list[str], str | None]:
    folder = out / "checkpoints"
    names = sorted(p.name for p in folder.iterdir() if p.name != "last") if folder.is_dir() else []
    last = folder / "last"
    return names, (last.resolve().name if last.exists() else None)


def test_train_stops_at_the_first_nan_and_keeps_the_last_finite_checkpoint(nan_policy, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(_train_args(nan_policy, out, "--steps", "6", "--save_freq", "1", "--json", str(tmp_path / "t.json")))
    err = capsys.readouterr().err
    line = (
        "scopebench train: step 3: loss term 'flow_mse' is nan (train_loss nan): stopped; the last checkpoint, "
        f"step 2, is kept as {out}/checkpoints/last"
    )
    assert code == 1 and err.splitlines() == [line], err
    assert _checkpoints(out) == (["000001", "000002"], "000002")  # nothing of step 3 or later
    report = json.loads((tmp_path / "t.json").read_text())
    assert report["steps"] == 3 and [Path(p).name for p in report["checkpoints"]] == ["000001", "000002"]
    found = report["nonfinite_loss"]
    assert (found["step"], found["term"], found["rank"], found["checked_at"]) == (3, "flow_mse", 0, 3)
    assert found["message"] == line.removeprefix("scopebench train: ")


@pytest.mark.parametrize(
    ("save_freq", "kept", "note"),
    [
        # gathers at steps 1, 4, 7: the NaN of step 3 is found at step 4, whose save is then skipped
        ("4", ([], None), " (train_loss nan; found at step 4: gather_every=3 checks the losses every 3 steps)"),
        # a save checks the steps not gathered yet first: step 3's is never written
        ("1", (["000001", "000002"], "000002"), " (train_loss nan)"),
    ],
)
def test_with_gather_every_the_line_names_the_step_and_no_later_checkpoint_is_saved(
    nan_policy, tmp_path, capsys, save_freq, kept, note
):
    out = tmp_path / "run"
    code = main(_train_args(nan_policy, out, "--steps", "8", "--save_freq", save_freq, "--gather_every=3"))
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"scopebench train: step 3: loss term 'flow_mse' is nan{note}: stopped; "), err
    assert _checkpoints(out) == kept
    assert ("no checkpoint was written" in err) == (kept[1] is None)


@pytest.mark.slow
def test_two_local_ranks_stop_together_when_one_rank_turns_nan(nan_policy, tmp_path):
    """NaN on rank 1 only: rank 0 stops too (both read the gathered losses), the launcher names
    no culprit, and the one line says which rank."""
    out = tmp_path / "run"
    args = _train_args(nan_policy, out, "--steps", "6", "--save_freq", "2", "--nproc-per-node", "2")
    proc = subprocess.run(
        [sys.executable, "-m", "scopebench.cli", *args, "--policy-arg", "rank=1"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    ours = [line for line in proc.stderr.splitlines() if line.startswith("scopebench train:")]
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    assert ours == [
        "scopebench train: step 3: loss term 'flow_mse' is nan on rank 1 (train_loss nan): stopped; the last "
        f"checkpoint, step 2, is kept as {out}/checkpoints/last"
    ], proc.stderr[-4000:]
    assert _checkpoints(out) == (["000002"], "000002")
    assert "step 3/6 loss=nan" in proc.stdout  # the logged loss is the ranks' mean: NaN, not rank 0's alone


def test_profile_step_measures_on_but_says_it_and_exits_1(nan_policy, tmp_path, capsys):
    args = ["profile-step", "--config", TINY, "--policy", nan_policy, "--steps", "4", "--warmup", "1"]
    code = main([*args, "--json", str(tmp_path / "s.json")])
    captured = capsys.readouterr()
    report = json.loads((tmp_path / "s.json").read_text())
    assert code == 1 and report["measured"] == 4 and "throughput:" in captured.out
    found = report["nonfinite_loss"]
    assert (found["step"], found["measured_step"], found["term"]) == (3, 2, "flow_mse")
    assert captured.err.splitlines() == [
        "scopebench profile-step: step 3: loss term 'flow_mse' is nan (train_loss nan); measured step 2 (steps "
        "count from the first of the 1 warm-up steps): the times from that step on are of training on non-finite "
        "values"
    ], captured.err


def test_profile_step_of_finite_losses_has_no_nonfinite_field(nan_policy, tmp_path, capsys):
    args = ["profile-step", "--config", TINY, "--policy", nan_policy, "--policy-arg", "nan_at=100"]
    code = main([*args, "--steps", "2", "--warmup", "0", "--json", str(tmp_path / "s.json")])
    assert code == 0 and json.loads((tmp_path / "s.json").read_text())["nonfinite_loss"] is None


@pytest.mark.slow
def test_pi05train_raises_and_benchopt_records_the_error(nan_policy, tmp_path):
    """benchopt logs the error with the line, marks the cell ``error`` (what run_benchopt's check
    fails on: benchopt itself exits 0, docs/design.md) and keeps the finite cell's rows."""
    from scopebench.runs import run_benchopt

    config = tmp_path / "nan.yml"
    cells = [{"policy": [nan_policy], "batch_size": [2]}]
    cells.append({**cells[0], "policy_args": [{"nan_at": 100}]})  # finite all along
    config.write_text(
        yaml.safe_dump(
            {
                "dataset": ["synthetic_robot"],
                "solver": [{"Pi05Train": cell} for cell in cells],
                "max-runs": 5,
                "n-repetitions": 1,
                "timeout": 600,
            }
        )
    )
    run = run_benchopt(REPO, config, output=tmp_path / "nan.parquet", check=False)
    message = "NonFiniteLossError: Pi05Train: step 3: loss term 'flow_mse' is nan (train_loss nan): stopped"
    assert message in run.log, run.log[-4000:]
    assert any(line.rstrip().endswith(": error") for line in run.log.splitlines()), run.log[-4000:]
    rows = pd.read_parquet(run.parquet)
    assert run.returncode == 0 and len(rows) == 6  # max-runs + 1 rows of the finite cell, none of the other
    assert rows["solver_name"].str.contains("nan_at", regex=False).all()
