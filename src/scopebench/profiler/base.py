"""The profiler base: window bookkeeping, the loop, rank reduction and files.

A backend implements a few hooks (``_start_iteration``, ``_enter_region``,
``_exit_region``, ``_iteration_metrics``, ``_finish``); everything else — which
iterations are recorded, the iteration clock, callback time, cross-rank reduction and
per-rank CSV files — lives here, identical for every backend.

Timeline of one recorded iteration ``i`` (0-based)::

    callback ── [backend start] ── body (regions) ── end_iteration() ── [stop, reduction]
    |<-- A -->|                    |<------------ B ------------->|
    total_time_sec = A + B,  callback_time_sec = A

The callback at the top of iteration ``i`` scores iteration ``i - 1``; its duration is
``callback_time_sec`` of iteration ``i``. Backend start/stop and trace processing happen
outside the clock and are reported as ``profiler_overhead_sec`` where they cost anything.
When the callback says stop, no iteration begins: no empty range, no profiler cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scopebench.dist.reduce import broadcast_flag, gather_objects, world
from scopebench.profiler.config import ProfilerConfig
from scopebench.profiler.device import DeviceOps
from scopebench.profiler.files import METRICS_FILE, new_run_id, run_name, write_csv

__all__ = ["Profiler", "reduce_across_ranks"]


def reduce_across_ranks(per_rank: list[dict[str, Any]], time_keys: list[str]) -> dict[str, Any]:
    """Combine every rank's metrics into the row rank 0 reports.

    Each numeric value becomes its maximum over ranks (the slowest rank sets the pace).
    For each key in ``time_keys`` present on every rank, ``<key>`` skew is added as
    ``(max - min) / max * 100`` under ``rank_skew_pct`` (for ``total_time_sec``) or
    ``<region>_rank_skew_pct`` (for ``<region>_<unit>``).

    :Examples:
        >>> out = reduce_across_ranks([{"total_time_sec": 1.0}, {"total_time_sec": 2.0}], ["total_time_sec"])
        >>> out["total_time_sec"], out["rank_skew_pct"]
        (2.0, 50.0)
    """
    if len(per_rank) == 1:
        return dict(per_rank[0])
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for row in per_rank for k in row):
        values = [row[key] for row in per_rank if key in row]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        out[key] = max(values) if numeric else values[0]
    for key in time_keys:
        values = [row.get(key) for row in per_rank]
        if any(v is None for v in values):
            continue
        top = max(values)
        skew = 0.0 if top <= 0 else (top - min(values)) / top * 100.0
        stem = "rank_skew_pct" if key == "total_time_sec" else key.rsplit("_", 2)[0] + "_rank_skew_pct"
        out[stem] = skew
    return out


class Profiler:
    """Shared machinery of every backend; use :func:`scopebench.profiler.create_profiler`.

    Args:
        config: Validated settings.
        device: Device the solver computes on.
        name: Stem of this run's file names.
        output_dir: Directory of the per-rank CSV files.
    """

    #: Per-region metric whose cross-rank skew is reported (``None``: only the total).
    region_time_key: str | None = None

    def __init__(self, config: ProfilerConfig, device: Any = "cpu", name: str = "run", output_dir: Any = "outputs"):
        self.config = config
        self.device = device
        self.name = name
        self.output_dir = Path(output_dir)
        self.ops = DeviceOps(device)
        self.iteration = 0
        self.rows: list[dict[str, Any]] = []
        self.files: list[Path] = []
        self._run_id = new_run_id()
        self._current: dict[str, Any] = {}
        self._begun = False
        self._recording = False
        self._finalized = False
        self._t0 = 0.0
        self._callback_sec = 0.0
        self._region_wall: dict[str, float] = {}
        self._overhead_sec = 0.0

    # -- public API ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        """Rank in the current process group (0 without one)."""
        return world()[0]

    @property
    def world_size(self) -> int:
        return world()[1]

    @property
    def recording(self) -> bool:
        """Whether the current iteration is inside the recording window."""
        self._ensure_begun()
        return self._recording

    @contextmanager
    def track_step(self, name: str) -> Iterator[None]:
        """Time (and, per backend, trace) one named region of the current iteration."""
        self._ensure_begun()
        if not self._recording:
            yield
            return
        token = self._enter_region(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._exit_region(name, token)
            self._region_wall[name] = self._region_wall.get(name, 0.0) + time.perf_counter() - start

    def end_iteration(self) -> None:
        """Close the current iteration; its metrics become :meth:`get_current_metrics`."""
        self._ensure_begun()
        i, self._begun = self.iteration, False
        self.iteration += 1
        if not self._recording:
            self._current = {}
            return
        self.ops.synchronize()
        # The callback ran just before the clock started (so backends never trace it).
        total = time.perf_counter() - self._t0 + self._callback_sec
        start = time.perf_counter()
        metrics = {"total_time_sec": total, **self._iteration_metrics(i, total)}
        self._overhead_sec += time.perf_counter() - start
        if self._overhead_sec > 0.0 and self.reports_overhead:
            metrics["profiler_overhead_sec"] = self._overhead_sec
        self._record(i, metrics)

    def get_current_metrics(self) -> dict[str, Any]:
        """Metrics of the last finished iteration; ``{}`` when it was not recorded."""
        return dict(self._current)

    def iterate(self, callback: Callable[[], bool] | None = None) -> Iterator[int]:
        """The solver loop: ``for i in profiler.iterate(callback): <one iteration>``.

        Rank 0 calls ``callback`` (benchopt's) at the top of each iteration and every rank
        follows its decision, so all ranks stop together. Other ranks pass ``None``.
        """
        while True:
            start = time.perf_counter()
            go = self._should_continue(callback)
            callback_sec = time.perf_counter() - start
            if not go:
                return
            self._ensure_begun()
            self._callback_sec = callback_sec
            yield self.iteration
            self.end_iteration()

    def _should_continue(self, callback: Callable[[], bool] | None) -> bool:
        """Rank 0's decision (its callback's, or go on without one), on every rank."""
        rank = self.rank
        go = callback() if (rank == 0 and callback is not None) else (rank == 0 or None)
        return broadcast_flag(go, str(self.device))

    def finalize(self) -> list[Path]:
        """Stop the backend and write this rank's files (once); returns their paths."""
        if self._finalized:
            return self.files
        self._finalized = True
        if self._begun:
            self._abandon_iteration()
        self._finish()
        if self.config.save_file and self.rows:
            stem = run_name(self.name, self._run_id, self.rank)
            self.files.append(write_csv(self.output_dir / METRICS_FILE.format(run_name=stem), self.rows))
            self.files.extend(self._write_extra_files(stem))
        return self.files

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finalize()

    # -- bookkeeping -------------------------------------------------------------------
    reports_overhead = False

    def _ensure_begun(self) -> None:
        if self._begun:
            return
        self._begun = True
        self._recording = self.config.in_window(self.iteration)
        self._region_wall = {}
        self._callback_sec = 0.0
        self._overhead_sec = 0.0
        if self._recording:
            start = time.perf_counter()
            self._start_iteration(self.iteration)
            self._overhead_sec = time.perf_counter() - start
            self.ops.synchronize()
            self.ops.reset_peak_memory()
            self._t0 = time.perf_counter()

    def _abandon_iteration(self) -> None:
        """The loop stopped before the body ran: discard the begun iteration."""
        if self._begun and self._recording:
            self._discard_iteration(self.iteration)
        self._begun = False

    def _record(self, i: int, metrics: dict[str, Any]) -> None:
        time_keys = ["total_time_sec"]
        if self.region_time_key:
            time_keys += [self.region_time_key.format(r) for r in self._region_wall]
        gathered = gather_objects((self._run_id, metrics))
        self._run_id = gathered[0][0]  # every rank names its files after rank 0's run
        per_rank = [m for _, m in gathered]
        self._on_gathered(per_rank)
        self.rows.append({"iter": i, "rank": self.rank, **metrics})
        self._current = reduce_across_ranks(per_rank, time_keys) if self.rank == 0 else dict(metrics)
        if self.rank == 0 and len(per_rank) > 1:
            self._current.update(self._cross_rank_metrics(per_rank))

    # -- backend hooks -------------------------------------------------------------------
    def _start_iteration(self, i: int) -> None:
        """A recorded iteration begins (before its clock starts)."""

    def _enter_region(self, name: str) -> Any:
        """A region of a recorded iteration opens; the return value reaches ``_exit_region``."""
        return None

    def _exit_region(self, name: str, token: Any) -> None:
        """A region of a recorded iteration closes."""

    def _iteration_metrics(self, i: int, total_sec: float) -> dict[str, Any]:
        """Backend metrics of recorded iteration ``i`` (after its clock stopped)."""
        return {}

    def _discard_iteration(self, i: int) -> None:
        """A begun recorded iteration will never run (the loop stopped)."""

    def _on_gathered(self, per_rank: list[dict[str, Any]]) -> None:
        """Every rank's raw metrics of the iteration just recorded."""

    def _cross_rank_metrics(self, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """Extra rank-0 metrics derived from all ranks (e.g. the straggler)."""
        return {}

    def _finish(self) -> None:
        """Release backend resources at the end of the run."""

    def _write_extra_files(self, stem: str) -> list[Path]:
        """Backend files beside the metrics CSV."""
        return []
