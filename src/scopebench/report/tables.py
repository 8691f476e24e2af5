"""Phase tables: the numbers ``scopebench summary`` prints and ``scopebench report`` writes.

Per configuration and phase: count, mean, median, p95 and p99 (milliseconds, statistics of
:mod:`scopebench.stats`) and the **share of the step**, where the step is one iteration
without the benchopt scoring callback (``step_time_sec``, the profiler's
``total_time_sec - callback_time_sec`` and the time ``samples_per_sec`` divides by). The callback gets its own line, outside the step; so does
``total_time_sec`` (step + callback). Composite phases (``backward_step``) show their
share too but are sums of regions, so shares need not add up to 100 %.

Text layout follows ``profile_step``: one block per configuration, ``phase mean= median=
p95= share``, a header with the window (warm-up, measured iterations, ranks) and how busy
the machine was (``host load:``, or ``CONTENDED:`` when other processes or steal took more
than :mod:`scopebench.report.contention` allows: those times are not the configuration's
alone), what the profiler cost (``profiler cost:``, :mod:`scopebench.report.cost`) and, by kind
of configuration, a throughput line (training step: steps/s and global samples/s), a
latency line (inference: mean / p50 / p95 / p99 per call) or the dataloader ceiling.
"""

from __future__ import annotations

from typing import Any

from scopebench import stats
from scopebench.report.contention import contention, contention_line
from scopebench.report.cost import ProfilerCost, profiler_cost
from scopebench.report.results import Configuration, step_times

__all__ = [
    "PROFILE_STEP_ORDER",
    "ProfilerCost",
    "config_kind",
    "phase_rows",
    "format_config",
    "format_tables",
    "profiler_cost",
    "throughput",
]

#: Phase order of the policy training step (the reference ``profile_step`` table); other regions follow in reported order.
PROFILE_STEP_ORDER = (
    "dataload_wait",
    "forward",
    "bwd",
    "unscale_clip",
    "optim_step",
    "zero_grad_sched",
    "backward_step",
    "sync_gather",
)
_LATENCY_SOLVERS = ("Pi05Inference", "Denoiser")


def config_kind(config: Configuration) -> str:
    """``training_step``, ``dataloader``, ``latency`` or ``iterative``, from the configuration's columns.

    A training step has a ``dataload_wait`` or a ``bwd`` region; a dataloader has a
    ``fetch`` region or ``batches_per_sec``; an inference call (latency) has a
    ``first_call_ratio``, a ``prefill`` region or is a ``Pi05Inference`` / ``Denoiser``
    solver; everything else is an iterative solver.
    """
    regions = set(config.regions)
    if "dataload_wait" in regions or "bwd" in regions:
        return "training_step"
    if "fetch" in regions or config.has("batches_per_sec"):
        return "dataloader"
    if config.has("first_call_ratio") or "prefill" in regions or config.solver_base in _LATENCY_SOLVERS:
        return "latency"
    return "iterative"


def _ordered_phases(config: Configuration) -> list[str]:
    names = list(config.regions) + list(config.composites)
    known = len(PROFILE_STEP_ORDER)
    return sorted(
        names, key=lambda n: PROFILE_STEP_ORDER.index(n) if n in PROFILE_STEP_ORDER else known + names.index(n)
    )


def _row(config: Configuration, phase: str, kind: str, values: list[float], step_mean: float | None) -> dict[str, Any]:
    # No stats.summarize here: its Student-t interval needs scipy (1.5 s to import), tables do not show it.
    mean = stats.mean(values)
    share = mean / step_mean * 100.0 if step_mean and kind in ("region", "composite", "untracked", "step") else None
    return {
        "benchmark": config.benchmark,
        "dataset": config.dataset,
        "solver": config.label,
        "solver_name": config.solver,
        "phase": phase,
        "kind": kind,
        "n": len(values),
        "mean_ms": mean * 1e3,
        "median_ms": stats.median(values) * 1e3,
        "p95_ms": stats.percentile(values, 95.0) * 1e3,
        "p99_ms": stats.percentile(values, 99.0) * 1e3,
        "share_pct": share,
    }


def phase_rows(config: Configuration) -> list[dict[str, Any]]:
    """The phase table of one configuration (empty when no iteration was recorded).

    Row ``kind`` is ``region``, ``composite``, ``untracked``, ``step`` (share 100 %),
    ``callback`` or ``total`` (no share: outside the step).
    """
    if "phase_rows" in config.cache:
        return config.cache["phase_rows"]
    if config.recorded.empty:
        return []
    step = config.step_values()
    step_mean = stats.mean(step)
    rows = []
    for phase in _ordered_phases(config):
        values = config.region_values(phase)
        if values:
            kind = "composite" if phase in config.composites else "region"
            rows.append(_row(config, phase, kind, values, step_mean))
    for phase, kind in (("untracked", "untracked"),):
        values = config.values(f"{phase}_time_sec")
        if values:
            rows.append(_row(config, phase, kind, values, step_mean))
    rows.append(_row(config, "step", "step", step, step_mean))
    for phase in ("callback", "total"):
        values = config.values(f"{phase}_time_sec")
        if values:
            rows.append(_row(config, phase, phase, values, step_mean))
    config.cache["phase_rows"] = rows
    return rows


def throughput(config: Configuration) -> dict[str, float]:
    """Rates of a configuration from its mean step: ``steps_per_sec`` and, where reported, ``samples_per_sec``.

    ``samples_per_sec = batch / mean step``, with the batch recovered from the solver's
    per-iteration ``samples_per_sec × step`` (the global batch for the policy benchmark).
    """
    step = config.step_values()
    if not step:
        return {}
    mean_step = stats.mean(step)
    out = {"steps_per_sec": 1.0 / mean_step}
    rec = config.recorded
    if "objective_samples_per_sec" in rec.columns:
        both = rec[rec["objective_samples_per_sec"].notna()]
        if not both.empty:
            steps = step_times(both)
            batch = stats.median((both["objective_samples_per_sec"] * steps).tolist())
            out["samples_per_sec"] = batch / mean_step
    return out


def _plain(value: Any) -> Any:
    """``4`` for a parameter pandas stored as ``4.0`` (an integer column with gaps)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _fmt_ms(value: float) -> str:
    return f"{value:9.3f}ms"


def _header(config: Configuration, kind: str) -> list[str]:
    lines = [f"=== {config.label} ({config.benchmark}; {config.dataset}) ==="]
    if config.recorded.empty:
        lines.append(
            f"no profiled iterations: {len(config.rows)} rows, none inside the profiler window "
            f"(profiler_mode={config.param('profiler_mode')}, warm-up {config.param('profiler_warmup')})"
        )
        return lines
    warmup = config.param("profiler_warmup")
    lines.append(
        f"warmup={warmup if warmup is not None else '?'} measured={len(config.recorded)} ranks={config.ranks()}"
    )
    facts = [
        f"{k}={_plain(config.param(k))}"
        for k in ("batch_size", "num_workers", "backend")
        if config.param(k) is not None
    ]
    if facts:
        lines.append(" ".join(facts))
    wall = stats.mean(config.values("total_time_sec")) * len(config.recorded)
    lines.append(f"wall-clock over the measured iterations (callback included): {wall:.3f}s")
    host = contention(config)  # how busy the machine was (the host sampler's columns)
    if host is not None:
        lines.append(contention_line(host))
    cost = profiler_cost(config)
    if cost is not None:
        lines.append(cost.text())
    return lines


def format_config(config: Configuration) -> str:
    """One configuration's block of text (header, phase lines, kind-specific summary)."""
    kind = config_kind(config)
    lines = _header(config, kind)
    rows = phase_rows(config)
    if not rows:
        return "\n".join(lines)
    width = max(16, *(len(r["phase"]) + 1 for r in rows))
    lines.append(f"{'phase':<{width}} {'stats':<64} share")
    lines.append("-" * (width + 71))
    for r in rows:
        share = {
            "step": "100.0%  <-- step (without the scoring callback)",
            "callback": "  n/a   scoring callback, outside the step",
            "total": "  n/a   step + callback",
        }.get(r["kind"], f"{r['share_pct']:5.1f}%" if r["share_pct"] is not None else "")
        lines.append(
            f"{r['phase']:<{width}} mean={_fmt_ms(r['mean_ms'])}  median={_fmt_ms(r['median_ms'])}  "
            f"p95={_fmt_ms(r['p95_ms'])}      {share}"
        )
    rate = throughput(config)
    if kind == "training_step":
        samples = f", {rate['samples_per_sec']:.1f} global samples/s" if "samples_per_sec" in rate else ""
        lines.append(f"throughput: {rate['steps_per_sec']:.2f} steps/s{samples}")
    elif kind == "dataloader":
        parts = []
        for metric, unit in (("batches_per_sec", "batches/s"), ("samples_per_sec", "samples/s")):
            values = config.values(metric)
            if values:
                parts.append(f"{stats.median(values):.1f} {unit}")
        if parts:
            lines.append("dataloader ceiling (no model, median): " + ", ".join(parts))
    elif kind == "latency":
        ms = [v * 1e3 for v in config.step_values()]
        lines.append(
            f"latency per call (n={len(ms)}): mean={stats.mean(ms):.3f}ms  p50={stats.median(ms):.3f}ms  "
            f"p95={stats.percentile(ms, 95.0):.3f}ms  p99={stats.percentile(ms, 99.0):.3f}ms"
        )
        for metric, text in (
            ("first_call_ratio", "first call / steady state: {:.2f}x"),
            ("compile_time_sec", "compile: {:.3f}s"),
        ):
            values = config.facts(metric)
            if values:
                lines.append(text.format(stats.median(values)))
    else:
        lines.append(f"throughput: {rate['steps_per_sec']:.2f} iterations/s")
    return "\n".join(lines)


def format_tables(configs: list[Configuration]) -> str:
    """All configurations' blocks, separated by blank lines."""
    if not configs:
        return "no configurations in these results"
    return "\n\n".join(format_config(c) for c in configs)
