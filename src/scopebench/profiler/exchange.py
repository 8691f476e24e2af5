"""The profiler's cross-rank part: every rank's ledger record and metrics of the recorded
iterations, exchanged, then each rank's ledger columns and rank 0's reduced rows.

One pipeline (:meth:`CrossRank._exchange`) serves both drivers: after every recorded iteration by
default (benchopt's solvers and ``scopebench train`` read rank 0's row at each callback), or, with
:attr:`~scopebench.profiler.base.Profiler.defer_exchange` (``profile-step``, which reads the rows
after its loop), once the window or the loop is over, :data:`EXCHANGE_CHUNK` iterations per gather
(docs/design.md, "Profiler contract"; docs/performance.md, "What watching costs").
:class:`CrossRank` is a part of :class:`~scopebench.profiler.base.Profiler` (its attributes are
the profiler's), kept apart so each file holds one concern.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from scopebench.distributed.reduce import gather_objects
from scopebench.profiler.memory import cross_rank_memory

__all__ = ["BUFFER_MAX", "EXCHANGE_CHUNK", "CrossRank", "reduce_across_ranks"]

#: Recorded iterations per gather of an exchange: what one gather sends per rank, and what a rank
#: holds of every rank's records at once, stay bounded whatever the number of steps
#: (docs/performance.md, "What watching costs").
EXCHANGE_CHUNK = 64
#: With :attr:`Profiler.defer_exchange`, the most recorded iterations a rank buffers before it
#: exchanges inside the window (a very long window): its own records stay bounded too.
BUFFER_MAX = 4096


#: The whole-iteration times a loop without a barrier between its steps reports as the ranks'
#: mean (with the ``time_keys``: the regions' times), :func:`reduce_across_ranks`.
ITERATION_TIMES = ("total_time_sec", "step_time_sec", "callback_time_sec", "untracked_time_sec")


def reduce_across_ranks(per_rank: list[dict[str, Any]], time_keys: list[str], mean: bool = False) -> dict[str, Any]:
    """Combine every rank's metrics into the row rank 0 reports.

    Each numeric value becomes its maximum over ranks (the slowest rank sets the pace);
    ``step_time_sec`` too is the maximum of each rank's own step time, not a difference
    of the reduced total and callback. With ``mean`` (a loop with no barrier between its
    steps, :attr:`~scopebench.harness.run.RankRun.loop_steps`) the ``time_keys`` and
    :data:`ITERATION_TIMES` are the ranks' mean instead: no rank waits for the slowest at a step
    boundary, so what a slow rank costs the others is inside their own steps (their waits in
    its collectives), and the maximum of each iteration would add every rank's own jitter
    between two collectives (the mean step then matches the loop's wall clock per step).
    For each key in ``time_keys`` present on every rank, ``<key>`` skew is added as
    ``(max - min) / max * 100`` under ``rank_skew_pct`` (for ``total_time_sec``) or
    ``<region>_rank_skew_pct`` (for ``<region>_<unit>``).

    :Examples:
        >>> out = reduce_across_ranks([{"total_time_sec": 1.0}, {"total_time_sec": 2.0}], ["total_time_sec"])
        >>> out["total_time_sec"], out["rank_skew_pct"]
        (2.0, 50.0)
        >>> reduce_across_ranks([{"total_time_sec": 1.0}, {"total_time_sec": 2.0}], [], mean=True)["total_time_sec"]
        1.5
    """
    if len(per_rank) == 1:
        return dict(per_rank[0])
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for row in per_rank for k in row):
        values = [row[key] for row in per_rank if key in row]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        out[key] = max(values) if numeric else values[0]
    if mean:
        for key in (*ITERATION_TIMES, *time_keys):
            values = [row.get(key) for row in per_rank]
            if key in out and all(isinstance(v, (int, float)) for v in values):
                out[key] = sum(values) / len(values)
    for key in time_keys:
        values = [row.get(key) for row in per_rank]
        if any(v is None for v in values):
            continue
        top = max(values)
        skew = 0.0 if top <= 0 else (top - min(values)) / top * 100.0
        stem = "rank_skew_pct" if key == "total_time_sec" else key.rsplit("_", 2)[0] + "_rank_skew_pct"
        out[stem] = skew
    return out


class _Raw(NamedTuple):
    """One recorded iteration's ledger inputs, as :meth:`CrossRank._ledger_record` read them."""

    spans: list
    calls: list
    #: Each call's completion time when the iteration ended (None: not complete then).
    dones: list
    waits: list
    #: DDP's bucket waits, not closed yet (:func:`~scopebench.profiler.collectives.closed_waits`).
    ddp_waits: list
    stop: float
    start: float
    #: This rank's clock offset to rank 0's.
    offset: float


class CrossRank:
    """The exchange and the ledger's per-iteration record and columns of a
    :class:`~scopebench.profiler.base.Profiler` (a base class of it: the attributes it reads,
    ``_world``, ``_ledger``, ``_pending``, ``rows``... are the profiler's)."""

    def _ledger_record(self, i: int, stop: float, metrics: dict[str, Any]) -> Any:
        """What this rank's :class:`~scopebench.profiler.ledger.RankRecord` of recorded iteration
        ``i`` is made of, kept until the exchange builds it (:meth:`_built_record`): the
        iteration's spans, collectives (their completion times as they are now) and waits, read
        once here; the record itself, on rank 0's clock, is built when it crosses the ranks, in
        the exchange's time (after the window under ``defer_exchange``: no step pays for it)."""
        from scopebench.profiler.collectives import recorder

        calls, dones, waits, ddp_waits = recorder.take_raw()
        spans, self._spans = self._spans or [], None
        return _Raw(spans, calls, dones, waits, ddp_waits, stop, self._t0, self._ledger[0])

    def _built_record(self, raw: _Raw, metrics: dict[str, Any]) -> Any:
        """The :class:`~scopebench.profiler.ledger.RankRecord` of ``raw`` (from
        :meth:`_ledger_record`), times on rank 0's clock; ``metrics``: the iteration's own."""
        from scopebench.profiler.collectives import closed_waits
        from scopebench.profiler.ledger import RankRecord

        offset = raw.offset
        regions = {name for name, _s, _e in raw.spans}
        return RankRecord(
            self.rank,
            [(name, s - offset, e - offset) for name, s, e in raw.spans],
            [
                (c.group, c.seq, c.op, c.size, c.nbytes, c.issue - offset, None if done is None else done - offset)
                for c, done in zip(raw.calls, raw.dones)
            ],
            [(w.start - offset, w.end - offset, w.calls) for w in closed_waits(raw.dones, raw.waits, raw.ddp_waits)],
            raw.stop - offset,
            raw.start - offset,
            {name: metrics[f"{name}_compute_sec"] for name in regions if f"{name}_compute_sec" in metrics},
            self._region_times(metrics, regions),
        )

    def _ledger_columns(self, i: int, records: list[Any], metrics: dict[str, Any]) -> dict[str, Any]:
        """This rank's ledger columns and iteration ``i``'s late rank (:mod:`scopebench.profiler.ledger`),
        from every rank's record of it."""
        from scopebench.profiler.ledger import TIMELINE_ITERATIONS, ledger_metrics, ledger_timeline

        self.ledger_records = records
        out = ledger_metrics(records, self.rank)
        out["clock_align_error_sec"] = self._ledger[1]
        if self._timelines < TIMELINE_ITERATIONS and len(records) > 1:  # one rank: no lanes to compare
            self._timelines += 1
            out["ledger_timeline"] = ledger_timeline(records)
        return out

    def _region_times(self, metrics: dict[str, Any], regions: set[str]) -> dict[str, float]:
        """The regions' time as this backend reports it (``region_time_key``), for the ledger's
        work (:attr:`~scopebench.profiler.ledger.RankRecord.times`): its columns then add up to
        the time the run reports, on whichever clock the backend read it."""
        if not self.region_time_key:
            return {}
        times = {name: metrics.get(self.region_time_key.format(name)) for name in regions}
        return {name: float(t) for name, t in times.items() if isinstance(t, (int, float))}

    def _exchange(self, after_window: bool = False) -> None:
        """The cross-rank part of the iterations recorded since the last exchange (a collective:
        every rank exchanges at the same iteration), :data:`EXCHANGE_CHUNK` iterations at a time:
        every rank's ledger records (one gather; each rank then computes its own columns), then
        every rank's metrics (one gather; rank 0 reduces them, :func:`reduce_across_ranks`). Inside
        the window its time is shared out over those iterations' ``profiler_overhead_sec`` (on
        each rank its own, on rank 0's reduced rows the reduction too); ``after_window`` (the
        window or the loop is over: no recorded step waits for it) it is :attr:`after_window_sec`."""
        items, self._pending = self._pending, []
        begin = time.perf_counter()
        try:
            step = self.exchange_chunk
            for k in range(0, len(items), step):
                self._exchange_items(items[k : k + step], charge=not after_window)
        finally:
            if after_window and items:
                self.after_window_sec += time.perf_counter() - begin

    def _exchange_items(self, items: list[tuple[int, dict[str, Any], Any]], charge: bool) -> None:
        rank, size = self._world
        start = time.perf_counter()
        if self._ledger is not None:
            mine = [self._built_record(raw, metrics) for _, metrics, raw in items]
            per_rank = gather_objects(mine) if size > 1 else [mine]
            for k, (i, metrics, _record) in enumerate(items):
                metrics.update(self._ledger_columns(i, [records[k] for records in per_rank], metrics))
        if self.reports_overhead and charge:
            share = (time.perf_counter() - start) / len(items)
            for _, metrics, _record in items:
                metrics["profiler_overhead_sec"] += share
        if self.keep_rows:
            self.rows.extend({"iter": i, "rank": rank, **metrics} for i, metrics, _record in items)
        self.last_local = items[-1][1]
        if size == 1:
            self._current = items[-1][1]
            if self.keep_rows:
                self.reduced_rows.extend(metrics for _, metrics, _record in items)
            return
        start = time.perf_counter()
        per_rank = gather_objects([metrics for _, metrics, _record in items])
        if rank != 0:
            self._current = items[-1][1]
            return
        time_keys = ["total_time_sec"]
        if self.region_time_key:
            time_keys += [self.region_time_key.format(r) for r in self._region_wall]
        reduced = []
        for k in range(len(items)):
            rows = [metrics[k] for metrics in per_rank]
            current = reduce_across_ranks(rows, time_keys, mean=self.unaligned_steps)
            current.update(self._cross_rank_metrics(rows))
            if self.sampler is not None:
                current.update(self.sampler.cross_rank(rows))
            if self._memory is not None:
                current.update(cross_rank_memory(rows))
            reduced.append(current)
        if self.reports_overhead and charge:
            # The slowest rank's own overhead, plus the gather and reduction rank 0 waited for.
            share = (time.perf_counter() - start) / len(items)
            for current in reduced:
                current["profiler_overhead_sec"] += share
        self._current = reduced[-1]
        if self.keep_rows:
            self.reduced_rows.extend(reduced)

    def _keep_unexchanged(self) -> None:
        """The iterations not exchanged yet, kept as this rank's own rows (no ledger columns)."""
        items, self._pending = self._pending, []
        if self.keep_rows:
            self.rows.extend({"iter": i, "rank": self.rank, **metrics} for i, metrics, _record in items)

    def _exchange_due(self, i: int) -> bool:
        """Whether the backend needs the exchange right after recorded iteration ``i`` (deferred
        exchanges otherwise wait for the window's end): a trace written at a cycle's end carries
        its iterations' ledger."""
        return False
