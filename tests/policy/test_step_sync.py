"""The training step adds no synchronisation of its own (issue 47): its loss gather neither blocks
on the other ranks nor reads a value back from the device, step after step.

Counted on two real gloo ranks, on rank 0: the blocked intervals the ledger recorded inside
``sync_gather`` (a collective called without ``async_op`` blocks from its call to its end; a
``Work.wait`` on a gather not yet complete blocks too), and the calls that copy a tensor's value to
the host inside ``sync_gather`` (``tolist``, ``item``, ``cpu``, ``float``...: each one a
host-device synchronisation on CUDA), seen by a ``TorchFunctionMode``. Before, each step made one
of each (accelerate's blocking ``gather`` and its ``.tolist()``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from torch.overrides import TorchFunctionMode

pytestmark = pytest.mark.slow

EXAMPLE = f"{Path(__file__).resolve().parents[2]}/examples/flow_policy.py:make_policy"
STEPS = 6
#: Tensor methods that copy a value to the host: on CUDA each waits for the device's queue.
HOST_READS = {"tolist", "item", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"}


class _HostReads(TorchFunctionMode):
    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


class _Counted:
    """A region whose body runs under :class:`_HostReads`."""

    def __init__(self, region, seen: list[str]) -> None:
        self.region, self.mode = region, _HostReads(seen)

    def __enter__(self):
        self.region.__enter__()
        self.mode.__enter__()

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        return self.region.__exit__(*exc)


def test_the_loss_gather_neither_blocks_nor_reads_the_device_step_after_step():
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings

    settings = TrainSettings(policy=EXAMPLE, nproc_per_node=2, backend="ddp", batch_size=4)
    run = PolicyTrainRun(settings, dataset_root="", chunk_size=8)
    reads: list[list[str]] = []
    blocked: list[int] = []
    with run:
        prof = run.profiler
        plain = prof.track_step

        def track_step(name):
            region = plain(name)
            if name != "sync_gather":
                return region
            reads.append([])
            return _Counted(region, reads[-1])

        prof.track_step = track_step

        def callback() -> bool:
            if run.work.steps:  # the ledger of the step that just ended, every rank's record
                mine = next(rec for rec in prof.ledger_records if rec.rank == 0)
                start, end = next((s, e) for name, s, e in mine.regions if name == "sync_gather")
                blocked.append(sum(1 for s, e, _calls in mine.waits if s < end and e > start))
            return run.work.steps < STEPS

        run.loop(callback)
        gathered = run.work.gathered  # waits for the gathers in flight, outside any step
    assert len(reads) == len(blocked) == STEPS
    assert reads == [[]] * STEPS, reads
    assert blocked == [0] * STEPS, blocked
    # the values still arrive, every rank's, and the rows still carry the ranks' mean loss
    assert gathered is not None and len(gathered) == 2
    assert all(math.isfinite(row["train_loss"]) for row in gathered), gathered


def test_a_counted_loop_crosses_nothing_between_the_steps():
    """``loop_steps`` (``profile-step``): every rank counts the steps itself, so rank 0 makes no
    continue/stop broadcast (on NCCL a host-device synchronisation each) and its spawned rank,
    told the count, stops with it: both ranks record every step."""
    import torch.distributed as dist

    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings
    from scopebench.policy.tools import StepCounter

    settings = TrainSettings(policy=EXAMPLE, nproc_per_node=2, backend="ddp", batch_size=4, group_timeout_sec=120)
    run = PolicyTrainRun(settings, dataset_root="", chunk_size=8, loop_steps=STEPS, keep_rows=True)
    calls: list[str] = []
    with run:
        plain = dist.broadcast

        def broadcast(*args, **kwargs):
            calls.append("broadcast")
            return plain(*args, **kwargs)

        dist.broadcast = broadcast
        try:
            run.loop(StepCounter(STEPS))  # rank 0's own count too: without loop_steps it would broadcast
        finally:
            dist.broadcast = plain
    assert calls == []
    assert run.work.steps == STEPS and [len(rows) for rows in run.rank_rows] == [STEPS, STEPS]
    # no barrier: rank 0's rows carry the ranks' mean step, not the maximum of each iteration
    for i, reduced in enumerate(run.profiler.reduced_rows):
        steps = [rows[i]["step_time_sec"] for rows in run.rank_rows]
        assert reduced["step_time_sec"] == pytest.approx(sum(steps) / 2), (i, reduced["step_time_sec"], steps)


def test_a_counted_loop_refuses_a_callback_that_stops_before_the_count():
    from scopebench.harness.run import _Counted

    counted = _Counted(3, lambda: False)
    with pytest.raises(RuntimeError, match=r"^the loop's callback stopped at iteration 1 of the 3 its loop_steps"):
        counted()
    ticks = iter([True, True, True, False])
    counted = _Counted(3, lambda: next(ticks))
    assert [counted() for _ in range(4)] == [True, True, True, False]
