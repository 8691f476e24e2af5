"""Diagnosis lines: explicit rules over a configuration's numbers (documented in ``docs/diagnosis.md``).

Each rule reads the recorded iterations of one configuration (and, for the rules that
compare runs, the other configurations of the same benchmark and dataset) and returns a
:class:`Finding` that names the rule, the numbers that triggered it against the threshold,
and what to try. A profiled configuration on which no rule fires gets one
``no-problem`` line; one without profiled iterations gets ``no-data``.

Training-step configurations that differ only in ``backend`` form a
:class:`~scopebench.report.backend_comparison.BackendComparison` (built in
:mod:`scopebench.report.backend_comparison`, whose table is printed after the phase
tables); the ``backend-comparison`` rule here gives each backend slower than the fastest
one line that names the phases behind the difference and what they hold under that
backend (``PHASE_CONTENTS`` of :mod:`scopebench.policy.phases`).

The rules over the per-rank ledger of a distributed step (``late-rank``,
``communication-bound``, ``host-overhead``, ``hidden-communication``) live in
:mod:`scopebench.report.ledger_rules`, over :mod:`scopebench.report.ledger`; so do the
machine's (:mod:`~scopebench.report.host_rules`) and ``profiler_memory``'s
(:mod:`~scopebench.report.memory_rules`) in their modules. ``hidden-communication`` only
informs (:data:`INFORMATIONAL`): a configuration with no other line still gets ``no-problem``.

Shares are of the step without the scoring callback (:mod:`scopebench.report.tables`);
ratios of two regions use their medians; all statistics come from :mod:`scopebench.stats`.
"""

from __future__ import annotations

from collections.abc import Callable

from scopebench import stats
from scopebench.report import memory_rules
from scopebench.report.backend_comparison import backend_comparisons, config_backend
from scopebench.report.cost import profiler_cost
from scopebench.report.findings import (
    INPUT_WAIT_PCT,
    SKEW_PCT,
    SYNC_PCT,
    SYNC_REGION,
    Finding,
    metric_median,
    step_share_pct,
    waiting_share_pct,
)
from scopebench.report.host_rules import contended, gpu_throttled, low_gpu_utilisation
from scopebench.report.ledger import config_late_rank
from scopebench.report.ledger_rules import (
    communication_bound,
    hidden_communication,
    host_overhead,
    late_rank,
    tracks_memory,
)
from scopebench.report.results import LAYOUT_PARAMS, Configuration, is_on
from scopebench.report.tables import config_kind, throughput

__all__ = ["Finding", "INFORMATIONAL", "RULES", "diagnose", "diagnose_all"]

# INPUT_WAIT_PCT (input-bound), SYNC_PCT (host-sync-bound) and SKEW_PCT (rank-imbalance) are in
# scopebench.report.findings: host_rules names the GPU's idle causes with them too.
#: distributed overhead: multi-rank ``bwd / forward`` at least this ...
DIST_MULTI_RATIO = 3.0
#: ... while a single-rank run of the same solver has ``bwd / forward`` in this range ("close to 2x").
DIST_SINGLE_RANGE = (1.5, 2.5)
#: optimizer-bound: ``optim_step`` above this share of the step (%), on CUDA, without fused AdamW.
OPTIM_PCT = 10.0
#: rank imbalance: a region's skew counts when the region is at least this share of the step (%).
SKEW_REGION_MIN_PCT = 5.0
#: profiler too costly: the median ``profiler_inside_sec + profiler_overhead_sec`` above this share of the median step (%).
OVERHEAD_PCT = 10.0
#: compile not effective: first call / steady state below this ratio while compiling.
COMPILE_RATIO = 5.0
# COMM_PCT (communication-bound) and HOST_OVERHEAD_PCT (host-overhead) are in scopebench.report.ledger_rules.


def _ratio(config: Configuration, top: str, bottom: str) -> float | None:
    if top not in config.region_columns or bottom not in config.region_columns:
        return None
    a, b = config.region_values(top), config.region_values(bottom)
    if not a or not b or stats.median(b) <= 0:
        return None
    return stats.median(a) / stats.median(b)


def _on_cuda(config: Configuration) -> bool:
    device = config.param("device")
    if device is not None and str(device).startswith("cuda"):
        return True
    peak = config.values("max_gpu_mb")
    return bool(peak) and max(peak) > 0


def _same_group(a: Configuration, b: Configuration) -> bool:
    return a.benchmark == b.benchmark and a.dataset == b.dataset


def _agree(a: Configuration, b: Configuration, names: tuple[str, ...]) -> bool:
    """Parameters both configurations define are equal."""
    for name in names:
        va, vb = a.param(name), b.param(name)
        if va is not None and vb is not None and str(va) != str(vb):
            return False
    return True


def _differences(a: Configuration, b: Configuration) -> int:
    pa, pb = a.params(), b.params()
    return sum(1 for k in set(pa) | set(pb) if k not in LAYOUT_PARAMS and str(pa.get(k)) != str(pb.get(k)))


def input_bound(config: Configuration, others: list[Configuration]) -> list[Finding]:
    out = []
    share = step_share_pct(config, "dataload_wait")
    if share is not None and share > INPUT_WAIT_PCT:
        out.append(
            Finding(
                "input-bound",
                config.label,
                f"dataload_wait is {share:.1f}% of the step (> {INPUT_WAIT_PCT:g}%)",
                "the dataloader does not keep up: raise num_workers, use persistent workers / pinned memory, "
                "and run Pi05Dataloader to measure the input ceiling",
            )
        )
    rate = throughput(config).get("samples_per_sec") if config_kind(config) == "training_step" else None
    if rate:
        for loader in others:
            if loader is config or config_kind(loader) != "dataloader" or not _same_group(config, loader):
                continue
            if not _agree(config, loader, ("batch_size", "nproc_per_node", "num_workers", "preset")):
                continue
            ceiling = metric_median(loader, "samples_per_sec")
            if ceiling is not None and ceiling <= rate:
                out.append(
                    Finding(
                        "input-bound",
                        config.label,
                        f"dataloader ceiling {ceiling:.1f} samples/s ({loader.label}) is at or below "
                        f"the training rate {rate:.1f} samples/s",
                        "the input pipeline is the bottleneck: more workers or cheaper decoding before touching the model",
                    )
                )
    return out


def distributed_overhead(config: Configuration, others: list[Configuration]) -> list[Finding]:
    if config.ranks() <= 1:
        return []
    multi = _ratio(config, "bwd", "forward")
    if multi is None or multi < DIST_MULTI_RATIO:
        return []
    singles = [
        c
        for c in others
        if c.ranks() == 1 and c.solver_base == config.solver_base and _same_group(config, c)
        and _agree(config, c, ("batch_size", "preset"))
    ]  # fmt: skip
    # The closest single-rank run: fewest parameters differing, process layout aside.
    singles.sort(key=lambda c: _differences(config, c))
    for single in singles:
        one = _ratio(single, "bwd", "forward")
        if one is not None and DIST_SINGLE_RANGE[0] <= one <= DIST_SINGLE_RANGE[1]:
            return [
                Finding(
                    "distributed-overhead",
                    config.label,
                    f"bwd / forward = {multi:.2f}x on {config.ranks()} ranks (>= {DIST_MULTI_RATIO:g}x) but "
                    f"{one:.2f}x on one rank ({single.label}; close to 2x)",
                    "the extra backward time is host-side distributed work (gradient hooks, bucketing, "
                    "find_unused_parameters, ZeRO partitioning): compare backends and DDP settings",
                )
            ]
    return []


def optimizer_bound(config: Configuration, others: list[Configuration]) -> list[Finding]:
    share = step_share_pct(config, "optim_step")
    if share is None or share <= OPTIM_PCT or not _on_cuda(config) or is_on(config.param("fused_adamw")):
        return []
    return [
        Finding(
            "optimizer-bound",
            config.label,
            f"optim_step is {share:.1f}% of the step (> {OPTIM_PCT:g}%) on CUDA without fused AdamW "
            f"(fused_adamw={config.param('fused_adamw')})",
            "set fused_adamw: true (torch.optim.AdamW(fused=True)) and compare with scopebench compare",
        )
    ]


def host_sync_bound(config: Configuration, others: list[Configuration]) -> list[Finding]:
    """``sync_gather``'s share of the step; with the ledger, without the time a rank was blocked
    there waiting for a later peer (:func:`~scopebench.report.findings.waiting_share_pct`): that
    is the late peer's cost (``late-rank``), not the gather's."""
    share = step_share_pct(config, SYNC_REGION)
    if share is None or share <= SYNC_PCT:
        return []
    waited = waiting_share_pct(config, SYNC_REGION)
    if waited is None:
        message = f"{SYNC_REGION} is {share:.1f}% of the step (> {SYNC_PCT:g}%)"
    elif share - waited <= SYNC_PCT:
        return []
    else:
        message = (
            f"{SYNC_REGION} is {share - waited:.1f}% of the step without waiting for peers (> {SYNC_PCT:g}%); "
            f"waiting for peers, {waited:.1f}% more, is not counted (late-rank)"
        )
    return [
        Finding(
            "host-sync-bound",
            config.label,
            message,
            "the metric gathers and .item() calls run every step: gate them behind the log frequency",
        )
    ]


def _skew_beyond_waiting(config: Configuration, region: str | None) -> float | None:
    """Median over the recorded iterations of a region's rank skew (``None``: the step's,
    ``rank_skew_pct``) less the part of it the per-rank ledger says was waiting for a peer:
    ``skew - 100 * wait / time`` (at least 0), ``wait`` the region's ``comm_wait_peer_sec`` (the
    step's: summed over regions), ``time`` the region's (the step's ``total_time_sec``), each the
    maximum over ranks. Without the ledger, the skew itself.

    The rank that arrives first at a collective waits there for the others: its region lasts
    longer by the wait, which is the late peer's cost (``late-rank`` judges it), not an imbalance
    of the region's own work (on a loaded machine, ranks arriving 5 ms apart made the 3 ms loss
    gather read 39 % skew, docs/validation.md)."""
    rows = config.recorded
    name = "rank_skew_pct" if region is None else f"{region}_rank_skew_pct"
    if f"objective_{name}" not in rows.columns:
        return None
    if region is None:
        time = rows["objective_total_time_sec"]
        waits = [c for c in rows.columns if c.startswith("objective_") and c.endswith("_comm_wait_peer_sec")]
        wait = rows[waits].sum(axis=1, min_count=1) if waits else None
    else:
        time = rows[f"objective_{config.region_columns[region]}"]
        column = f"objective_{region}_comm_wait_peer_sec"
        wait = rows[column] if column in rows.columns else None
    values = []
    for i, skew in enumerate(rows[f"objective_{name}"].tolist()):
        if skew is None or skew != skew:
            continue
        waited, total = (None if wait is None else wait.iloc[i]), time.iloc[i]
        if waited is not None and waited == waited and total == total and total > 0:
            skew = max(skew - 100.0 * waited / total, 0.0)
        values.append(float(skew))
    return stats.median(values) if values else None


def rank_imbalance(config: Configuration, others: list[Configuration]) -> list[Finding]:
    """Rank skew of the step or of a region of at least :data:`SKEW_REGION_MIN_PCT` of it, above
    :data:`~scopebench.report.findings.SKEW_PCT`, less what the ledger says was waiting for a peer
    (:func:`_skew_beyond_waiting`). With ``profiler_memory`` on, the step's skew alone: the
    tracker's Python per operator makes each region's time jitter between the ranks
    (:func:`~scopebench.report.ledger_rules.tracks_memory`)."""
    parts = []
    skew = _skew_beyond_waiting(config, None)
    if skew is not None and skew > SKEW_PCT:
        parts.append(f"step skew {skew:.1f}%")
    for region in () if tracks_memory(config) else config.regions:
        region_skew = _skew_beyond_waiting(config, region)
        share = step_share_pct(config, region)
        if region_skew is not None and region_skew > SKEW_PCT and share is not None and share >= SKEW_REGION_MIN_PCT:
            parts.append(f"{region} skew {region_skew:.1f}%")
    if not parts:
        return []
    late = config_late_rank(config)
    straggler = config.values("straggler_rank")
    advice = "look at that rank's data shard, host load, CPU affinity or device; ranks wait for the slowest"
    if late is not None:
        # The ledger measured who the others wait for: no second guess beside it.
        who = f"rank {late.rank} is the late rank (see late-rank)"
        advice = "see late-rank: the rank the others wait for, where, and what to look at"
    elif straggler:
        who = f"straggler_rank {int(stats.median(straggler))} (the rank that waited least in communication)"
    else:
        who = "straggler not measured (the torch backend names it)"
    return [
        Finding("rank-imbalance", config.label, f"{', '.join(parts)} across ranks (> {SKEW_PCT:g}%); {who}", advice)
    ]


def profiler_too_costly(config: Configuration, others: list[Configuration]) -> list[Finding]:
    """The steady-state cost inside and outside the clock (:func:`~scopebench.report.cost.profiler_cost`:
    medians), so the first iteration's one-off start-up does not make a 0.2 % profiler read as 10 %."""
    cost = profiler_cost(config)
    if cost is None or cost.share_pct <= OVERHEAD_PCT:
        return []
    pct = cost.share_pct
    return [
        Finding(
            "profiler-too-costly",
            config.label,
            f"the profiler costs {cost.per_step_sec * 1e3:.1f} ms per iteration (median of profiler_inside_sec "
            f"+ profiler_overhead_sec) = {pct:.0f}% of the step (> {OVERHEAD_PCT:g}%)",
            "the window costs more than it measures: record fewer iterations (profiler_active), use the "
            "scheduled mode (profiler_per_step: false) or the custom backend for timings",
        )
    ]


def compile_not_effective(config: Configuration, others: list[Configuration]) -> list[Finding]:
    ratios = config.facts("first_call_ratio")
    if not ratios:
        return []
    compiled = any(is_on(v) for k, v in config.params().items() if "compile" in k)
    compile_time = config.facts("compile_time_sec")
    if not compiled and not (compile_time and max(compile_time) > 0):
        return []
    ratio = stats.median(ratios)
    if ratio >= COMPILE_RATIO:
        return []
    return [
        Finding(
            "compile-not-effective",
            config.label,
            f"first call / steady state = {ratio:.2f}x (< {COMPILE_RATIO:g}x) while compiling",
            "torch.compile probably fell back to eager or was already cached: check graph breaks "
            "(TORCH_LOGS=graph_breaks) and that the compiled function is the one called",
        )
    ]


def backend_comparison(config: Configuration, others: list[Configuration]) -> list[Finding]:
    if config_backend(config) is None or config.recorded.empty:
        return []
    for comparison in backend_comparisons(others):
        backend = comparison.backend_of(config)
        if backend in comparison.explanations:
            return [
                Finding(
                    "backend-comparison",
                    config.label,
                    comparison.explanations[backend],
                    "PHASE_CONTENTS (scopebench.policy.phases) says what each phase holds per backend: weigh the "
                    "time against the memory each backend needs (max_gpu_mb), and run profiler_mode: torch to see "
                    "how much of each phase is communication (<phase>_comm_sec)",
                )
            ]
    return []


#: Every rule, in the order lines are printed.
RULES: tuple[Callable[[Configuration, list[Configuration]], list[Finding]], ...] = (
    input_bound,
    distributed_overhead,
    optimizer_bound,
    host_sync_bound,
    late_rank,
    rank_imbalance,
    profiler_too_costly,
    compile_not_effective,
    communication_bound,
    host_overhead,
    hidden_communication,
    backend_comparison,
    contended,
    low_gpu_utilisation,
    gpu_throttled,
)
# profiler_memory's rules (scopebench.report.memory_rules).
RULES += (memory_rules.fragmentation, memory_rules.memory_creep, memory_rules.memory_rank_imbalance)
RULES += (memory_rules.sharding_does_not_pay,)
#: Rules whose lines inform rather than name a problem: alone, they leave the ``no-problem`` line.
INFORMATIONAL = frozenset({"hidden-communication"})


def diagnose(config: Configuration, others: list[Configuration]) -> list[Finding]:
    """Findings of every rule for one configuration, or one ``no-problem`` / ``no-data`` line
    (``no-problem`` after the :data:`INFORMATIONAL` lines when only those fired)."""
    if config.recorded.empty:
        return [Finding("no-data", config.label, "no profiled iterations, nothing to diagnose")]
    findings = [f for rule in RULES for f in rule(config, others)]
    if all(f.rule in INFORMATIONAL for f in findings):
        findings.append(Finding("no-problem", config.label, f"no problem found ({len(RULES)} rules checked)"))
    return findings


def diagnose_all(configs: list[Configuration]) -> list[Finding]:
    """:func:`diagnose` over every configuration (the others are its comparison set)."""
    return [f for config in configs for f in diagnose(config, configs)]
