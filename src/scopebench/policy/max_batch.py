"""The largest per-rank batch that runs a full training step: real trials, doubling then bisecting.

:func:`search` asks ``trial(batch)`` for batches 1, 2, 4... until one does not fit (or the
dataset's limit is reached), then bisects between the last batch that fit and the first that
did not: the answer fits and the next batch does not (memory grows with the batch).

:class:`StepTrial` is one trial: the run's real training step (forward, backward, optimizer)
for two iterations with ``profiler_memory`` on (the second is measured: AdamW's state exists
by then), everything freed afterwards. On CUDA a trial that raises ``torch.OutOfMemoryError``
does not fit (PyTorch Lightning's ``BatchSizeFinder`` behaves so), and the margin is the
device's memory minus the reserved peak; on a CPU, which swaps rather than raising, a batch
fits when its measured step peak (``mem_peak_mb``, the worst rank) is within ``budget_mb``.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from typing import Any

__all__ = ["StepTrial", "Trial", "search"]


@dataclasses.dataclass(frozen=True)
class Trial:
    """One batch tried: whether it fit, its measured peak and categories (MiB), why not."""

    batch: int
    fits: bool
    peak_mb: float | None = None
    categories_mb: dict[str, float] = dataclasses.field(default_factory=dict)
    reserved_mb: float | None = None
    note: str = ""

    def line(self) -> str:
        """One printed line: batch, peak by category, fits or not.

        :Examples:
            >>> Trial(8, True, 12.5, {"parameters": 2.0, "activations": 10.5}).line()
            'batch 8: peak 12.5 MiB (parameters 2.0, activations 10.5) fits'
        """
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.categories_mb.items() if v)
        peak = "no peak" if self.peak_mb is None else f"peak {self.peak_mb:.1f} MiB" + (f" ({parts})" if parts else "")
        return f"batch {self.batch}: {peak} {'fits' if self.fits else 'does NOT fit'}" + (
            f" ({self.note})" if self.note else ""
        )


def search(trial: Callable[[int], Trial], *, limit: int, report: Callable[[Trial], None] = print):
    """``(largest batch that fits, every trial in order)``; 0 when batch 1 does not fit.

    :Examples:
        >>> fits = lambda b: Trial(b, b <= 13)
        >>> best, trials = search(fits, limit=100, report=lambda t: None)
        >>> best, [t.batch for t in trials]
        (13, [1, 2, 4, 8, 16, 12, 14, 13])
        >>> search(fits, limit=6, report=lambda t: None)[0]  # the dataset's limit
        6
    """
    trials: list[Trial] = []

    def run(batch: int) -> bool:
        result = trial(batch)
        trials.append(result)
        report(result)
        return result.fits

    good, bad, batch = 0, None, 1
    while batch <= limit:
        if not run(batch):
            bad = batch
            break
        good = batch
        if batch == limit:
            break
        batch = min(batch * 2, limit)
    if bad is None:
        return good, trials
    while bad - good > 1:
        mid = (good + bad) // 2
        if run(mid):
            good = mid
        else:
            bad = mid
    return good, trials


def _is_oom(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


class StepTrial:
    """``trial(batch)`` for :func:`search`.

    Args:
        steps: ``batch -> metrics`` of the training step at that batch (the rank-0 metrics of
            a run with ``profiler_memory``); :func:`run_steps` in a real search.
        budget_mb: The memory one rank may use (MiB); None on CUDA: the device decides (OOM).
        cuda: ``torch.cuda`` on a CUDA device (its cache is emptied after every trial, its
            total memory gives the margin), else None.
    """

    def __init__(self, steps: Callable[[int], dict[str, Any]], budget_mb: float | None = None, cuda: Any = None):
        self.steps, self.budget_mb, self.cuda = steps, budget_mb, cuda

    def __call__(self, batch: int) -> Trial:
        from scopebench.profiler.memory import CATEGORIES

        try:
            metrics = self.steps(batch)
        except Exception as error:  # noqa: BLE001 - only an OOM is an answer; anything else propagates
            if not _is_oom(error):
                raise
            return Trial(batch, False, note=f"out of memory: {str(error).splitlines()[0][:120]}")
        finally:
            gc.collect()
            if self.cuda is not None:
                self.cuda.empty_cache()
        peak = metrics.get("mem_peak_mb")
        categories = {c: metrics.get(f"mem_{c}_mb", 0.0) or 0.0 for c in CATEGORIES}
        reserved = metrics.get("mem_reserved_peak_mb")
        fits = self.budget_mb is None or (peak is not None and peak <= self.budget_mb)
        note = "" if self.budget_mb is None else f"budget {self.budget_mb:.1f} MiB"
        return Trial(batch, fits, peak, categories, reserved, note)

    def limit_mb(self) -> float | None:
        """The memory a trial must fit in (MiB): the budget, else the CUDA device's, else None."""
        if self.budget_mb is not None:
            return self.budget_mb
        if self.cuda is not None:
            return self.cuda.get_device_properties(self.cuda.current_device()).total_memory / 2**20
        return None

    def margin_mb(self, trial: Trial) -> float | None:
        """What is left at ``trial``'s peak: :meth:`limit_mb` minus the peak (reserved on CUDA)."""
        used = trial.reserved_mb if trial.reserved_mb is not None else trial.peak_mb
        limit = self.limit_mb()
        return None if used is None or limit is None else limit - used


def run_steps(
    settings: Any, *, dataset_root: str, chunk_size: int, output_dir: str, accelerate_file: Any = None
) -> Callable[[int], dict]:
    """``batch -> metrics``: a :class:`~scopebench.policy.run.train.PolicyTrainRun` of ``settings``
    at that batch (no memory check before: the trial measures), two iterations with
    ``profiler_memory``, rank 0's metrics of the second (``accelerate_file``: the run's, resolved
    once for every trial; None: each run resolves it)."""

    def steps(batch: int) -> dict[str, Any]:
        from scopebench.policy.run.train import PolicyTrainRun
        from scopebench.policy.tools import StepCounter
        from scopebench.profiler import ProfilerConfig

        trial = dataclasses.replace(settings, batch_size=batch, check_memory=False)
        profiler = ProfilerConfig(mode="custom", warmup=1, memory=True)
        run = PolicyTrainRun(
            trial,
            dataset_root=dataset_root,
            chunk_size=chunk_size,
            profiler=profiler,
            output_dir=output_dir,
            accelerate_file=accelerate_file,
        )
        with run:
            run.loop(StepCounter(2))
            return run.metrics()

    return steps
