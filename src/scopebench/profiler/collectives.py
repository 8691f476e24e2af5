"""What each rank's collectives did during a recorded iteration: when it arrived, when the
collective completed, and when the rank's own thread was blocked on it (design.md, "Profiler
contract", the ledger).

:class:`CommRecorder` wraps the Python entry points of ``torch.distributed``'s collectives
(``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``, FSDP2's
``all_gather_single`` / ``reduce_scatter_single``, ``broadcast``, ``barrier``...; DeepSpeed's
copies of the two it keeps as attributes), ``Work.wait`` and, for a model wrapped in DDP, the
gradient all-reduce through a communication hook (DDP's reducer calls the process group from
C++, so the hook is the only Python place a bucket is seen). Each call is one
:class:`Call`: the operation, its process group and sequence number in that group (the same
on every rank: ranks issue a group's collectives in one order), its bytes and group size,
when this rank issued it (``issue``: the rank *arrived*), and when it completed (``done``:
the call's return for a blocking call, the future's completion for an asynchronous one). Each
interval the rank's thread spent blocked is one :class:`Wait`: a blocking call, a
``Work.wait()``, or — under DDP — the time from the end of the autograd graph (an autograd
callback queued before DDP's own) to the completion of the step's buckets, when the reducer
waits for them.

Only calls inside the iteration clock are recorded (:meth:`CommRecorder.start` /
:meth:`CommRecorder.stop`), so the profiler's own collectives (the continue flag, the
cross-rank gather) never appear. A collective made inside another one (``all_gather_single``
calling the process group) is one call. Off (``recorder.active`` false) a wrapper costs one
attribute read.

Clocks: ``time.perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for every process of a
kernel; ranks whose kernels differ (``/proc/sys/kernel/random/boot_id``) get an offset to rank
0's clock estimated at start-up, with its error (:func:`align_clocks`).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Call", "CommRecorder", "Wait", "align_clocks", "recorder"]

#: Python entry points of ``torch.distributed`` that are collectives: name -> (operation, the
#: argument whose bytes count). The bytes are the NCCL-tests convention's size: an all-reduce's
#: tensor, an all-gather's gathered output, a reduce-scatter's full input.
OPERATIONS: dict[str, tuple[str, str | None]] = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_reduce_coalesced": ("all_reduce", "tensors"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "_all_gather_base": ("all_gather", "output_tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "_reduce_scatter_base": ("reduce_scatter", "input"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "all_to_all_single": ("all_to_all", "input"),
    "barrier": ("barrier", None),
}

#: Environment variable that forces the start-up clock estimate between ranks of one kernel
#: (``estimate``), as if they ran on different machines (tests of the estimate, and a user
#: who doubts the shared clock); ``auto`` (the default) or ``estimate``, anything else refused
#: (:data:`scopebench.environment.SETTINGS`).
CLOCK_ENV = "SCOPEBENCH_CLOCK_ALIGN"


@dataclass
class Call:
    """One collective on this rank (times: ``time.perf_counter`` on this rank's clock)."""

    op: str
    group: str
    seq: int
    size: int
    nbytes: int
    issue: float
    done: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        """What identifies the same collective on every rank: its group and sequence number."""
        return (self.group, self.seq)


@dataclass
class Wait:
    """An interval this rank's thread was blocked, and the calls it waited for (indices)."""

    start: float
    end: float
    calls: list[int] = field(default_factory=list)


def _nbytes(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    try:
        return int(value.numel()) * int(value.element_size())
    except AttributeError:
        return 0


def closed_waits(dones: list[float | None], waits: list[Wait], ddp_waits: list[tuple[float, list[int]]]) -> list[Wait]:
    """``waits`` and DDP's bucket waits, each closed at the last completion among its calls
    (``dones``: each call's completion time, None: not complete), sorted by start.

    :Examples:

    >>> [(w.start, w.end) for w in closed_waits([2.0, None], [Wait(3.0, 4.0)], [(1.0, [0, 1])])]
    [(1.0, 2.0), (3.0, 4.0)]
    """
    out = list(waits)
    for begin, members in ddp_waits:
        ends = [dones[i] for i in members if dones[i] is not None]
        end = max(ends) if ends else begin
        out.append(Wait(begin, max(end, begin), members))
    out.sort(key=lambda w: w.start)
    return out


class CommRecorder:
    """The collectives and blocked intervals of the current recorded iteration (one per process).

    :meth:`install` wraps the entry points once per process; :meth:`start` / :meth:`stop`
    bound the recording to the iteration clock; :meth:`take` hands the iteration's calls and
    waits over and clears them.
    """

    def __init__(self) -> None:
        self.active = False
        self.calls: list[Call] = []
        self.waits: list[Wait] = []
        self._seq: dict[str, int] = {}
        self._works: dict[int, tuple[Any, int]] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._installed = False
        self._ddp_pending: list[int] | None = None
        self._ddp_waits: list[tuple[float, list[int]]] = []

    # -- recording window ---------------------------------------------------------------
    def restart_sequences(self) -> None:
        """Count every group's collectives from 0 again, recording off: every rank calls this at
        the same point (a profiler's first recorded iteration), so the numbers match across ranks
        even when this process ran other groups before (a tool run twice in one process, a test
        session)."""
        with self._lock:
            self.active = False
            self._seq = {}

    def start(self) -> None:
        self.calls, self.waits, self._works = [], [], {}
        self._ddp_pending, self._ddp_waits = None, []
        self.active = True

    def stop(self) -> None:
        self.active = False

    def take(self) -> tuple[list[Call], list[Wait]]:
        """The iteration's calls and waits (DDP's bucket waits closed at their last completion)."""
        calls, dones, waits, ddp_waits = self.take_raw()
        return calls, closed_waits(dones, waits, ddp_waits)

    def take_raw(self) -> tuple[list[Call], list[float | None], list[Wait], list[tuple[float, list[int]]]]:
        """The iteration's calls, their completion times now, its waits and DDP's bucket waits as
        recorded, handed over without any work (the profiler's step end): :func:`closed_waits`
        makes :meth:`take`'s waits of them later."""
        with self._lock:
            calls, waits, ddp_waits = self.calls, self.waits, self._ddp_waits
            self.calls, self.waits, self._works, self._ddp_waits = [], [], {}, []
        return calls, [c.done for c in calls], waits, ddp_waits

    # -- what the wrappers call -----------------------------------------------------------
    def _begin(self, op: str, group: Any, nbytes: int) -> int:
        import torch.distributed as dist

        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        name = getattr(pg, "group_name", None) or str(id(pg))
        size = dist.get_world_size(pg)
        with self._lock:
            seq = self._seq.get(name, 0)
            self._seq[name] = seq + 1
            self.calls.append(Call(op, name, seq, size, nbytes, time.perf_counter()))
            index = len(self.calls) - 1
            if self._ddp_pending is not None and self._local.__dict__.get("ddp"):
                self._ddp_pending.append(index)
        return index

    def _completed(self, index: int, at: float | None = None) -> None:
        now = time.perf_counter() if at is None else at
        with self._lock:
            if index < len(self.calls):
                call = self.calls[index]
                if call.done is None or now < call.done:
                    call.done = now

    @contextlib.contextmanager
    def completion_at_wait(self) -> Iterator[None]:
        """Asynchronous calls made inside the block get their completion from ``Work.wait`` only,
        not from a callback on their future: such a callback is Python, which the communication
        library's own thread then runs, waiting for the interpreter lock while the rank's thread
        holds it (a DDP step whose gradient hooks busy-wait in Python: its bwd host overhead grew
        by 48 ms for 38 ms of hooks, tests/policy/test_late_rank.py), and later calls on that
        thread wait behind it. For the suite's own calls whose end
        matters only when they are waited on (the training step's loss gather)."""
        self._local.at_wait = True
        try:
            yield
        finally:
            self._local.at_wait = False

    def _watch(self, index: int, work: Any) -> None:
        """An asynchronous call: its completion from its future, its wait from ``Work.wait``."""
        self._works[id(work)] = (work, index)
        if self._local.__dict__.get("at_wait"):
            return
        try:
            future = work.get_future()
        except (AttributeError, RuntimeError):
            return  # completion then comes from wait()
        calls = self.calls
        future.then(lambda _f: self._completed_if(calls, index))

    def _completed_if(self, calls: list[Call], index: int) -> None:
        if calls is self.calls:  # not a call of an iteration already taken
            self._completed(index)

    # -- installing ---------------------------------------------------------------------
    def install(self) -> None:
        """Wrap ``torch.distributed``'s collectives and ``Work.wait`` (once per process)."""
        if self._installed:
            return
        self._installed = True
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        for name, (op, arg) in OPERATIONS.items():
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = self._wrap(original, op, arg)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapped)
        self._wrap_wait(c10d.Work)
        self._rebind_deepspeed()

    def _wrap(self, original: Any, op: str, arg: str | None) -> Any:
        signature = inspect.signature(original)
        recorder = self

        def collective(*args: Any, **kwargs: Any) -> Any:
            local = recorder._local
            if not recorder.active or local.__dict__.get("depth", 0):
                return original(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs).arguments
            index = recorder._begin(op, bound.get("group"), _nbytes(bound.get(arg)) if arg else 0)
            local.depth = 1
            try:
                result = original(*args, **kwargs)
            finally:
                local.depth = 0
            if bound.get("async_op") and result is not None:
                recorder._watch(index, result)
            else:
                end = time.perf_counter()
                recorder._completed(index, end)
                with recorder._lock:
                    recorder.waits.append(Wait(recorder.calls[index].issue, end, [index]))
            return result

        collective.__wrapped__ = original
        collective.__name__ = original.__name__
        collective.__doc__ = original.__doc__
        return collective

    def _wrap_wait(self, work_class: Any) -> None:
        original = work_class.wait
        recorder = self

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            entry = recorder._works.get(id(work)) if recorder.active else None
            if entry is None or entry[0] is not work:
                return original(work, *args, **kwargs)
            begin = time.perf_counter()
            result = original(work, *args, **kwargs)
            end = time.perf_counter()
            recorder._completed(entry[1], end)
            with recorder._lock:
                recorder.waits.append(Wait(begin, end, [entry[1]]))
            return result

        wait.__wrapped__ = original
        work_class.wait = wait

    def _rebind_deepspeed(self) -> None:
        """DeepSpeed's torch backend keeps ``all_gather_into_tensor`` / ``reduce_scatter_tensor``
        as attributes taken when it started: point them at the wrapped functions."""
        import sys

        comm = sys.modules.get("deepspeed.comm.comm")
        cdb = getattr(comm, "cdb", None) if comm is not None else None
        if cdb is None:
            return
        import torch.distributed as dist

        for attr in ("all_gather_function", "reduce_scatter_function"):
            current = getattr(cdb, attr, None)
            name = getattr(current, "__name__", None)
            if current is not None and name in OPERATIONS and not hasattr(current, "__wrapped__"):
                setattr(cdb, attr, getattr(dist.distributed_c10d, name))

    # -- DDP ----------------------------------------------------------------------------
    def ddp_hook(self, state, bucket):  # unannotated: DDP refuses a hook annotated otherwise
        """DDP's default all-reduce of a gradient bucket, seen: the first bucket of a backward
        queues an autograd callback (which runs when the graph is done, before DDP's
        ``finalize_backward`` that waits for the buckets) marking where the wait begins."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if not self.active:
            return default_hooks.allreduce_hook(state, bucket)
        if self._ddp_pending is None:
            import torch

            members: list[int] = []
            self._ddp_pending = members

            def graph_done() -> None:
                with self._lock:
                    self._ddp_waits.append((time.perf_counter(), members))
                self._ddp_pending = None

            torch.autograd.Variable._execution_engine.queue_callback(graph_done)
        self._local.ddp = True
        try:
            return default_hooks.allreduce_hook(state, bucket)
        finally:
            self._local.ddp = False


#: The process's recorder (collectives are process-wide, so is their record).
recorder = CommRecorder()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def align_clocks(rounds: int = 16) -> tuple[float, float, str]:
    """This rank's clock offset to rank 0's (seconds, subtract it), the alignment's error, and how.

    Ranks of one kernel read one CLOCK_MONOTONIC: offset and error are 0 (``"shared"``). Else
    (or with ``SCOPEBENCH_CLOCK_ALIGN=estimate``) each of ``rounds`` rounds leaves a barrier and
    reads the clock on every rank; the offset is the median of this rank's reading minus rank
    0's, the error the largest distance of a round from it over every rank (how far apart ranks
    leave one barrier: an upper bound of the alignment's error, ``"estimated"``).
    """
    import torch
    import torch.distributed as dist

    from scopebench.distributed.reduce import gather_objects
    from scopebench.environment import env_setting

    boots = gather_objects(_boot_id())
    forced = env_setting(CLOCK_ENV) == "estimate"  # validated before any work (ProfilerConfig)
    if len(set(boots)) == 1 and boots[0] and not forced:
        return 0.0, 0.0, "shared"
    rank, size = dist.get_rank(), dist.get_world_size()
    readings = torch.zeros(rounds, size, dtype=torch.float64)
    for i in range(rounds):
        dist.barrier()
        mine = torch.zeros(size, dtype=torch.float64)
        mine[rank] = time.perf_counter()
        dist.all_reduce(mine)
        readings[i] = mine
    diffs = readings - readings[:, :1]
    offsets = diffs.median(dim=0).values
    error = float((diffs - offsets).abs().max())
    return float(offsets[rank]), error, "estimated"
