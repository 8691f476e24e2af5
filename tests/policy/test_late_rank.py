"""The ledger on two gloo ranks under every backend, through ``scopebench profile-step``: a rank
whose backward stalls a known time is named with that delay, in ``bwd``; an even run names no
rank; per-parameter hooks that busy-wait grow ``bwd``'s work, not its communication; each
collective's bytes match what the backend must move (the policies: ``tests/profiler/stall_policy.py``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from scopebench.cli import main

pytestmark = pytest.mark.slow

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml")
POLICY = str(Path(__file__).resolve().parents[1] / "profiler" / "stall_policy.py")
WIDTH, LAYERS = 32, 4
#: The stall model's parameter (and gradient) bytes: LAYERS x (W x W weights + W biases), fp32.
PARAM_BYTES = LAYERS * (WIDTH * WIDTH + WIDTH) * 4
STEPS = 8

_runs: dict[tuple, dict] = {}


def profile(tmp_path_factory, capsys, backend: str, factory: str = "stalled", **args) -> dict:
    """profile-step's JSON of a 2-rank run of ``factory`` (cached per arguments)."""
    key = (backend, factory, *sorted(args.items()))
    if key not in _runs:
        out = tmp_path_factory.mktemp("late_rank") / "report.json"
        argv = ["profile-step", "--config", TINY, "--policy", f"{POLICY}:{factory}", "--nproc-per-node", "2"]
        argv += ["--steps", str(STEPS), "--warmup", "2", f"--backend={backend}", "--json", str(out)]
        for name, value in args.items():
            argv += ["--policy-arg", f"{name}={value}"]
        code = main(argv)
        text = capsys.readouterr().out
        assert code == 0, text
        _runs[key] = {**json.loads(out.read_text()), "text": text}
    return _runs[key]


def median(report: dict, rank: int, key: str) -> float:
    return statistics.median(report["per_rank"][rank]["samples"][key])


@pytest.mark.parametrize(
    "backend, rank, delay_ms", [("ddp", 1, 200), ("ddp", 0, 50), ("fsdp2", 0, 200), ("fsdp2", 1, 50)]
)
def test_a_rank_stalled_in_backward_is_named_with_its_delay(tmp_path_factory, capsys, backend, rank, delay_ms):
    report = profile(tmp_path_factory, capsys, backend, rank=rank, delay_ms=delay_ms)
    late = report["late_rank"]
    assert late is not None, report["text"]
    assert late["rank"] == rank and late["region"] == "bwd", late
    assert late["delay_sec"] == pytest.approx(delay_ms / 1e3, rel=0.25), late
    assert f"late rank: rank {rank}" in report["text"]
    # The other rank waited for it in bwd; the stalled rank did the work.
    other = 1 - rank
    assert median(report, other, "bwd_comm_wait_peer_sec") == pytest.approx(delay_ms / 1e3, rel=0.25)
    assert median(report, rank, "bwd_work_sec") > delay_ms / 1e3 * 0.75


@pytest.mark.parametrize("backend", ["ddp", "fsdp2", "zero2", "zero3"])
def test_an_even_run_names_no_late_rank(tmp_path_factory, capsys, backend):
    report = profile(tmp_path_factory, capsys, backend, delay_ms=0)
    assert report["late_rank"] is None, report["late_rank"]
    assert "late rank: none" in report["text"]


def test_the_ledger_adds_up_to_each_phase_on_every_rank(tmp_path_factory, capsys):
    for backend in ("ddp", "fsdp2"):
        report = profile(tmp_path_factory, capsys, backend, rank=1, delay_ms=200)
        for per_rank in report["per_rank"]:
            samples = per_rank["samples"]
            for phase in ("forward", "bwd", "optim_step"):
                for i, time in enumerate(samples[f"{phase}_time_sec"]):
                    parts = sum(samples[f"{phase}_{k}"][i] for k in ("work_sec", "comm_wait_peer_sec", "comm_transfer_sec"))
                    assert parts == pytest.approx(time, rel=0.05, abs=1e-4), (backend, phase, i)


def test_busy_gradient_hooks_are_work_not_communication(tmp_path_factory, capsys):
    """20 hooks x 1 ms on every rank: bwd's work grows by 20 ms (within 25 %), its
    communication columns do not."""
    base = profile(tmp_path_factory, capsys, "ddp", "hooked", hooks=20, hook_ms=0)
    hooked = profile(tmp_path_factory, capsys, "ddp", "hooked", hooks=20, hook_ms=1)
    for rank in (0, 1):
        grown = median(hooked, rank, "bwd_work_sec") - median(base, rank, "bwd_work_sec")
        assert grown == pytest.approx(0.020, rel=0.25), (rank, grown)
        for column in ("bwd_comm_wait_peer_sec", "bwd_comm_transfer_sec"):
            assert median(hooked, rank, column) - median(base, rank, column) < 0.005, (rank, column)


def _bytes(report: dict, phase: str, op: str) -> int:
    return report["collectives"]["per_phase"].get(phase, {}).get(op, {}).get("bytes_per_step", 0)


def test_collective_bytes_are_what_each_backend_must_move(tmp_path_factory, capsys):
    # DDP: one all-reduce of every gradient, in bwd.
    ddp = profile(tmp_path_factory, capsys, "ddp", delay_ms=0)
    assert _bytes(ddp, "bwd", "all_reduce") == PARAM_BYTES
    # FSDP2: every parameter gathered in forward, again in backward (resharded after forward),
    # the gradients reduce-scattered once.
    fsdp2 = profile(tmp_path_factory, capsys, "fsdp2", delay_ms=0)
    assert _bytes(fsdp2, "forward", "all_gather") == PARAM_BYTES
    assert _bytes(fsdp2, "bwd", "all_gather") == PARAM_BYTES
    assert _bytes(fsdp2, "bwd", "reduce_scatter") == PARAM_BYTES
    # ZeRO-2 on gloo: the gradients all-reduced in bwd, the updated partitions gathered after the step.
    zero2 = profile(tmp_path_factory, capsys, "zero2", delay_ms=0)
    assert _bytes(zero2, "bwd", "all_reduce") == PARAM_BYTES
    assert _bytes(zero2, "optim_step", "all_gather") == PARAM_BYTES
    # ZeRO-3: gradients reduce-scattered once; each parameter gathered once a step. On this
    # small model every parameter is below stage3_param_persistence_threshold, so DeepSpeed
    # keeps them whole and gathers them after the step instead of in forward.
    zero3 = profile(tmp_path_factory, capsys, "zero3", delay_ms=0)
    assert _bytes(zero3, "bwd", "reduce_scatter") == PARAM_BYTES
    gathered = sum(_bytes(zero3, phase, "all_gather") for phase in ("forward", "bwd", "optim_step"))
    assert gathered == PARAM_BYTES


def test_zero3_gathers_its_partitioned_parameters_in_forward(tmp_path_factory, capsys):
    width, layers = 512, 2  # 512 x 512 weights: above the persistence threshold, partitioned
    report = profile(tmp_path_factory, capsys, "zero3", delay_ms=0, width=width, layers=layers)
    weights, biases = layers * width * width * 4, layers * width * 4
    assert _bytes(report, "forward", "all_gather") == weights
    assert _bytes(report, "bwd", "reduce_scatter") == weights + biases
