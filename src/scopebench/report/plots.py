"""PNG pictures of a benchmark's results (matplotlib, Agg backend, no display needed).

One file per picture and benchmark, ``<benchmark>_<picture>.png``; a picture that does not
apply to the results (no process sweep, no inference configuration...) is not written.
The same figures, as RGB arrays, fill BenchOpt's ``image`` plots (:func:`figure_to_rgb`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from scopebench.atomic import atomic_write
from scopebench.report import figures, memory_figures
from scopebench.report.drawing import pyplot, short_label
from scopebench.report.results import Configuration

__all__ = ["PICTURES", "figure_to_rgb", "save_png", "stacked_figure", "timeline_figure", "write_pngs"]

#: Picture name -> what it shows (the PNG is ``<benchmark>_<name>.png``).
PICTURES = {
    "regions": "mean time per region, stacked, per configuration (the bar is the step without the callback)",
    "step_time": "step time per iteration, with benchopt's time per iteration (warm-up included)",
    "metrics": "quality metrics (loss, PSNR...) per iteration",
    "scaling": "throughput speed-up and parallel efficiency against processes, with the ideal line",
    "latency": "latency histogram and empirical CDF per inference configuration",
    "latency_fit": "median latency against num_steps with the fit L(N) = F + N*s",
    "memory": "peak memory against batch size or image size",
    "memory_categories": "profiler_memory: the step's peak by category, stacked, per configuration and rank",
    "memory_batch": "profiler_memory: step peak against batch size, its line, the device limit and the largest batch",
    "timeline": "several ranks: each rank's regions, collectives and blocked intervals over the first recorded "
    "iterations, one PNG per configuration (``<benchmark>_timeline_<configuration>.png``)",
}
#: Colours of a timeline's collectives and of its late rank's lane name (the regions':
#: :data:`figures.TIMELINE_COLORS`), in the PNG and the HTML.
COLLECTIVE_COLOR = "#333333"
LATE_COLOR = "#d62728"


def slug(name: str) -> str:
    """A file-name-safe form of a benchmark name.

    :Examples:
        >>> slug("Imaging inference")
        'imaging_inference'
    """
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "benchmark"


def stacked_figure(data: dict[str, Any], title: str = ""):
    """Horizontal stacked bars: one per configuration, one segment per region (ms)."""
    plt = pyplot()
    labels = [short_label(x) for x in data["labels"]]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * len(labels)), layout="constrained")
    left = [0.0] * len(labels)
    cmap = plt.get_cmap("tab20")
    for i, region in enumerate(data["regions"]):
        values = data["ms"][region]
        color = "#bbbbbb" if region == "untracked" else cmap(i % 20)
        ax.barh(labels, values, left=left, label=region, color=color)
        left = [a + b for a, b in zip(left, values)]
    ax.invert_yaxis()
    ax.set_xlabel("mean time per iteration (ms), scoring callback excluded")
    ax.set_title(title or "where the step goes")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def figure_to_rgb(fig):
    """An RGB float array in [0, 1] (no alpha channel) of a figure, which is then closed."""
    import numpy as np

    plt = pyplot()
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    plt.close(fig)
    return rgba[..., :3].astype(np.float32) / 255.0


def _step_figure(series: list[dict[str, Any]], title: str):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")
    cmap = plt.get_cmap("tab10")
    for i, s in enumerate(series):
        color = cmap(i % 10)
        if s["step_ms"]:
            ax.plot(s["iteration"], s["step_ms"], marker="o", ms=3, color=color, label=short_label(s["label"]))
        if s["wall_ms"]:
            ax.plot(s["wall_iteration"], s["wall_ms"], ls=":", color=color, alpha=0.8)
    ax.set_xlabel("iteration")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(f"{title}: step time per iteration")
    if len(series) > 6:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        ax.legend(fontsize=7)
    ax.text(0.0, -0.12, "solid: profiler step (callback excluded); dotted: benchopt time per iteration, warm-up included",
            transform=ax.transAxes, fontsize=8, va="top")  # fmt: skip
    return fig


def _metrics_figure(metrics: dict[str, list[dict[str, Any]]], title: str):
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False, layout="constrained")
    for ax, (name, lines) in zip(axes[0], metrics.items()):
        for line in lines:
            ax.plot(line["x"], line["y"], label=short_label(line["label"]))
        ax.set_xlabel("iteration (stop_val)")
        ax.set_title(name)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return fig


def _scaling_figure(groups: list[dict[str, Any]], title: str):
    plt = pyplot()
    fig, (ax, ax_eff) = plt.subplots(1, 2, figsize=(11, 4.5), layout="constrained")
    top = max(max(g["ranks"]) for g in groups)
    low = min(min(g["ranks"]) for g in groups)
    for g in groups:
        ax.plot(g["ranks"], g["speedup"], marker="o", label=short_label(g["label"]))
        ax_eff.plot(g["ranks"], [e * 100 for e in g["efficiency"]], marker="o", label=short_label(g["label"]))
    ax.plot([low, top], [1.0, top / low], "k--", label="ideal")
    ax_eff.axhline(100.0, color="k", ls="--", label="ideal")
    ax.set_xlabel("processes")
    ax.set_ylabel(f"speed-up ({groups[0]['unit']})")
    ax_eff.set_xlabel("processes")
    ax_eff.set_ylabel("parallel efficiency (%)")
    ax.legend(fontsize=7)
    fig.suptitle(f"{title}: scaling")
    return fig


def _latency_figure(series: list[dict[str, Any]], title: str):
    plt = pyplot()
    fig, (ax, ax_cdf) = plt.subplots(1, 2, figsize=(11, 4.5), layout="constrained")
    for s in series:
        ax.hist(s["ms"], bins=min(30, max(5, len(s["ms"]) // 2)), alpha=0.5, label=short_label(s["label"]))
        ordered = sorted(s["ms"])
        line = ax_cdf.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post")[0]
        if s.get("deadline_ms") is not None:  # the control loop's deadline (Pi05Inference with control_hz)
            for axis in (ax, ax_cdf):
                axis.axvline(s["deadline_ms"], color=line.get_color(), linestyle="--", linewidth=1)
            ax.annotate(
                f"deadline {s['deadline_ms']:.1f} ms",
                (s["deadline_ms"], 1),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                rotation=90,
                va="top",
                ha="right",
            )
    ax.set_xlabel("latency per call (ms)")
    ax.set_ylabel("calls")
    ax_cdf.set_xlabel("latency per call (ms)")
    ax_cdf.set_ylabel("fraction of calls")
    ax.legend(fontsize=7)
    fig.suptitle(f"{title}: latency")
    return fig


def _fit_figure(fits: list[dict[str, Any]], title: str):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for f in fits:
        line = ax.plot(f["num_steps"], f["ms"], "o", label=short_label(f["label"]))[0]
        xs = [0, max(f["num_steps"])]
        ax.plot(xs, [f["F_ms"] + x * f["s_ms"] for x in xs], "--", color=line.get_color(),
                label=f"L(N) = {f['F_ms']:.2f} + N x {f['s_ms']:.3f} ms")  # fmt: skip
    ax.set_xlabel("num_steps (N)")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"{title}: latency model")
    ax.legend(fontsize=7)
    return fig


def _memory_figure(groups: list[dict[str, Any]], title: str):
    plt = pyplot()
    params = sorted({g["param"] for g in groups})
    fig, axes = plt.subplots(1, len(params), figsize=(6 * len(params), 4.5), squeeze=False, layout="constrained")
    for ax, param in zip(axes[0], params):
        for g in (g for g in groups if g["param"] == param):
            ax.plot(g["x"], g["mb"], marker="o", label=short_label(g["label"]))
            ax.set_ylabel(g["unit"])
        ax.set_xlabel(param)
        ax.legend(fontsize=7)
    fig.suptitle(f"{title}: peak memory")
    return fig


def timeline_figure(data: dict[str, Any], title: str):
    """Swimlanes of :func:`figures.rank_timeline`: one lane per rank (rank 0 on top), its region
    spans as coloured bars, its blocked intervals hatched over them, its collectives (issue to
    completion) as thin bars beneath, the iterations side by side."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = pyplot()
    ranks = data["ranks"]
    lane = {r: k for k, r in enumerate(ranks)}
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.8 * len(ranks)), layout="constrained")
    for rank in ranks:
        y = lane[rank]
        for region in data["regions"]:
            bars = [(s["start_ms"], s["end_ms"] - s["start_ms"]) for s in data["spans"]
                    if s["rank"] == rank and s["region"] == region]  # fmt: skip
            ax.broken_barh(bars, (y - 0.4, 0.5), facecolors=data["colors"][region])
        waits = [(w["start_ms"], w["end_ms"] - w["start_ms"]) for w in data["waits"] if w["rank"] == rank]
        ax.broken_barh(waits, (y - 0.4, 0.5), facecolors="none", edgecolors="black", hatch="////", linewidth=0)
        mine = [c for c in data["collectives"] if c["rank"] == rank]
        done = [(c["issue_ms"], c["done_ms"] - c["issue_ms"]) for c in mine if c["done_ms"] is not None]
        ax.broken_barh(done, (y + 0.15, 0.2), facecolors=COLLECTIVE_COLOR, alpha=0.7)
        pending = [c["issue_ms"] for c in mine if c["done_ms"] is None]
        ax.plot(pending, [y + 0.25] * len(pending), "|", color=COLLECTIVE_COLOR, ms=8)
    for it in data["iterations"]:
        ax.text(it["offset_ms"] + it["length_ms"] / 2, -0.7, f"iteration {it['iteration']}", ha="center", fontsize=8)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" + (" (late)" if r == data["late_rank"] else "") for r in ranks])
    for tick, rank in zip(ax.get_yticklabels(), ranks):
        if rank == data["late_rank"]:
            tick.set_color(LATE_COLOR)
    ax.set_ylim(len(ranks) - 0.5, -1.0)
    ax.set_xlim(0, data["end_ms"] * 1.01 or 1.0)
    ax.set_xlabel("time (ms): each iteration from its earliest rank's step start, iterations side by side")
    heading = f"{title}: per-rank timeline of {short_label(data['label'])}"
    ax.set_title(heading + (f"\n{data['subtitle']}" if data["subtitle"] else ""), fontsize=10)
    handles = [Patch(facecolor=data["colors"][r], label=r) for r in data["regions"]]
    handles += [Patch(facecolor="none", edgecolor="black", hatch="////", label="blocked in a collective"),
                Patch(facecolor=COLLECTIVE_COLOR, alpha=0.7, label="collective: issue to completion")]  # fmt: skip
    if any(c["done_ms"] is None for c in data["collectives"]):
        handles.append(Line2D([], [], ls="", marker="|", color=COLLECTIVE_COLOR, label="collective: completion unseen"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def benchmark_figures(configs: list[Configuration], title: str, memory_limit_mb: float | None = None) -> dict[str, Any]:
    """Picture name -> matplotlib figure, for the pictures that apply to these configurations
    (``memory_limit_mb``: the device limit drawn on memory against batch size)."""
    out = {}
    data = figures.stacked_regions(configs)
    if data:
        out["regions"] = stacked_figure(data, f"{title}: where the step goes")
    steps = figures.step_series(configs)
    if steps:
        out["step_time"] = _step_figure(steps, title)
    metrics = figures.metric_series(configs)
    if metrics:
        out["metrics"] = _metrics_figure(metrics, title)
    builders = (
        ("scaling", figures.scaling_groups, _scaling_figure),
        ("latency", figures.latency_series, _latency_figure),
        ("latency_fit", figures.latency_fits, _fit_figure),
        ("memory", figures.memory_groups, _memory_figure),
    )
    for name, compute, draw in builders:
        found = compute(configs)
        if found:
            out[name] = draw(found, title)
    categories = memory_figures.category_bars(configs)
    if categories:
        out["memory_categories"] = memory_figures.category_figure(categories, title)
    fits = memory_figures.batch_fits(configs, memory_limit_mb)
    if fits:
        out["memory_batch"] = memory_figures.batch_figure(fits, title)
    for timeline in figures.rank_timelines(configs):
        name = base = f"timeline_{slug(timeline['label'])}"
        k = 2
        while name in out:  # two labels with the same slug
            name, k = f"{base}_{k}", k + 1
        out[name] = timeline_figure(timeline, title)
    return out


def save_png(fig, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (atomically) and close it."""
    plt = pyplot()
    path = Path(path)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=90)
    plt.close(fig)
    return path


def write_pngs(
    configs: list[Configuration], title: str, out_dir: str | Path, memory_limit_mb: float | None = None
) -> list[Path]:
    """Write one benchmark's PNGs into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    paths = []
    for name, fig in benchmark_figures(configs, title, memory_limit_mb).items():
        paths.append(save_png(fig, out_dir / f"{slug(title)}_{name}.png"))
    return paths
