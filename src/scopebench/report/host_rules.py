"""Diagnosis rules about the machine, not the solver: ``contended``, ``low-gpu-utilisation``,
``gpu-throttled`` (docs/diagnosis.md), part of :data:`scopebench.report.diagnosis.RULES`.

They read the host sampler's columns (:mod:`scopebench.profiler.sampler`): the CPU share
other processes took and steal (through :mod:`scopebench.report.contention`), and on CUDA
the GPU's utilisation, SM clock and throttle reasons. ``low-gpu-utilisation`` names the
likely cause from the phase table: input-bound (``dataload_wait``), synchronisation
(``sync_gather``), distributed waits (communication or rank skew) and, when none of those
explains the idle GPU, host-bound (the CPU does not launch work fast enough). Without the
columns (a CPU run, no NVML, the sampler off) the rules stay silent.
"""

from __future__ import annotations

from scopebench import stats
from scopebench.report.contention import OTHER_CPU_PCT, STEAL_PCT, contention, iteration_ranges
from scopebench.report.findings import INPUT_WAIT_PCT, SKEW_PCT, SYNC_PCT, Finding, metric_median, step_share_pct
from scopebench.report.results import Configuration

__all__ = ["GPU_CLOCK_PCT", "LOW_GPU_UTIL_PCT", "contended", "gpu_throttled", "low_gpu_utilisation"]

#: low GPU utilisation: median ``gpu_util_pct`` below this (%), on CUDA.
LOW_GPU_UTIL_PCT = 70.0
#: distributed waits: communication (``<region>_comm_sec``) above this share of the step (%).
DIST_WAIT_PCT = 10.0
#: GPU throttled: median SM clock below this share of its maximum (%) while the GPU is busy.
GPU_CLOCK_PCT = 80.0


def contended(config: Configuration, others: list[Configuration]) -> list[Finding]:
    found = contention(config)
    if found is None or not found.contended:
        return []
    return [
        Finding(
            "contended",
            config.label,
            f"{found.text()} (contended above {OTHER_CPU_PCT:g}% other or {STEAL_PCT:g}% steal): "
            "these times include other processes' work, not only this configuration's",
            "rerun on an idle machine or dedicated cores (scopebench info --host shows the load), and compare "
            "only runs measured under the same contention",
        )
    ]


def _gpu_idle_causes(config: Configuration) -> list[tuple[float, str]]:
    """(share %, cause) of what the phase table says keeps the GPU waiting, largest first."""
    causes = []
    share = step_share_pct(config, "dataload_wait")
    if share is not None and share > INPUT_WAIT_PCT:
        causes.append((share, f"input-bound: dataload_wait is {share:.1f}% of the step"))
    share = step_share_pct(config, "sync_gather")
    if share is not None and share > SYNC_PCT:
        causes.append((share, f"synchronisation: sync_gather is {share:.1f}% of the step"))
    if config.ranks() > 1:
        step = config.step_values()
        comm = [stats.mean(config.values(f"{r}_comm_sec")) for r in config.regions if config.values(f"{r}_comm_sec")]
        share = sum(comm) / stats.mean(step) * 100.0 if comm and step and stats.mean(step) > 0 else None
        skew = metric_median(config, "rank_skew_pct")
        if share is not None and share > DIST_WAIT_PCT:
            causes.append((share, f"distributed waits: communication is {share:.1f}% of the step"))
        elif skew is not None and skew > SKEW_PCT:
            causes.append((skew, f"distributed waits: ranks wait for the slowest (step skew {skew:.1f}%)"))
    return sorted(causes, reverse=True)


def low_gpu_utilisation(config: Configuration, others: list[Configuration]) -> list[Finding]:
    util = metric_median(config, "gpu_util_pct")
    if util is None or util >= LOW_GPU_UTIL_PCT:
        return []
    causes = _gpu_idle_causes(config)
    if causes:
        cause = "likely cause: " + "; ".join(text for _, text in causes)
        advice = "remove the wait the phase table names first (see the matching input-bound / host-sync-bound / "
        advice += "rank-imbalance line), then measure again"
    else:
        cpu = [stats.mean(config.values(f"{r}_cpu_sec")) for r in config.regions if config.values(f"{r}_cpu_sec")]
        step = config.step_values()
        busy = (
            f" (CPU time of the regions {sum(cpu) / stats.mean(step) * 100.0:.0f}% of the step)" if cpu and step else ""
        )
        cause = (
            "likely cause: host-bound: no input, synchronisation or distributed wait explains the idle GPU, so the "
            f"CPU does not launch work fast enough (short kernels, Python overhead){busy}"
        )
        advice = "larger batches, torch.compile or CUDA graphs (compile_mode), fewer small ops per step"
    return [
        Finding(
            "low-gpu-utilisation",
            config.label,
            f"GPU utilisation median {util:.0f}% (< {LOW_GPU_UTIL_PCT:g}%); {cause}",
            advice,
        )
    ]


def gpu_throttled(config: Configuration, others: list[Configuration]) -> list[Finding]:
    from scopebench.profiler.sampler import throttle_names

    rows = config.recorded
    column = "objective_gpu_throttle"
    bits: dict[str, list[int]] = {}
    if column in rows.columns:
        for stop, mask in zip(rows["stop_val"], rows[column]):
            if mask == mask:  # not NaN
                for name in throttle_names(int(mask)):
                    bits.setdefault(name, []).append(int(stop) - 1)
    parts = [f"{name} in {len(its)} iteration(s) ({iteration_ranges(its)})" for name, its in bits.items()]
    clock, top = metric_median(config, "gpu_sm_clock_mhz"), metric_median(config, "gpu_sm_clock_max_mhz")
    util = metric_median(config, "gpu_util_pct")
    slow_clock = clock is not None and top and util is not None and util >= LOW_GPU_UTIL_PCT
    slow_clock = slow_clock and clock / top * 100.0 < GPU_CLOCK_PCT
    if not parts and not slow_clock:
        return []
    facts = (
        [f"SM clock median {clock:.0f} MHz = {clock / top * 100.0:.0f}% of its max {top:.0f} MHz"]
        if clock and top
        else []
    )
    for metric, text in (("gpu_temp_c", "temperature max {:.0f} C"), ("gpu_power_w", "power median {:.0f} W")):
        values = config.values(metric)
        if values:
            facts.append(text.format(max(values) if metric == "gpu_temp_c" else stats.median(values)))
    reasons = (
        "throttle reasons " + ", ".join(parts)
        if parts
        else f"no throttle reason reported but SM clock < {GPU_CLOCK_PCT:g}% of max"
    )
    return [
        Finding(
            "gpu-throttled",
            config.label,
            "; ".join([reasons, *facts]),
            "the GPU ran below its clocks: check cooling and power limits (scopebench info --host: power limit, "
            "clocks), another job on the GPU, or an applications-clock setting; times from this run are slower than "
            "the hardware can do",
        )
    ]
