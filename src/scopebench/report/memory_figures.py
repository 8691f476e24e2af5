"""Memory pictures: where the step's memory goes per configuration and rank, and memory against batch.

The data are plain lists, like :mod:`.figures`, drawn twice: matplotlib figures
(:func:`category_figure`, :func:`batch_figure`; :mod:`.plots` writes them as PNGs and
``scopebench find-max-batch --png`` draws its trials with the second) and plotly dicts
(:func:`category_plotly`, :func:`batch_plotly`; :mod:`.html`). Both read only
``profiler_memory``'s columns: results without them give no memory picture.

* :func:`category_bars`: the step's peak by category (``mem_<category>_mb``), one bar per
  configuration and rank (``mem_<category>_mb_rank<r>``; files without those: the worst
  rank's), at the recorded iteration with the largest peak, so each bar adds up to it;
* :func:`batch_fit`: the line ``peak = fixed + per_sample x batch`` through measured peaks
  (:func:`scopebench.stats.linear_fit`, :func:`~scopebench.stats.r_squared`) and the largest
  batch the line keeps within a device limit;
* :func:`batch_fits` (configurations that differ only by ``batch_size``) and
  :func:`trials_fit` (``find-max-batch``'s JSON) feed it.
"""

from __future__ import annotations

import math
from typing import Any

from scopebench import stats
from scopebench.profiler.memory import CATEGORIES
from scopebench.report.drawing import pyplot, short_label
from scopebench.report.figures import sweep_groups
from scopebench.report.results import Configuration

__all__ = [
    "CATEGORY_COLORS",
    "batch_figure",
    "batch_fit",
    "batch_fits",
    "batch_plotly",
    "category_bars",
    "category_figure",
    "category_plotly",
    "largest_on_line",
    "trials_fit",
]

#: One colour per category, the same in the PNG and the HTML.
CATEGORY_COLORS = dict(
    zip(CATEGORIES, ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#bab0ac"))
)
_LIMIT_COLOR = "#d62728"


def _rank_count(config: Configuration) -> int:
    """How many ranks report ``mem_<category>_mb_rank<r>`` (0: none, a file before them or one process)."""
    count = 0
    while config.has(f"mem_peak_mb_rank{count}") and any(config.has(f"mem_{k}_mb_rank{count}") for k in CATEGORIES):
        count += 1
    return count


def _bar(config: Configuration, peak: str, suffix: str) -> tuple[float, dict[str, float], Any]:
    """(peak, categories, row) at the recorded row where ``peak`` is largest."""
    rows = config.recorded[config.recorded[f"objective_{peak}"].notna()]
    row = rows.loc[rows[f"objective_{peak}"].astype(float).idxmax()]
    values = {}
    for key in CATEGORIES:
        value = row.get(f"objective_mem_{key}_mb{suffix}")
        values[key] = 0.0 if value is None or value != value else float(value)
    return float(row[f"objective_{peak}"]), values, row


def category_bars(configs: list[Configuration]) -> dict[str, Any] | None:
    """``{"labels", "configs", "ranks", "categories", "mb": {category: [per bar]}, "peak_mb"}``.

    One bar per configuration and rank (``ranks``: the rank, or None for one process or for
    the worst rank of a file without per-rank categories, its label saying which); categories
    in :data:`CATEGORIES` order, those zero in every bar left out.
    """
    bars: list[tuple[str, str, int | None, float, dict[str, float]]] = []
    for c in configs:
        if not c.has("mem_peak_mb"):
            continue
        ranks = _rank_count(c)
        if ranks:
            for r in range(ranks):
                peak, values, _ = _bar(c, f"mem_peak_mb_rank{r}", f"_rank{r}")
                bars.append((f"{c.label} · rank {r}", c.label, r, peak, values))
            continue
        peak, values, row = _bar(c, "mem_peak_mb", "")
        worst = row.get("objective_mem_worst_rank")
        several = worst is not None and worst == worst and c.has("mem_peak_mb_rank1")
        label = f"{c.label} · worst rank {int(worst)}" if several else c.label
        bars.append((label, c.label, None, peak, values))
    if not bars:
        return None
    categories = [k for k in CATEGORIES if any(b[4][k] > 0 for b in bars)]
    return {
        "labels": [b[0] for b in bars],
        "configs": [b[1] for b in bars],
        "ranks": [b[2] for b in bars],
        "categories": categories,
        "mb": {k: [b[4][k] for b in bars] for k in categories},
        "peak_mb": [b[3] for b in bars],
    }


def largest_on_line(fixed: float, per_sample: float, limit: float) -> int | None:
    """The largest batch ``b >= 0`` with ``fixed + per_sample x b <= limit`` (None when the
    line does not grow with the batch: it gives no limit).

    :Examples:
        >>> largest_on_line(10.0, 5.0, 40.0), largest_on_line(10.0, 5.0, 39.9), largest_on_line(50.0, 5.0, 40.0)
        (6, 5, 0)
    """
    if per_sample <= 0:
        return None
    if fixed > limit:
        return 0
    batch = math.floor((limit - fixed) / per_sample)
    return batch + 1 if fixed + per_sample * (batch + 1) <= limit else batch


def batch_fit(
    label: str,
    batch: list[float],
    mb: list[float],
    limit_mb: float | None = None,
    *,
    fits: list[bool] | None = None,
    oom_batches: list[int] = (),
    found_batch: int | None = None,
) -> dict[str, Any]:
    """Measured peaks against the batch, their line and what it reads at ``limit_mb``.

    Returns ``{"label", "batch", "mb", "fits", "oom_batches", "found_batch", "limit_mb",
    "fixed_mb", "per_sample_mb", "r2", "largest_batch"}``: the line (``None`` with fewer than
    two distinct batches), R², and :func:`largest_on_line` at the limit (``None`` without one).
    ``fits``, ``oom_batches`` (tried, no peak measured) and ``found_batch`` come from trials.
    """
    out: dict[str, Any] = {
        "label": label,
        "batch": list(batch),
        "mb": list(mb),
        "fits": list(fits) if fits is not None else None,
        "oom_batches": list(oom_batches),
        "found_batch": found_batch,
        "limit_mb": limit_mb,
        "fixed_mb": None,
        "per_sample_mb": None,
        "r2": None,
        "largest_batch": None,
    }
    if len(set(batch)) >= 2:
        out["fixed_mb"], out["per_sample_mb"] = stats.linear_fit(batch, mb)
        out["r2"] = stats.r_squared(batch, mb)
        if limit_mb is not None:
            out["largest_batch"] = largest_on_line(out["fixed_mb"], out["per_sample_mb"], limit_mb)
    return out


def batch_fits(configs: list[Configuration], limit_mb: float | None = None) -> list[dict[str, Any]]:
    """:func:`batch_fit` per group of configurations that differ only by ``batch_size``: each one's
    largest recorded step peak ``mem_peak_mb`` (the worst rank's) against its batch."""
    measured = [c for c in configs if c.has("mem_peak_mb")]

    def batch(c: Configuration) -> float | None:
        try:
            return None if c.param("batch_size") is None else float(c.param("batch_size"))
        except (TypeError, ValueError):
            return None

    return [
        batch_fit(group["label"], group["values"], [max(c.values("mem_peak_mb")) for c in group["configs"]], limit_mb)
        for group in sweep_groups(measured, batch, ignore={"batch_size"})
    ]


def trials_fit(payload: dict[str, Any]) -> dict[str, Any]:
    """:func:`batch_fit` of ``scopebench find-max-batch``'s JSON: its measured trials, the trials
    that ran out of memory, its limit (``limit_mb``) and the batch the trials found."""
    measured = [t for t in payload["trials"] if t.get("peak_mb") is not None]
    label = f"{payload.get('preset')} {payload.get('backend')} x{payload.get('world_size')}"
    return batch_fit(
        label,
        [t["batch"] for t in measured],
        [t["peak_mb"] for t in measured],
        payload.get("limit_mb"),
        fits=[bool(t["fits"]) for t in measured],
        oom_batches=[t["batch"] for t in payload["trials"] if t.get("peak_mb") is None],
        found_batch=payload.get("largest_batch"),
    )


def _line_name(f: dict[str, Any]) -> str:
    return (
        f"{f['fixed_mb']:.1f} + {f['per_sample_mb']:.2f} MiB x batch (R² {f['r2']:.3f}, {len(set(f['batch']))} batches)"
    )


def _line_end(f: dict[str, Any]) -> float:
    return max(f["batch"] + f["oom_batches"] + [(f["largest_batch"] or 0) + 1])


def _read_off(f: dict[str, Any]) -> str:
    text = f"largest batch on the line: {f['largest_batch']}" if f["largest_batch"] is not None else ""
    if f["found_batch"] is not None:
        text += ("; " if text else "") + f"found by trials: {f['found_batch']}"
    return text


# -- matplotlib -------------------------------------------------------------------------
def category_figure(data: dict[str, Any], title: str):
    """Horizontal stacked bars: one per configuration and rank, one segment per category (MiB)."""
    plt = pyplot()
    labels = [short_label(x) for x in data["labels"]]
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.45 * len(labels)), layout="constrained")
    left = [0.0] * len(labels)
    for key in data["categories"]:
        ax.barh(labels, data["mb"][key], left=left, label=key, color=CATEGORY_COLORS[key])
        left = [a + b for a, b in zip(left, data["mb"][key])]
    ax.invert_yaxis()
    ax.set_xlabel("MiB at the step's peak (the recorded iteration with the largest peak)")
    ax.set_title(f"{title}: memory by category per rank")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def batch_figure(fits: list[dict[str, Any]], title: str):
    """Measured peaks against the batch (hollow: did not fit; x: out of memory), their lines,
    the device limits and the largest batch read off each line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    for f in fits:
        fits_flags = f["fits"] or [True] * len(f["batch"])
        color = ax.plot([], [])[0].get_color()
        fit_points = [(b, m) for b, m, ok in zip(f["batch"], f["mb"], fits_flags) if ok]
        miss_points = [(b, m) for b, m, ok in zip(f["batch"], f["mb"], fits_flags) if not ok]
        if fit_points:
            ax.plot(*zip(*fit_points), "o", color=color, label=short_label(f["label"]))
        if miss_points:
            ax.plot(*zip(*miss_points), "o", mfc="none", color=color, label=f"{short_label(f['label'])}: does not fit")
        if f["per_sample_mb"] is not None:
            xs = [0.0, _line_end(f)]
            ax.plot(xs, [f["fixed_mb"] + f["per_sample_mb"] * x for x in xs], "--", color=color, label=_line_name(f))
        if f["limit_mb"] is not None:
            ax.axhline(f["limit_mb"], color=_LIMIT_COLOR, ls=":", label=f"limit {f['limit_mb']:.4g} MiB")
            if f["oom_batches"]:
                ax.plot(f["oom_batches"], [f["limit_mb"]] * len(f["oom_batches"]), "x", color=color, ms=9,
                        label=f"{short_label(f['label'])}: out of memory")  # fmt: skip
        if f["largest_batch"] is not None:
            ax.axvline(f["largest_batch"], color=color, ls="-.", lw=1, label=_read_off(f))
        elif f["found_batch"] is not None:
            ax.plot([], [], " ", label=_read_off(f))
    ax.set_xlabel("batch size (per rank)")
    ax.set_ylabel("step peak (MiB, worst rank)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}: memory against batch size")
    ax.legend(fontsize=7)
    return fig


# -- plotly -----------------------------------------------------------------------------
def category_plotly(data: dict[str, Any], title: str) -> dict[str, Any]:
    traces = [
        {"type": "bar", "orientation": "h", "y": data["labels"], "x": data["mb"][key], "name": key,
         "marker": {"color": CATEGORY_COLORS[key]}}  # fmt: skip
        for key in data["categories"]
    ]
    layout = {
        "barmode": "stack",
        "title": {"text": f"{title}: memory by category per rank (MiB at the step's peak)"},
        "yaxis": {"autorange": "reversed", "automargin": True},
        "xaxis": {"title": {"text": "MiB (the recorded iteration with the largest peak)"}},
        "legend": {"traceorder": "normal"},
        "height": 200 + 40 * len(data["labels"]),
    }
    return {"data": traces, "layout": layout}


def batch_plotly(fits: list[dict[str, Any]], title: str) -> dict[str, Any]:
    traces: list[dict[str, Any]] = []
    for f in fits:
        group = {"legendgroup": f["label"], "showlegend": True}
        flags = f["fits"] or [True] * len(f["batch"])
        symbols = ["circle" if ok else "circle-open" for ok in flags]
        traces.append({"type": "scatter", "mode": "markers", "x": f["batch"], "y": f["mb"], "name": f["label"],
                       "marker": {"symbol": symbols, "size": 9}, **group})  # fmt: skip
        if f["per_sample_mb"] is not None:
            end = _line_end(f)
            traces.append({"type": "scatter", "mode": "lines", "x": [0, end], "line": {"dash": "dash"},
                           "y": [f["fixed_mb"], f["fixed_mb"] + f["per_sample_mb"] * end], "name": _line_name(f),
                           **group})  # fmt: skip
        if f["limit_mb"] is not None:
            end = _line_end(f)
            traces.append({"type": "scatter", "mode": "lines", "x": [0, end], "y": [f["limit_mb"]] * 2,
                           "line": {"dash": "dot", "color": _LIMIT_COLOR},
                           "name": f"limit {f['limit_mb']:.4g} MiB"})  # fmt: skip
            if f["oom_batches"]:
                traces.append({"type": "scatter", "mode": "markers", "x": f["oom_batches"],
                               "y": [f["limit_mb"]] * len(f["oom_batches"]), "marker": {"symbol": "x", "size": 10},
                               "name": f"{f['label']}: out of memory", **group})  # fmt: skip
        if f["largest_batch"] is not None:
            top = max(f["mb"] + [f["limit_mb"] or 0.0])
            traces.append({"type": "scatter", "mode": "lines", "x": [f["largest_batch"]] * 2, "y": [0, top],
                           "line": {"dash": "dashdot", "width": 1}, "name": _read_off(f), **group})  # fmt: skip
    layout = {
        "title": {"text": f"{title}: memory against batch size (line: least squares; limit: device memory)"},
        "xaxis": {"title": {"text": "batch size (per rank)"}, "rangemode": "tozero"},
        "yaxis": {"title": {"text": "step peak (MiB, worst rank)"}, "rangemode": "tozero"},
    }
    return {"data": traces, "layout": layout}
