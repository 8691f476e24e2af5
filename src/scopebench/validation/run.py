"""One validation run: the policy training run with a fault, each profiled step beside an unprofiled one.

:class:`DetectRun` is a :class:`~scopebench.policy.run.train.PolicyTrainRun` (the same ranks,
backends, profiler and teardown as ``Pi05Train``) whose policy is
:func:`~scopebench.validation.faults.fault_policy`. With ``interleave`` (the default) every
iteration runs one step of the same model, data and ranks with no profiler first, in the
loop's ``before_callback`` (every rank, outside the profiled clock), then the profiled step: the
overhead column compares the two, step by step, under the same load (docs/validation.md). The
fault's "one step in ``every``" and ``step`` count iterations (both steps of an iteration get the
same fault). Rank 0 keeps, per recorded iteration, the reduced row, its own unprofiled and
profiled step times and what the fault policy measured it injected (:attr:`DetectRun.record`).
With a ``contention`` fault rank 0 also starts the CPU hogs
(:class:`~scopebench.validation.faults.CpuHogs`) once the ranks are set up, and stops them at
the end, also on error; per recorded iteration it keeps the CPU time they had and the wall time
(the truth the sampler's ``host_other_cpu_pct`` is scored against).

Spawned ranks run :func:`run_worker` (the same loop, the same unprofiled steps).
"""

from __future__ import annotations

import time
from typing import Any

from scopebench.policy.run.train import PolicyTrainRun
from scopebench.policy.settings import TrainSettings
from scopebench.validation.faults import INJECTED_TERM
from scopebench.validation.score import RunRecord

__all__ = ["FAULT_POLICY", "WORKER", "DetectRun", "run_worker"]

#: The policy factory every validation run trains.
FAULT_POLICY = "scopebench.validation.faults:fault_policy"
#: Entry point of spawned ranks.
WORKER = "scopebench.validation.run:run_worker"


class DetectRun(PolicyTrainRun):
    """A policy training run of :data:`FAULT_POLICY` with unprofiled steps interleaved.

    Args:
        settings: The run's settings; ``policy`` must be :data:`FAULT_POLICY`.
        interleave: Run one unprofiled step before each profiled one (every rank).
        hogs: CPU hog processes rank 0 runs beside the loop (the ``contention`` fault).
        **run: :class:`~scopebench.policy.run.train.PolicyTrainRun`'s ``profiler``,
            ``output_dir``, ``name``, ``keep_rows``.
    """

    worker_target = WORKER

    def __init__(self, settings: TrainSettings, *, interleave: bool = True, hogs: int = 0, **run: Any) -> None:
        from scopebench.validate import flag, integer

        if settings.policy != FAULT_POLICY:
            raise ValueError(f"policy must be {FAULT_POLICY} in a validation run, got {settings.policy!r}")
        run.setdefault("name", "validation")
        for key in ("dataset_root", "chunk_size", "task", "eval_batch_size", "resume_from"):
            run.pop(key, None)  # a worker's kwargs repeat PolicyTrainRun's: a user policy has its own data
        super().__init__(settings, dataset_root="", chunk_size=1, task="train", **run)
        self.interleave = flag("interleave", interleave)
        self.hogs = integer("hogs", hogs, low=0)
        #: What rank 0 saw, per recorded iteration (:class:`~scopebench.validation.score.RunRecord`:
        #: the reduced row, its own unprofiled and profiled step, what the fault injected).
        self.record = RunRecord()
        self._off: float | None = None
        self._seen = 0
        self._null = None
        self._hogs = None
        self._hog_mark: tuple[float, float] | None = None  # (their CPU seconds, perf_counter) then

    def worker_kwargs(self) -> dict[str, Any]:
        """:class:`PolicyTrainRun`'s, and whether to interleave (the hogs are rank 0's alone)."""
        return {**super().worker_kwargs(), "interleave": self.interleave}

    def start(self) -> DetectRun:
        from scopebench.profiler import create_profiler
        from scopebench.validation.faults import CpuHogs

        if self.session is not None:
            return self
        super().start()
        self._null = create_profiler("null", self.device)
        if self.hogs and self.rank == 0:
            self._hogs = self._stack.enter_context(CpuHogs(self.hogs))
            self._hog_mark = (0.0, time.perf_counter())
        return self

    def teardown(self) -> None:
        super().teardown()
        model = self.policy.model if self.policy is not None else None
        if hasattr(model, "close"):
            model.close()  # the fault's process-wide hooks: benchopt's process runs other cells next

    @property
    def stopped_at(self) -> tuple[int, int] | None:
        """(iteration, rank) of the non-finite loss that stopped the run (1-based iteration), else None."""
        found = self.work.nonfinite if self.work is not None else None
        if found is None:
            return None
        per = 2 if self.interleave else 1
        return (found.step - 1) // per + 1, found.rank

    def loop(self, callback=None, before_callback=None) -> None:
        """:meth:`PolicyTrainRun.loop` with the unprofiled step first in each iteration."""
        self._off, self._seen = None, self.profiler.recorded
        hooks = [h for h in (self._unprofiled_step if self.interleave else self._collect, before_callback) if h]
        super().loop(callback, before_callback=lambda: [hook() for hook in hooks])
        self._collect()

    def _collect(self) -> None:
        """Rank 0: the iteration that just ended into :attr:`record` (if recorded), with the
        unprofiled step before it."""
        if self.profiler.recorded > self._seen and self.rank == 0:
            local = self.profiler.last_local
            injected = None
            if self.work.gathered:
                injected = max(row.get(INJECTED_TERM, 0.0) for row in self.work.gathered)
            self.record.add(self.metrics(), injected)
            step = local.get("step_time_sec")
            if self._off is not None and step is not None:
                self.record.pairs.append((self._off, step, local.get("profiler_overhead_sec") or 0.0))
            if self._hog_mark is not None:  # the hogs' CPU and the wall time since the last iteration
                cpu, now = self._hogs.cpu_sec(), time.perf_counter()
                self.record.hog_cpu.append((cpu - self._hog_mark[0], now - self._hog_mark[1]))
        if self._hog_mark is not None:
            self._hog_mark = (self._hogs.cpu_sec(), time.perf_counter())
        self._seen, self._off = self.profiler.recorded, None

    def _unprofiled_step(self) -> None:
        self._collect()
        if self.work.nonfinite is not None:  # the run stops here: no step on NaN weights
            return
        begin = time.perf_counter()
        self.work(self._null)
        self._off = time.perf_counter() - begin


def run_worker(*, settings: dict[str, Any], **kwargs: Any) -> None:
    """Rank > 0 of a locally spawned validation run: the same loop as rank 0, without a callback."""
    with DetectRun(TrainSettings(**settings), **kwargs) as run:
        run.loop(None)
