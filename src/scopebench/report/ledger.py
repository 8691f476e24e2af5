"""Reading the per-rank ledger of a distributed step: one home for every consumer.

With more than one rank the profiler writes, per recorded iteration, where each rank's
time went (``docs/profiler.md``): per region ``<region>_work_sec``,
``<region>_comm_wait_peer_sec`` (blocked in a collective before the last rank arrived),
``<region>_comm_transfer_sec`` (the rest of the blocked time: the collective's own cost),
``<region>_comm_hidden_sec`` (collectives in flight while the rank was not blocked) and,
in torch mode, ``<region>_compute_sec`` / ``<region>_host_overhead_sec`` and, where the training
framework marks its hooks, ``<region>_hooks_compute_sec`` / ``<region>_host_hooks_sec`` (the hooks'
part of each); per iteration the
rank the others waited for (``late_rank``, ``late_rank_delay_sec``, ``late_rank_region``,
``late_rank_work_excess_sec``, ``late_rank_cause``); per collective op ``comm_<op>_bytes``,
``_calls``, ``_sec``, ``_exposed_sec`` and ``_busbw_gb_per_sec``.

Three readings of those rows, each over plain per-iteration dicts (``profile-step``'s
per-step rows as they are; a report's :class:`~scopebench.report.results.Configuration`
through :func:`ledger_rows`):

- :func:`late_rank_summary`: the rank the others consistently wait for, or ``None``;
- :func:`ledger_table`: per region, where its time went (work, waiting for peers,
  transfer, hidden);
- :func:`collective_table`: per collective op, its volume, time, exposed share and bus
  bandwidth.

On rank 0's reduced row (the one benchopt stores) every number is the maximum over ranks
(:func:`scopebench.profiler.base.reduce_across_ranks`), so a region's work, wait and
transfer there are each their worst rank's and need not add up to the region's time; the
``late_rank*`` columns are the same on every rank. Every statistic comes from
:mod:`scopebench.stats`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scopebench import stats
from scopebench.report.results import Configuration

__all__ = [
    "LATE_RANK_CONSISTENT_PCT",
    "LATE_RANK_MIN_PCT",
    "LATE_RANK_MIN_SEC",
    "CollectiveLedger",
    "CollectiveTable",
    "LateRank",
    "LedgerTable",
    "RegionLedger",
    "collective_table",
    "config_late_rank",
    "ledger_regions",
    "ledger_rows",
    "phase_collectives",
    "ledger_table",
    "late_rank_summary",
]

#: A late rank is reported only when the same rank is ``late_rank`` in at least this share (%)
#: of the iterations that have one: a rank that is late now and then is noise (a page fault, a
#: scheduler hiccup), and with two ranks a coin toss gives 50 %.
LATE_RANK_CONSISTENT_PCT = 75.0
#: ... and its median ``late_rank_delay_sec`` is at least this share (%) of the median step
#: (``step_time_sec``): below it, a busy machine's scheduling moves even ranks as far apart (ranks
#: of an even 2-rank run on this 2-core machine arrive 1-6 ms apart, either one first).
LATE_RANK_MIN_PCT = 10.0
#: ... and at least this many seconds (1 ms), or the ranks' clock alignment error
#: (``clock_align_error_sec``) when larger: below it timers, and across machines the clocks'
#: alignment (0.15-7.8 ms measured between two nodes on a busy machine), make the delay itself
#: uncertain.
LATE_RANK_MIN_SEC = 1e-3

#: The ledger's parts of a region, in the order lines show them: (suffix, name in prose).
PARTS = (
    ("work", "work"),
    ("comm_wait_peer", "waiting for peers"),
    ("comm_transfer", "transfer"),
    ("comm_hidden", "hidden"),
    ("compute", "compute"),
    ("hooks_compute", "of it in framework hooks"),
    ("host_overhead", "host overhead"),
    ("host_hooks", "of it framework hooks"),
)
_CAUSES = {"compute": "mostly compute (operators)", "host_overhead": "mostly host overhead (Python, framework hooks)"}


def _number(row: Mapping[str, Any], key: str) -> float | None:
    """``row[key]`` as a float; ``None`` when absent, NaN or not a number."""
    value = row.get(key)
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if value != value else value


def _text(row: Mapping[str, Any], key: str) -> str | None:
    value = row.get(key)
    return value if isinstance(value, str) and value else None


def _most_frequent(values: Iterable[str | None]) -> str | None:
    """The most frequent value that is not ``None`` (the first seen on a tie)."""
    counts = Counter(v for v in values if v is not None)
    return counts.most_common(1)[0][0] if counts else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


@dataclass(frozen=True)
class LateRank:
    """The rank the others consistently wait for (:func:`late_rank_summary`)."""

    rank: int
    delay_sec: float
    """Median ``late_rank_delay_sec`` over the iterations this rank was late: how long the
    other ranks waited for it per step (summed over its collectives, the longest waiter)."""
    region: str | None
    """Where its time went: the region named most often (``late_rank_region``: where its own work
    exceeded the other ranks' median most, else where they waited)."""
    work_excess_sec: float | None
    """Median of its ``<region>_work_sec`` minus the other ranks' median in that region."""
    cause: str | None
    """``compute`` or ``host_overhead`` (torch backend), ``work`` otherwise (most frequent)."""
    share_pct: float
    """Iterations naming this rank over the iterations that name any rank, %."""
    iterations: int
    """Iterations naming this rank."""
    counted: int
    """Iterations that name a late rank."""
    step_sec: float
    """Median step (``step_time_sec``) over every row given."""
    start_lag_sec: float | None = None
    """Median of how much later than the others its step's clock started
    (``late_rank_start_lag_sec``); taken off :attr:`delay_sec`: lateness from before the step."""
    wait_region: str | None = None
    """Where the others waited for it, most often (``late_rank_wait_region``; ``step_end``: after
    their own step, at the next collective)."""

    @property
    def delay_pct(self) -> float:
        """The delay over the median step, %: ``100 * delay_sec / step_sec``."""
        return self.delay_sec / self.step_sec * 100.0 if self.step_sec > 0 else float("inf")

    @property
    def headline(self) -> str:
        """Who, how late, where: ``rank 1 arrives 200.0 ms late per step in bwd`` (a figure's subtitle)."""
        where = f" in {self.region}" if self.region else ""
        return f"rank {self.rank} arrives {_ms(self.delay_sec)} late per step{where}"

    @property
    def line(self) -> str:
        """One sentence: who, how late, where, and whether its own work explains it."""
        text = f"late rank: {self.headline}"
        excess = self.work_excess_sec
        if excess is not None:
            there = "there" if self.region else "before the collective"
            how = f", {_CAUSES[self.cause]}" if self.cause in _CAUSES else ""
            text += f" (its own work {there} took {_ms(excess)} more than the other ranks'{how}"
            if excess < self.delay_sec / 2:
                text += f", less than half the delay: it enters {self.region or 'the collective'} late"
            text += ")"
        if self.wait_region and self.wait_region != self.region:
            where = "after their step" if self.wait_region == "step_end" else f"in {self.wait_region}"
            return text + f"; the others wait for it {where}"
        return text + "; the others wait for it"

    def as_dict(self) -> dict[str, Any]:
        """Every field, ``delay_pct`` and ``line``, for JSON."""
        return {**asdict(self), "delay_pct": self.delay_pct, "line": self.line}


def late_rank_summary(rows: Iterable[Mapping[str, Any]]) -> LateRank | None:
    """The rank the others wait for, when it is consistent and costly; else ``None``.

    Over the iterations that name a ``late_rank``, the most frequent rank is reported when it
    is named in at least :data:`LATE_RANK_CONSISTENT_PCT` of them, and its median
    ``late_rank_delay_sec`` over the iterations naming it, less how much later its step began
    (``late_rank_start_lag_sec``, when positive), is at least
    :data:`LATE_RANK_MIN_PCT` of the median ``step_time_sec`` of all ``rows`` and at least
    :data:`LATE_RANK_MIN_SEC` (or the largest ``clock_align_error_sec``, when larger). Rows without a
    step time leave nothing to compare with: ``None``.

    Args:
        rows: one mapping per recorded iteration, keys as the profiler writes them (no
            ``objective_`` prefix); missing or NaN values are absent.

    :Examples:
        >>> rows = [{"step_time_sec": 0.4, "late_rank": 1, "late_rank_delay_sec": 0.2, "late_rank_region": "bwd"}] * 4
        >>> late_rank_summary(rows).line
        'late rank: rank 1 arrives 200.0 ms late per step in bwd; the others wait for it'
        >>> late_rank_summary([{**rows[0], "late_rank": i % 2} for i in range(4)]) is None
        True
    """
    rows = list(rows)
    late = [(int(rank), row) for row in rows if (rank := _number(row, "late_rank")) is not None]
    if not late:
        return None
    rank, count = Counter(r for r, _ in late).most_common(1)[0]
    share = count / len(late) * 100.0
    if share < LATE_RANK_CONSISTENT_PCT:
        return None
    mine = [row for r, row in late if r == rank]
    # What it brought from before its step (the loop's own synchronisation, the previous step's
    # end) is not the step's: the delay counted is what it added after its clock started.
    lags = [_number(row, "late_rank_start_lag_sec") or 0.0 for row in mine]
    delays = [
        max(d - max(lag, 0.0), 0.0)
        for row, lag in zip(mine, lags)
        if (d := _number(row, "late_rank_delay_sec")) is not None
    ]
    steps = [s for row in rows if (s := _number(row, "step_time_sec")) is not None]
    if not delays or not steps:
        return None
    delay, step = stats.median(delays), stats.median(steps)
    errors = [e for row in rows if (e := _number(row, "clock_align_error_sec")) is not None]
    if delay < max([LATE_RANK_MIN_SEC, *errors]) or delay * 100.0 < LATE_RANK_MIN_PCT * step:
        return None
    excess = [e for row in mine if (e := _number(row, "late_rank_work_excess_sec")) is not None]
    return LateRank(
        rank=rank,
        delay_sec=delay,
        region=_most_frequent(_text(row, "late_rank_region") for row in mine),
        work_excess_sec=stats.median(excess) if excess else None,
        cause=_most_frequent(_text(row, "late_rank_cause") for row in mine),
        share_pct=share,
        iterations=count,
        counted=len(late),
        step_sec=step,
        start_lag_sec=stats.median(lags),
        wait_region=_most_frequent(_text(row, "late_rank_wait_region") for row in mine),
    )


@dataclass(frozen=True)
class RegionLedger:
    """Where one region's time went: the mean of each part over the iterations that have the
    ledger (:func:`ledger_table`), seconds; ``None`` for a part the rows lack."""

    region: str
    time_sec: float
    """Mean region time: ``<region>_time_sec``, else ``<region>_cpu_sec``, else work + wait + transfer."""
    work_sec: float | None
    wait_peer_sec: float | None
    transfer_sec: float | None
    hidden_sec: float | None
    """Overlapped with the work, so part of it: its share does not add to the others'."""
    compute_sec: float | None
    hooks_compute_sec: float | None
    """The operators the framework's marked hooks ran: part of ``compute_sec`` (torch backend)."""
    host_overhead_sec: float | None
    host_hooks_sec: float | None
    """The framework's marked hooks' part of the host overhead (torch backend)."""
    iterations: int

    def parts(self) -> dict[str, float]:
        """Prose name -> seconds, for the parts present, in :data:`PARTS` order."""
        values = (
            self.work_sec,
            self.wait_peer_sec,
            self.transfer_sec,
            self.hidden_sec,
            self.compute_sec,
            self.hooks_compute_sec,
            self.host_overhead_sec,
            self.host_hooks_sec,
        )
        return {name: v for (_, name), v in zip(PARTS, values) if v is not None}

    def pct(self, seconds: float | None) -> float | None:
        """``seconds`` over the region's mean time, %: ``100 * seconds / time_sec``."""
        if seconds is None or self.time_sec <= 0:
            return None
        return seconds / self.time_sec * 100.0

    def line(self) -> str:
        """``bwd 20.0 ms: work 12.0 ms (60%), waiting for peers 5.0 ms (25%), ...``."""
        cells = [f"{name} {_ms(v)} ({self.pct(v):.0f}%)" for name, v in self.parts().items()]
        return f"{self.region} {_ms(self.time_sec)}: " + ", ".join(cells)


@dataclass(frozen=True)
class LedgerTable:
    """One :class:`RegionLedger` per region that has the ledger."""

    regions: tuple[RegionLedger, ...]

    def lines(self) -> list[str]:
        return [r.line() for r in self.regions]

    def as_dict(self) -> dict[str, Any]:
        return {r.region: {**asdict(r), "pct": {n: r.pct(v) for n, v in r.parts().items()}} for r in self.regions}


def ledger_regions(rows: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Regions with a ``<region>_work_sec`` in any row, in order of first appearance."""
    found: dict[str, None] = {}
    for row in rows:
        for key in row:
            if key.endswith("_work_sec") and _number(row, key) is not None:
                found.setdefault(key.removesuffix("_work_sec"))
    return tuple(found)


def _region_time(row: Mapping[str, Any], region: str) -> float | None:
    for key in (f"{region}_time_sec", f"{region}_cpu_sec"):
        if (value := _number(row, key)) is not None:
            return value
    parts = [_number(row, f"{region}_{p}_sec") for p in ("work", "comm_wait_peer", "comm_transfer")]
    return sum(parts) if all(p is not None for p in parts) else None


def ledger_table(rows: Iterable[Mapping[str, Any]], regions: Sequence[str] | None = None) -> LedgerTable:
    """Per region, the mean of each ledger part and the region's mean time (:class:`RegionLedger`).

    Only the rows with ``<region>_work_sec`` count for a region; a region without any is
    left out. ``regions=None``: every region with the ledger (:func:`ledger_regions`).

    :Examples:
        >>> row = {"bwd_time_sec": 0.02, "bwd_work_sec": 0.012, "bwd_comm_wait_peer_sec": 0.005,
        ...        "bwd_comm_transfer_sec": 0.003, "bwd_comm_hidden_sec": 0.002}
        >>> ledger_table([row], ["bwd"]).lines()
        ['bwd 20.0 ms: work 12.0 ms (60%), waiting for peers 5.0 ms (25%), transfer 3.0 ms (15%), hidden 2.0 ms (10%)']
    """
    rows = list(rows)
    out = []
    for region in ledger_regions(rows) if regions is None else regions:
        have = [row for row in rows if _number(row, f"{region}_work_sec") is not None]
        times = [t for row in have if (t := _region_time(row, region)) is not None]
        if not have or not times:
            continue
        means = []
        for suffix, _ in PARTS:
            values = [v for row in have if (v := _number(row, f"{region}_{suffix}_sec")) is not None]
            means.append(stats.mean(values) if values else None)
        out.append(RegionLedger(region, stats.mean(times), *means, iterations=len(have)))
    return LedgerTable(tuple(out))


@dataclass(frozen=True)
class CollectiveLedger:
    """One collective op over the iterations that ran it: medians per iteration."""

    op: str
    bytes: float | None
    """Bytes it moved per iteration (``comm_<op>_bytes``)."""
    calls: float | None
    sec: float | None
    """Seconds in flight per iteration."""
    exposed_sec: float | None
    """Seconds a rank was blocked in it per iteration."""
    busbw_gb_per_sec: float | None
    """Bus bandwidth, GB/s (NCCL-tests convention: algorithm bandwidth times the op's factor)."""
    iterations: int

    @property
    def exposed_pct(self) -> float | None:
        """``100 * median(exposed) / median(in flight)``: the share the ranks did not hide."""
        if self.exposed_sec is None or not self.sec:
            return None
        return self.exposed_sec / self.sec * 100.0

    def line(self) -> str:
        """``all_reduce: 12.6 MB in 3 calls, 4.0 ms in flight, 25% exposed, busbw 3.15 GB/s``."""
        cells = []
        if self.bytes is not None:
            cells.append(f"{self.bytes / 1e6:.1f} MB" + (f" in {self.calls:g} calls" if self.calls is not None else ""))
        elif self.calls is not None:
            cells.append(f"{self.calls:g} calls")
        if self.sec is not None:
            cells.append(f"{_ms(self.sec)} in flight")
        if self.exposed_pct is not None:
            cells.append(f"{self.exposed_pct:.0f}% exposed")
        if self.busbw_gb_per_sec is not None:
            cells.append(f"busbw {self.busbw_gb_per_sec:.2f} GB/s")
        return f"{self.op}: " + ", ".join(cells) + " per iteration (medians)"


@dataclass(frozen=True)
class CollectiveTable:
    """One :class:`CollectiveLedger` per op, in order of first appearance."""

    ops: tuple[CollectiveLedger, ...]

    def lines(self) -> list[str]:
        return [op.line() for op in self.ops]

    def as_dict(self) -> dict[str, Any]:
        return {op.op: {**asdict(op), "exposed_pct": op.exposed_pct} for op in self.ops}


_OP_FIELDS = ("bytes", "calls", "sec", "exposed_sec", "busbw_gb_per_sec")


def collective_table(rows: Iterable[Mapping[str, Any]]) -> CollectiveTable:
    """Per collective op (``comm_<op>_calls`` or ``comm_<op>_bytes`` in a row), the medians of
    its figures over the iterations that ran it (:class:`CollectiveLedger`).

    :Examples:
        >>> row = {"comm_all_reduce_bytes": 4e6, "comm_all_reduce_calls": 2, "comm_all_reduce_sec": 0.004,
        ...        "comm_all_reduce_exposed_sec": 0.001, "comm_all_reduce_busbw_gb_per_sec": 1.0}
        >>> collective_table([row]).lines()
        ['all_reduce: 4.0 MB in 2 calls, 4.0 ms in flight, 25% exposed, busbw 1.00 GB/s per iteration (medians)']
    """
    rows = list(rows)
    ops: dict[str, None] = {}
    for row in rows:
        for key in row:
            for end in ("_calls", "_bytes"):
                if key.startswith("comm_") and key.endswith(end) and _number(row, key) is not None:
                    ops.setdefault(key.removeprefix("comm_").removesuffix(end))
    out = []
    for op in ops:
        have = [row for row in rows if any(_number(row, f"comm_{op}_{f}") is not None for f in ("calls", "bytes"))]
        medians = []
        for name in _OP_FIELDS:
            values = [v for row in have if (v := _number(row, f"comm_{op}_{name}")) is not None]
            medians.append(stats.median(values) if values else None)
        out.append(CollectiveLedger(op, *medians, iterations=len(have)))
    return CollectiveTable(tuple(out))


def phase_collectives(rows: Iterable[Mapping[str, Any]], phases: Iterable[str]) -> dict[str, dict[str, dict]]:
    """Per phase and collective op (``<phase>_comm_<op>_bytes`` in a row), the medians over
    ``rows`` of its ``bytes_per_step`` and ``calls_per_step`` (0 in a row without the op);
    phases that ran none are left out.

    :Examples:
        >>> rows = [{"bwd_comm_all_reduce_bytes": 8, "bwd_comm_all_reduce_calls": 1}, {"bwd_comm_all_reduce_bytes": 8}]
        >>> phase_collectives(rows, ["forward", "bwd"])
        {'bwd': {'all_reduce': {'bytes_per_step': 8.0, 'calls_per_step': 0.5}}}
    """
    rows = list(rows)
    out: dict[str, dict[str, dict]] = {}
    for phase in phases:
        prefix = f"{phase}_comm_"
        ops = {
            k[len(prefix) : -len("_bytes")]
            for row in rows
            for k in row
            if k.startswith(prefix) and k.endswith("_bytes")
        }
        for op in sorted(ops):
            out.setdefault(phase, {})[op] = {
                f"{what}_per_step": float(stats.median([row.get(f"{prefix}{op}_{what}", 0) for row in rows]))
                for what in ("bytes", "calls")
            }
    return out


def ledger_rows(config: Configuration) -> list[dict[str, Any]]:
    """A configuration's recorded iterations as the plain rows the functions here read: the
    ``objective_<key>`` values under ``<key>``, missing values left out, and ``step_time_sec``
    from :meth:`~scopebench.report.results.Configuration.step_values` (older files derive it)."""
    key = ("ledger_rows",)
    if key not in config.cache:
        columns = [c for c in config.recorded.columns if c.startswith("objective_")]
        rows = []
        for record, step in zip(config.recorded[columns].to_dict("records"), config.step_values()):
            row = {k.removeprefix("objective_"): v for k, v in record.items() if not _absent(v)}
            row["step_time_sec"] = step
            rows.append(row)
        config.cache[key] = rows
    return config.cache[key]


def _absent(value: Any) -> bool:
    try:
        return value is None or value != value  # NaN
    except (TypeError, ValueError):
        return False


def config_late_rank(config: Configuration) -> LateRank | None:
    """:func:`late_rank_summary` over a configuration's recorded iterations (computed once)."""
    key = ("late_rank",)
    if key not in config.cache:
        config.cache[key] = late_rank_summary(ledger_rows(config))
    return config.cache[key]
