"""The data behind every picture, drawn twice: PNG (:mod:`.plots`) and plotly (:mod:`.html`).

Each function takes the configurations of one benchmark and returns plain lists (or
``None`` / ``[]`` when the picture does not apply, e.g. no sweep over processes):

* :func:`stacked_regions`: mean time of each region per configuration, the rest of the
  step as ``untracked``, so each bar is the mean step (``step_time_sec``: callback excluded);
* :func:`step_series`: step time (``step_time_sec``) per recorded iteration, and benchopt's own time per
  iteration for every iteration (differences of its ``time`` column: warm-up included);
* :func:`metric_series`: quality columns (loss, PSNR, SSIM, MSE...) per iteration;
* :func:`scaling_groups`: throughput speed-up and parallel efficiency against processes
  for configurations that differ only in their number of processes;
* :func:`latency_series` and :func:`latency_fits` (``L(N) = F + N·s`` over ``num_steps``);
* :func:`memory_groups`: peak memory against ``batch_size`` or the dataset's ``image_size``;
* :func:`rank_timelines`: per multi-rank configuration, every rank's regions, collectives and
  blocked intervals over the first recorded iterations (``ledger_timeline``), side by side.
"""

from __future__ import annotations

import json
from typing import Any

from scopebench import stats
from scopebench.report.ledger import config_late_rank
from scopebench.report.results import LAYOUT_PARAMS, Configuration, short_labels
from scopebench.report.tables import config_kind, throughput

__all__ = [
    "QUALITY_WORDS",
    "TIMELINE_COLORS",
    "TIMELINE_GAP_SHARE",
    "latency_fits",
    "latency_series",
    "memory_groups",
    "metric_series",
    "rank_timeline",
    "rank_timelines",
    "scaling_groups",
    "stacked_regions",
    "step_series",
    "sweep_groups",
]

#: A numeric ``objective_*`` column whose name holds one of these words is a quality metric.
QUALITY_WORDS = ("loss", "psnr", "ssim", "mse", "error", "accuracy")
_UNIT_SUFFIXES = ("_sec", "_mb", "_pct", "_per_sec", "_rank", "_ratio")
_MAX_METRICS = 4


def stacked_regions(configs: list[Configuration]) -> dict[str, Any] | None:
    """``{"labels", "regions", "ms": {region: [per label]}, "step_ms", "callback_ms"}``."""
    profiled = [c for c in configs if not c.recorded.empty]
    if not profiled:
        return None
    regions: list[str] = []
    for c in profiled:
        regions += [r for r in c.regions if r not in regions]
    ms: dict[str, list[float]] = {r: [] for r in regions + ["untracked"]}
    step_ms, callback_ms = [], []
    for c in profiled:
        step = stats.mean(c.step_values()) * 1e3
        tracked = 0.0
        for r in regions:
            values = c.region_values(r) if r in c.regions else []
            value = stats.mean(values) * 1e3 if values else 0.0
            ms[r].append(value)
            tracked += value
        ms["untracked"].append(max(step - tracked, 0.0))
        step_ms.append(step)
        callback = c.values("callback_time_sec")
        callback_ms.append(stats.mean(callback) * 1e3 if callback else 0.0)
    return {
        "labels": [c.label for c in profiled],
        "regions": regions + ["untracked"],
        "ms": ms,
        "step_ms": step_ms,
        "callback_ms": callback_ms,
    }


def step_series(configs: list[Configuration]) -> list[dict[str, Any]]:
    """Per configuration: recorded ``iteration`` / ``step_ms``, and ``wall_iteration`` / ``wall_ms`` from benchopt's clock."""
    out = []
    for c in configs:
        series: dict[str, Any] = {"label": c.label, "iteration": [], "step_ms": [], "wall_iteration": [], "wall_ms": []}
        if not c.recorded.empty:
            series["iteration"] = c.iterations()
            series["step_ms"] = [v * 1e3 for v in c.step_values()]
        if "time" in c.rows.columns:
            reps = c.rows.groupby("idx_rep", sort=False) if "idx_rep" in c.rows.columns else [(0, c.rows)]
            for _, rep in reps:
                time = rep["time"].tolist()
                stop = rep["stop_val"].tolist()
                for k in range(1, len(time)):
                    series["wall_iteration"].append(int(stop[k]) - 1)
                    series["wall_ms"].append((time[k] - time[k - 1]) * 1e3)
        if series["step_ms"] or series["wall_ms"]:
            out.append(series)
    return out


def _quality_columns(configs: list[Configuration]) -> list[str]:
    import pandas as pd

    found: list[str] = []
    for c in configs:
        for column in c.rows.columns:
            name = column.removeprefix("objective_")
            if (
                column.startswith("objective_")
                and column != "objective_name"
                and any(w in name for w in QUALITY_WORDS)
                and not name.endswith(_UNIT_SUFFIXES)
                and pd.api.types.is_numeric_dtype(c.rows[column])
                and c.rows[column].notna().any()
                and column not in found
            ):
                found.append(column)
    if not found and any("objective_value" in c.rows.columns for c in configs):
        found = ["objective_value"]
    return found[:_MAX_METRICS]


def metric_series(configs: list[Configuration]) -> dict[str, list[dict[str, Any]]]:
    """``{metric: [{"label", "x": stop_val, "y"}]}`` for the quality metrics (at most four)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for column in _quality_columns(configs):
        lines = []
        for c in configs:
            if column not in c.rows.columns:
                continue
            rows = c.rows[c.rows[column].notna()]
            if not rows.empty:
                lines.append(
                    {"label": c.label, "x": rows["stop_val"].tolist(), "y": rows[column].astype(float).tolist()}
                )
        if lines:
            out[column.removeprefix("objective_")] = lines
    return out


def sweep_groups(configs: list[Configuration], value, ignore=frozenset()) -> list[dict[str, Any]]:
    """Configurations that differ only in ``value(config)`` (and the parameters in ``ignore``).

    Returns ``[{"label", "configs": [...] sorted by value, "values": [...]}]`` for groups
    with at least two distinct values; labels name what differs between groups.
    """
    groups: dict[tuple, list[Configuration]] = {}
    names: dict[tuple, str] = {}
    for c in configs:
        v = value(c)
        if v is None:
            continue
        params = {k: str(p) for k, p in c.params().items() if k not in ignore}
        key = (c.benchmark, c.dataset.partition("[")[0], c.solver_base, tuple(sorted(params.items())))
        groups.setdefault(key, []).append(c)
        names[key] = f"{c.solver_base}[{','.join(f'{k}={p}' for k, p in sorted(params.items()))}]"
    labels = short_labels(list(names.values()))
    out = []
    for key, members in groups.items():
        members = sorted(members, key=value)
        values = [value(c) for c in members]
        if len(set(values)) >= 2:
            out.append({"label": labels[names[key]], "configs": members, "values": values})
    return out


def _rate(c: Configuration) -> tuple[float, str] | None:
    rate = throughput(c)
    if "samples_per_sec" in rate:
        return rate["samples_per_sec"], "samples/s"
    if "steps_per_sec" in rate:
        return rate["steps_per_sec"], "iterations/s"
    return None


def scaling_groups(configs: list[Configuration]) -> list[dict[str, Any]]:
    """``[{"label", "ranks", "speedup", "efficiency", "unit"}]``: throughput over that of the fewest processes.

    Speed-up ``S(N) = rate(N) / rate(N0)``, ideal ``N / N0``, parallel efficiency
    ``S(N) / (N / N0)``; the rate is ``samples_per_sec`` where the solver reports it,
    else iterations per second (a fixed problem split over ranks).
    """
    profiled = [c for c in configs if not c.recorded.empty]
    out = []
    for group in sweep_groups(profiled, lambda c: c.ranks(), ignore=LAYOUT_PARAMS):
        rates = [_rate(c) for c in group["configs"]]
        if any(r is None for r in rates) or len({r[1] for r in rates}) != 1:
            continue
        base_ranks, base_rate = group["values"][0], rates[0][0]
        speedup = [r[0] / base_rate for r in rates]
        ideal = [n / base_ranks for n in group["values"]]
        out.append(
            {
                "label": group["label"],
                "ranks": group["values"],
                "speedup": speedup,
                "ideal": ideal,
                "efficiency": [s / i for s, i in zip(speedup, ideal)],
                "unit": rates[0][1],
            }
        )
    return out


def latency_series(configs: list[Configuration]) -> list[dict[str, Any]]:
    """``[{"label", "ms", "deadline_ms"}]``: step time of each recorded call, for inference
    (latency) configurations, and the control loop's deadline (``control_deadline_sec``,
    ``Pi05Inference`` with a ``control_hz``; None without one), drawn on both panels."""
    out = []
    for c in configs:
        if c.recorded.empty or config_kind(c) != "latency":
            continue
        deadline = c.values("control_deadline_sec")
        out.append(
            {
                "label": c.label,
                "ms": [v * 1e3 for v in c.step_values()],
                "deadline_ms": deadline[-1] * 1e3 if deadline else None,
            }
        )
    return out


def latency_fits(configs: list[Configuration]) -> list[dict[str, Any]]:
    """``[{"label", "num_steps", "ms", "F_ms", "s_ms"}]``: median latency against ``num_steps`` and its line.

    ``L(N) = F + N·s`` by least squares (:func:`scopebench.stats.linear_fit`): ``F`` the
    fixed cost (prefix, preprocessing), ``s`` the cost of one denoising step.
    """
    latency = [c for c in configs if not c.recorded.empty and config_kind(c) == "latency"]

    def steps(c: Configuration):
        value = c.param("num_steps")
        return None if value is None else int(value)

    out = []
    for group in sweep_groups(latency, steps, ignore={"num_steps"}):
        ms = [stats.median(c.step_values()) * 1e3 for c in group["configs"]]
        intercept, slope = stats.linear_fit(group["values"], ms)
        out.append({"label": group["label"], "num_steps": group["values"], "ms": ms, "F_ms": intercept, "s_ms": slope})
    return out


def _peak(c: Configuration) -> tuple[float, str] | None:
    gpu = c.values("max_gpu_mb")
    if gpu and max(gpu) > 0:
        return max(gpu), "peak GPU memory (MB)"
    rss = c.values("max_rss_mb")
    if rss:
        return max(rss), "process peak RSS (MB; cumulative within one benchopt process)"
    return None


def memory_groups(configs: list[Configuration]) -> list[dict[str, Any]]:
    """``[{"label", "param", "x", "mb", "unit"}]``: peak memory against ``batch_size`` or ``image_size``."""
    profiled = [c for c in configs if not c.recorded.empty and _peak(c) is not None]
    out = []
    for param, ignore in (("batch_size", {"batch_size"}), ("image_size", {"dataset.image_size"})):

        def value(c: Configuration, param=param):
            v = c.param(param)
            try:
                return None if v is None else float(v)
            except (TypeError, ValueError):
                return None

        for group in sweep_groups(profiled, value, ignore=ignore):
            peaks = [_peak(c) for c in group["configs"]]
            if len({p[1] for p in peaks}) != 1:
                continue
            out.append(
                {
                    "label": group["label"],
                    "param": param,
                    "x": group["values"],
                    "mb": [p[0] for p in peaks],
                    "unit": peaks[0][1],
                }
            )
    return out


#: One colour per region name of a timeline, in order of first appearance (matplotlib's tab10
#: without its grey and red, kept for blocked intervals and the late rank): the PNG and the HTML agree.
TIMELINE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
#: The gap between consecutive iterations of a timeline, as a share of the longest one.
TIMELINE_GAP_SHARE = 0.05


def _timeline_ranks(value: Any) -> list[dict[str, Any]] | None:
    """The ``ranks`` of one ``ledger_timeline`` value; ``None`` when absent or not the profiler's JSON
    (a figure from a value that is not the ledger's would mislead: docs/style.md rule 11)."""
    if not isinstance(value, str):
        return None
    try:
        ranks = json.loads(value)["ranks"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(ranks, list) or not all(isinstance(r, dict) and "rank" in r for r in ranks):
        return None
    return ranks or None


def _known(*times: Any) -> list[float]:
    return [float(t) for t in times if t is not None]


def _timeline_length(ranks: list[dict[str, Any]]) -> float:
    """Seconds from the earliest step start to the last time any rank recorded (its step's end,
    a region's end, a collective's completion or a blocked interval's end)."""
    times = [0.0]
    for r in ranks:
        times += _known(r.get("end"))
        times += _known(*(span[2] for span in r.get("regions", [])))
        times += _known(*(c[4] for c in r.get("collectives", [])), *(c[5] for c in r.get("collectives", [])))
        times += _known(*(w[1] for w in r.get("waits", [])))
    return max(times)


def rank_timeline(config: Configuration) -> dict[str, Any] | None:
    """Every rank's lane over the recorded iterations that carry ``ledger_timeline`` (the profiler
    writes it on the first three of a multi-rank run: :mod:`scopebench.profiler.ledger`); ``None``
    without one.

    Each iteration's times start at its own earliest step start over the ranks; the iterations
    are laid out one after the other, iteration ``j`` at ``offset_ms`` = the lengths of those
    before it plus ``j`` gaps of :data:`TIMELINE_GAP_SHARE` of the longest. Only the first
    repetition (``idx_rep``) that has a timeline is drawn. Every ``*_ms`` below is on that axis.

    Returns:
        ``{"label", "ranks": [lanes, rank 0 first], "late_rank", "subtitle", "regions", "colors":
        {region: colour}, "iterations": [{"iteration", "offset_ms", "length_ms"}], "spans":
        [{"rank", "iteration", "region", "start_ms", "end_ms"}], "collectives": [{"rank",
        "iteration", "op", "nbytes", "issue_ms", "done_ms"}] (``done_ms`` None: not seen to
        complete), "waits": [{"rank", "iteration", "start_ms", "end_ms"}] (blocked), "end_ms"}``;
        ``late_rank`` / ``subtitle`` name the configuration's consistent late rank
        (:func:`~scopebench.report.ledger.config_late_rank`), else ``None``.
    """
    column = "objective_ledger_timeline"
    if column not in config.recorded.columns:
        return None
    rows = config.recorded[config.recorded[column].notna()]
    if "idx_rep" in rows.columns and not rows.empty:
        rows = rows[rows["idx_rep"] == rows["idx_rep"].iloc[0]]
    parsed = [
        (int(stop) - 1, ranks)
        for stop, value in zip(rows["stop_val"], rows[column])
        if (ranks := _timeline_ranks(value)) is not None
    ]
    if not parsed:
        return None
    lengths = [_timeline_length(ranks) * 1e3 for _, ranks in parsed]
    gap = TIMELINE_GAP_SHARE * max(lengths)
    out: dict[str, Any] = {"label": config.label, "iterations": [], "spans": [], "collectives": [], "waits": []}
    offset = 0.0
    for (iteration, ranks), length in zip(parsed, lengths):
        out["iterations"].append({"iteration": iteration, "offset_ms": offset, "length_ms": length})
        for r in ranks:
            _add_lane(out, r, iteration, offset)
        offset += length + gap
    regions = list(dict.fromkeys(span["region"] for span in out["spans"]))
    late = config_late_rank(config)
    out.update(
        ranks=sorted({int(r["rank"]) for _, ranks in parsed for r in ranks}),
        late_rank=late.rank if late is not None else None,
        subtitle=late.headline if late is not None else None,
        regions=regions,
        colors={name: TIMELINE_COLORS[k % len(TIMELINE_COLORS)] for k, name in enumerate(regions)},
        end_ms=offset - gap,
    )
    return out


def _add_lane(out: dict[str, Any], lane: dict[str, Any], iteration: int, offset: float) -> None:
    """One rank's regions, collectives and blocked intervals of one iteration into ``out``, in ms
    from ``offset`` (entries without a start or an end are not drawn)."""

    def at(t: float) -> float:
        return offset + float(t) * 1e3

    where = {"rank": int(lane["rank"]), "iteration": iteration}
    for name, start, end in lane.get("regions", []):
        if start is not None and end is not None:
            out["spans"].append({**where, "region": name, "start_ms": at(start), "end_ms": at(end)})
    for op, _group, _seq, nbytes, issue, done in lane.get("collectives", []):
        if issue is not None:
            done_ms = None if done is None else at(done)
            out["collectives"].append({**where, "op": op, "nbytes": nbytes, "issue_ms": at(issue), "done_ms": done_ms})
    for start, end in lane.get("waits", []):
        if start is not None and end is not None:
            out["waits"].append({**where, "start_ms": at(start), "end_ms": at(end)})


def rank_timelines(configs: list[Configuration]) -> list[dict[str, Any]]:
    """:func:`rank_timeline` of each configuration that has one."""
    return [t for c in configs if (t := rank_timeline(c)) is not None]
