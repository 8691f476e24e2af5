"""A diagnosis line (:class:`Finding`) and what the rule modules share to write one.

The rules live in :mod:`scopebench.report.diagnosis` (the solver's), in
:mod:`scopebench.report.host_rules` (the machine's) and in
:mod:`scopebench.report.memory_rules` (``profiler_memory``'s); ``diagnosis`` lists them all
in ``RULES``. What more than one of them reads lives here, below all three: the line itself,
the two measurements of a configuration every rule uses (:func:`metric_median`,
:func:`step_share_pct`), and the thresholds that ``host_rules`` reuses to name why a GPU
waits (the ``input-bound``, ``host-sync-bound`` and ``rank-imbalance`` rules' own).

Shares are of the step without the scoring callback (:mod:`scopebench.report.tables`);
all statistics come from :mod:`scopebench.stats`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scopebench import stats
from scopebench.report.results import Configuration

__all__ = [
    "INPUT_WAIT_PCT",
    "SKEW_PCT",
    "SYNC_PCT",
    "SYNC_REGION",
    "Finding",
    "metric_median",
    "step_share_pct",
    "waiting_share_pct",
]

#: input-bound: ``dataload_wait`` above this share of the step (%).
INPUT_WAIT_PCT = 5.0
#: host-sync-bound: ``sync_gather`` above this share of the step (%).
SYNC_PCT = 5.0
#: The policy training step's region of metric gathers and host syncs: host-sync-bound judges it
#: (its collectives are the loss gather, not what communication-bound's advice is about).
SYNC_REGION = "sync_gather"
#: rank imbalance: ``rank_skew_pct`` (or a region's, for regions above
#: :data:`scopebench.report.diagnosis.SKEW_REGION_MIN_PCT` of the step) above this (%).
SKEW_PCT = 10.0


@dataclass(frozen=True)
class Finding:
    """One diagnosis line."""

    rule: str
    config: str
    """The configuration's label."""
    message: str
    """The numbers that triggered the rule, with the threshold."""
    advice: str = ""

    def text(self) -> str:
        return f"[{self.rule}] {self.config}: {self.message}" + (f" -> {self.advice}" if self.advice else "")


def metric_median(config: Configuration, metric: str) -> float | None:
    """Median of ``metric`` over the configuration's recorded iterations, ``None`` without any."""
    values = config.values(metric)
    return stats.median(values) if values else None


def step_share_pct(config: Configuration, region: str) -> float | None:
    """Mean of the region over the mean step, in %: ``100 * mean(region) / mean(step)``."""
    if region not in config.region_columns:
        return None
    values, step = config.region_values(region), config.step_values()
    if not values or not step or stats.mean(step) <= 0:
        return None
    return stats.mean(values) / stats.mean(step) * 100.0


def waiting_share_pct(config: Configuration, region: str) -> float | None:
    """Mean ``<region>_comm_wait_peer_sec`` (the per-rank ledger: blocked until the last rank
    arrived) over the mean step, in %; ``None`` without the ledger's column.

    A rank that waits for a late peer spends that time in the region, but the region does not
    cost it: the late peer does (``late-rank``)."""
    waits, step = config.values(f"{region}_comm_wait_peer_sec"), config.step_values()
    if not waits or not step or stats.mean(step) <= 0:
        return None
    return stats.mean(waits) / stats.mean(step) * 100.0
