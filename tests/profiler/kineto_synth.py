"""Synthetic Kineto traces with known answers, in the format torch.profiler writes on GPUs (the
vendored HTA traces in tests/data/hta show the real one: categories ``kernel``, ``gpu_memcpy``,
``gpu_memset``, ``cuda_runtime``, ``user_annotation``; a GPU event's ``stream`` and
``correlation`` in its args, shared with the ``cudaLaunchKernel`` that launched it; an NCCL
kernel's ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``Group size``, ``dtype``,
``Process Group Name`` and, from torch 2.3 on, ``Seq``; ``distributedInfo`` with the rank).

:class:`TraceBuilder` writes one rank's events; :func:`ddp_job` a data-parallel job of several
ranks whose every figure is known in closed form (:class:`JobSpec`)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: NCCL's kernel names up to 2.18 (the op in the name) and from 2.19 (one generic kernel).
NCCL_OLD = {
    "all_reduce": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    "all_gather": "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
    "broadcast": "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
}
NCCL_NEW = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
_COLLECTIVE_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather", "broadcast": "broadcast"}


class TraceBuilder:
    """One rank's trace: host ranges, launches and GPU work (µs)."""

    def __init__(self, rank: int | None = 0, world_size: int | None = 2, *, base_ns: int | None = None) -> None:
        self.rank, self.world_size, self.base_ns = rank, world_size, base_ns
        self.events: list[dict[str, Any]] = []
        self._corr = 0
        self.pid, self.tid = 4000 + (rank or 0), 4000 + (rank or 0)

    def host(self, name: str, start: float, end: float, cat: str = "user_annotation", **args: Any) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.pid,
                "tid": self.tid,
                "ts": start,
                "dur": end - start,
                "args": args,
            }
        )

    def step(self, n: int, start: float, end: float) -> None:
        self.host(f"ProfilerStep#{n}", start, end)

    def gpu(
        self, name: str, start: float, dur: float, *, cat: str = "kernel", stream: int = 7, launch: float | None = None,
        args: dict[str, Any] | None = None,
    ) -> int:  # fmt: skip
        """A piece of GPU work and its launch (``launch``: when the launch call began; default 10 µs before)."""
        self._corr += 1
        corr = self._corr
        at = start - 10 if launch is None else launch
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": self.pid, "tid": self.tid,
             "ts": at, "dur": 4, "args": {"correlation": corr, "cbid": 211}}
        )  # fmt: skip
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
             "args": {"device": 0, "stream": stream, "correlation": corr, **(args or {})}}
        )  # fmt: skip
        return corr

    def compute(self, start: float, dur: float, **kw: Any) -> int:
        return self.gpu("void at::native::vectorized_elementwise_kernel<4>(int)", start, dur, **kw)

    def memcpy(self, start: float, dur: float, **kw: Any) -> int:
        return self.gpu("Memcpy HtoD (Pageable -> Device)", start, dur, cat="gpu_memcpy", **kw)

    def nccl(
        self, op: str, start: float, dur: float, *, nelems: int = 1024, dtype: str = "Float", group: str = "0",
        seq: int | None = None, group_size: int | None = None, new_names: bool = False, stream: int = 20,
        launch: float | None = None, with_args: bool = True,
    ) -> int:  # fmt: skip
        args: dict[str, Any] = {}
        if with_args:
            args = {
                "Collective name": _COLLECTIVE_NAMES[op], "In msg nelems": nelems, "Out msg nelems": nelems,
                "Group size": group_size or self.world_size, "dtype": dtype, "Process Group Name": group,
                "Process Group Description": "default_pg",
            }  # fmt: skip
            if seq is not None:
                args["Seq"] = seq
        name = NCCL_NEW if new_names else NCCL_OLD[op]
        return self.gpu(name, start, dur, stream=stream, launch=launch, args=args)

    def trace(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Synthetic GPU"}]}
        if self.rank is not None:
            out["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": self.world_size}
        out["traceEvents"] = self.events
        if self.base_ns is not None:
            out["baseTimeNanoseconds"] = self.base_ns
        return out

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        text = json.dumps(self.trace())
        if path.name.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode(), compresslevel=1))
        else:
            path.write_text(text)
        return path


@dataclass(frozen=True)
class JobSpec:
    """A data-parallel job: per step and rank, ``fwd`` then ``bwd`` compute on stream 7, the
    gradients' all-reduce on stream 20 from when the rank's bwd ends (its arrival) to the last
    arrival plus ``transfer``, an ``overlap`` compute kernel on stream 7 from the arrival (hidden
    communication), then a memcpy ``gap`` after the all-reduce. The ``late`` rank's bwd lasts
    ``delay`` longer (``cause="compute"``), or its bwd is launched ``delay`` late and starts as
    launched (``cause="gpu_idle"``: its GPU waits for its host). Steps last ``period`` on the host;
    the last step holds work too (the window drops it). Times µs."""

    world: int = 2
    steps: int = 3
    first_step: int = 10
    fwd: float = 3000.0
    bwd: float = 4000.0
    transfer: float = 500.0
    overlap: float = 200.0
    gap: float = 50.0
    copy: float = 100.0
    period: float = 20000.0
    late: int | None = None
    delay: float = 0.0
    cause: str = "compute"
    seq: bool = True
    new_names: bool = False
    nelems: int = 1 << 20
    #: Extra compute kernels of ``small`` µs each, back to back before ``fwd`` (a bigger trace).
    extra: int = 0
    small: float = 5.0

    def arrival(self, rank: int) -> float:
        """When ``rank``'s all-reduce starts, from the step's first kernel."""
        late = self.delay if rank == self.late else 0.0
        return self.extra * self.small + self.fwd + self.bwd + late

    def comm(self, rank: int) -> float:
        """Its all-reduce kernel's duration."""
        return max(self.arrival(r) for r in range(self.world)) - self.arrival(rank) + self.transfer

    def step_span(self, rank: int) -> float:
        return self.arrival(rank) + self.comm(rank) + self.gap + self.copy

    def idle(self, rank: int) -> float:
        """Idle inside one step: the memcpy gap, and the late rank's launch delay (cause gpu_idle)."""
        return self.gap + (self.delay if rank == self.late and self.cause == "gpu_idle" else 0.0)

    def compute(self, rank: int) -> float:
        busy_bwd = self.bwd + (self.delay if rank == self.late and self.cause == "compute" else 0.0)
        return self.extra * self.small + self.fwd + busy_bwd + self.overlap


def ddp_job(spec: JobSpec, folder: str | Path, *, suffix: str = ".json.gz", base_ns: int | None = None) -> list[Path]:
    """Write ``spec``'s ranks into ``folder`` (``rank<r>.pt.trace<suffix>``); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(spec.world):
        b = TraceBuilder(rank, spec.world, base_ns=base_ns)
        seq = 0
        for k in range(spec.steps + 1):
            n = spec.first_step + k
            t0 = 1_000_000.0 + k * spec.period
            b.step(n, t0, t0 + spec.period - 10)
            b.host("## forward ##", t0 + 5, t0 + 40)
            t = t0 + 100
            for _ in range(spec.extra):
                b.compute(t, spec.small, launch=t0 + 20)
                t += spec.small
            b.compute(t, spec.fwd, launch=t0 + 20)
            t += spec.fwd
            bwd = spec.bwd
            launch = t0 + 30
            if rank == spec.late and spec.cause == "compute":
                bwd += spec.delay
            elif rank == spec.late:
                launch, t = t + spec.delay - 10, t + spec.delay
            b.compute(t, bwd, launch=launch)
            t += bwd
            b.host("## backward ##", t0 + 50, t0 + 90)
            b.nccl(
                "all_reduce", t, spec.comm(rank), nelems=spec.nelems, seq=seq if spec.seq else None,
                new_names=spec.new_names, launch=t0 + 60,
            )  # fmt: skip
            seq += 1
            b.compute(t, spec.overlap, launch=t0 + 70)
            t += spec.comm(rank) + spec.gap
            b.memcpy(t, spec.copy, launch=t0 + 80)
        paths.append(b.write(folder / f"rank{rank}.pt.trace{suffix}"))
    return paths
