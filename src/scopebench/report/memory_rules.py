"""Diagnosis rules over ``profiler_memory``'s columns (listed in ``docs/diagnosis.md``).

:mod:`scopebench.report.diagnosis` runs them with its other rules; each returns the
:class:`~scopebench.report.findings.Finding` lines of one configuration, naming the numbers
that triggered it against the threshold. They read only ``mem_*`` columns, so a run without
``profiler_memory`` (the quickstart) never triggers them.
"""

from __future__ import annotations

from scopebench import stats
from scopebench.report.findings import Finding
from scopebench.report.results import Configuration

__all__ = ["fragmentation", "memory_creep", "memory_rank_imbalance", "sharding_does_not_pay"]

#: fragmentation: ``mem_fragmentation_pct`` (reserved − allocated over allocated) above this (%).
FRAGMENTATION_PCT = 10.0
#: memory creep: the step peak grows by more than this (%) from the first to the last recorded iterations.
CREEP_PCT = 5.0
#: memory rank imbalance: ``mem_rank_imbalance_pct`` above this (%).
MEMORY_IMBALANCE_PCT = 10.0


def fragmentation(config: Configuration, others: list[Configuration]) -> list:
    values = config.values("mem_fragmentation_pct")
    if not values or stats.median(values) <= FRAGMENTATION_PCT:
        return []
    reserved, allocated = config.values("mem_reserved_peak_mb"), config.values("mem_allocated_peak_mb")
    sizes = (
        f" (reserved {stats.median(reserved):.0f} MB, allocated {stats.median(allocated):.0f} MB)"
        if reserved and allocated
        else ""
    )
    return [
        Finding(
            "fragmentation",
            config.label,
            f"reserved - allocated is {stats.median(values):.1f}% of the allocated peak{sizes} (> {FRAGMENTATION_PCT:g}%)",
            "set PYTORCH_ALLOC_CONF=expandable_segments:True (segments grow instead of caching fixed blocks); "
            "the memory snapshot (profiler_memory on CUDA) shows which blocks are split",
        )
    ]


def memory_creep(config: Configuration, others: list[Configuration]) -> list:
    peaks = config.values("mem_peak_mb")
    if len(peaks) < 4:
        return []
    quarter = max(1, len(peaks) // 4)
    first, last = stats.median(peaks[:quarter]), stats.median(peaks[-quarter:])
    if first <= 0 or (last - first) / first * 100.0 <= CREEP_PCT:
        return []
    return [
        Finding(
            "memory-creep",
            config.label,
            f"the step peak grew from {first:.1f} MB to {last:.1f} MB over {len(peaks)} recorded iterations "
            f"(+{(last - first) / first * 100.0:.1f}%, > {CREEP_PCT:g}%)",
            "something keeps tensors alive across steps (a loss kept with its graph, a growing list, a cache): "
            "compare <region>_mem_<category>_mb of the first and last iterations to see which category grows",
        )
    ]


def memory_rank_imbalance(config: Configuration, others: list[Configuration]) -> list:
    values = config.values("mem_rank_imbalance_pct")
    if not values or stats.median(values) <= MEMORY_IMBALANCE_PCT:
        return []
    worst = config.values("mem_worst_rank")
    who = f"; rank {int(stats.median(worst))} holds the most" if worst else ""
    return [
        Finding(
            "memory-rank-imbalance",
            config.label,
            f"step peaks differ by {stats.median(values):.1f}% between ranks (> {MEMORY_IMBALANCE_PCT:g}%){who}",
            "the largest rank sets the batch every rank can run: check uneven shards (padding), rank 0's "
            "extra work (logging, checkpoints, scoring) and uneven batches",
        )
    ]


def _shards_parameters(config: Configuration) -> bool | None:
    """Whether ``config``'s backend shards the parameters (None: no known backend)."""
    from scopebench.report.backend_comparison import config_backend
    from scopebench.train.backends import find_backend

    backend = find_backend(config_backend(config))
    return None if backend is None else backend.shards_parameters


def sharding_does_not_pay(config: Configuration, others: list[Configuration]) -> list:
    """A backend that shards the parameters (its ``shards_parameters``) whose gather buffers cost more
    than the parameter memory it saves against one that keeps them whole (DDP, ZeRO-2)."""
    from scopebench.report.backend_comparison import config_backend

    backend = config_backend(config)
    gather, params = config.values("mem_gather_buffers_mb"), config.values("mem_parameters_mb")
    if not _shards_parameters(config) or not gather or not params:
        return []
    for other in others:
        if other is config or _shards_parameters(other) is not False or other.dataset != config.dataset:
            continue
        whole = other.values("mem_parameters_mb")
        if not whole:
            continue
        saved = stats.median(whole) - stats.median(params)
        cost = stats.median(gather)
        if saved < cost:
            return [
                Finding(
                    "sharding-does-not-pay",
                    config.label,
                    f"{backend} holds {saved:.1f} MB less of parameters than {config_backend(other)} "
                    f"({stats.median(params):.1f} vs {stats.median(whole):.1f} MB) but its gather buffers take "
                    f"{cost:.1f} MB",
                    "the parameters are too small to shard at this size: use ddp or zero2, or raise the "
                    "persistence threshold / bucket sizes only if the model grows",
                )
            ]
    return []
