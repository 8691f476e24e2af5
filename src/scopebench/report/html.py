"""One self-contained HTML report: plotly figures, phase tables and diagnosis, readable offline.

plotly.js is inlined once, in the first figure (``include_plotlyjs=True``, about 5 MB);
every other figure reuses it (``include_plotlyjs=False``). The page loads nothing from the
network: no CDN script, no remote stylesheet, font or image, so it opens on an air-gapped
login node. The figures show the same data as the PNGs (:mod:`.figures`).
"""

from __future__ import annotations

import html
from datetime import datetime
from typing import Any

from scopebench.report import figures, memory_figures
from scopebench.report.backend_comparison import BackendComparison
from scopebench.report.plots import COLLECTIVE_COLOR, LATE_COLOR, slug
from scopebench.report.results import Configuration
from scopebench.report.tables import format_config, phase_rows

__all__ = ["render_html"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1, h2, h3 { font-weight: 600; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.step td { font-weight: 600; } tr.outside td { color: #777; }
li.finding { margin: 0.2em 0; } .rule { font-family: monospace; font-weight: 600; }
.warning { background: #fff3cd; border: 1px solid #e0c36b; padding: 0.5em 1em; }
pre { background: #f6f6f6; padding: 0.5em; overflow-x: auto; font-size: 0.8em; }
small { word-break: break-all; color: #666; }
"""
#: plotly's default qualitative colours; a configuration keeps its colour across the traces of a figure.
_PALETTE = (
    "#636efa",
    "#EF553B",
    "#00cc96",
    "#ab63fa",
    "#FFA15A",
    "#19d3f3",
    "#FF6692",
    "#B6E880",
    "#FF97FF",
    "#FECB52",
)


def _color_groups(fig: dict[str, Any]) -> None:
    """Same colour for every trace of one configuration (``legendgroup``); legend once per group; ideal lines black."""
    groups: dict[str, str] = {}
    for trace in fig["data"]:
        if trace.get("name") == "ideal":
            trace["line"] = {**trace.get("line", {}), "color": "black"}
            continue
        group = trace.get("legendgroup")
        if group is None:
            continue
        first = group not in groups
        color = groups.setdefault(group, _PALETTE[len(groups) % len(_PALETTE)])
        trace["marker"] = {**trace.get("marker", {}), "color": color}
        if trace.get("type") == "scatter":
            trace["line"] = {**trace.get("line", {}), "color": color}
        trace.setdefault("showlegend", first)


class _Figures:
    """Turns figure dicts into HTML, inlining plotly.js in the first one only.

    Figures are plain ``{"data": [...], "layout": {...}}`` dicts written with
    ``validate=False``: plotly's graph objects validate every trace, which costs seconds
    for a sweep of a few thousand iterations.
    """

    def __init__(self) -> None:
        self.count = 0
        self.template: dict[str, Any] | None = None

    def __call__(self, fig: dict[str, Any]) -> str:
        import plotly.io as pio

        if self.template is None:
            self.template = pio.templates["plotly_white"].to_plotly_json()
        fig["layout"].setdefault("template", self.template)
        fig["layout"].setdefault("margin", {"t": 60, "l": 60, "r": 20, "b": 50})
        _color_groups(fig)
        first = self.count == 0
        self.count += 1
        return pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=first,
            include_mathjax=False,
            validate=False,
            config={"displaylogo": False, "responsive": True},
        )


def _two_panels(titles: tuple[str, str], **layout: Any) -> dict[str, Any]:
    """Layout of two side-by-side panels (traces of the right one use ``xaxis="x2", yaxis="y2"``)."""
    return {
        "xaxis": {"domain": [0.0, 0.45], "anchor": "y"},
        "xaxis2": {"domain": [0.55, 1.0], "anchor": "y2"},
        "yaxis": {"anchor": "x"},
        "yaxis2": {"anchor": "x2"},
        "annotations": [
            {"text": t, "x": x, "y": 1.02, "xref": "paper", "yref": "paper", "showarrow": False, "xanchor": "center"}
            for t, x in zip(titles, (0.225, 0.775))
        ],
        **layout,
    }


def _stacked(data: dict[str, Any], title: str) -> dict[str, Any]:
    traces = [
        {"type": "bar", "orientation": "h", "y": data["labels"], "x": data["ms"][region], "name": region}
        for region in data["regions"]
    ]
    traces[-1]["marker"] = {"color": "#bbbbbb"}  # untracked: the rest of the step
    layout = {
        "barmode": "stack",
        "title": {"text": f"{title}: where the step goes (mean ms per iteration, callback excluded)"},
        "yaxis": {"autorange": "reversed", "automargin": True},
        "legend": {"traceorder": "normal"},
        "height": 200 + 40 * len(data["labels"]),
    }
    return {"data": traces, "layout": layout}


def _steps(series: list[dict[str, Any]], title: str) -> dict[str, Any]:
    traces = []
    for s in series:
        if s["step_ms"]:
            traces.append({"type": "scatter", "x": s["iteration"], "y": s["step_ms"], "mode": "lines+markers",
                           "name": f"{s['label']} (step)", "legendgroup": s["label"], "showlegend": True})  # fmt: skip
        if s["wall_ms"]:
            traces.append({"type": "scatter", "x": s["wall_iteration"], "y": s["wall_ms"], "mode": "lines",
                           "line": {"dash": "dot"}, "name": f"{s['label']} (benchopt)", "legendgroup": s["label"],
                           "showlegend": True})  # fmt: skip
    layout = {
        "title": {"text": f"{title}: step time per iteration (dotted: benchopt time, warm-up included)"},
        "xaxis": {"title": {"text": "iteration"}},
        "yaxis": {"title": {"text": "ms"}, "type": "log"},
    }
    return {"data": traces, "layout": layout}


def _metrics(metrics: dict[str, list[dict[str, Any]]], title: str) -> dict[str, Any]:
    count = len(metrics)
    width = 1.0 / count
    layout: dict[str, Any] = {"title": {"text": f"{title}: quality per iteration"}, "annotations": []}
    traces = []
    for k, (name, lines) in enumerate(metrics.items()):
        suffix = "" if k == 0 else str(k + 1)
        layout[f"xaxis{suffix}"] = {"domain": [k * width + 0.03, (k + 1) * width - 0.03], "anchor": f"y{suffix}"}
        layout[f"yaxis{suffix}"] = {"anchor": f"x{suffix}"}
        layout["annotations"].append({"text": name, "x": (k + 0.5) * width, "y": 1.02, "xref": "paper",
                                      "yref": "paper", "showarrow": False})  # fmt: skip
        for line in lines:
            traces.append({"type": "scatter", "mode": "lines", "x": line["x"], "y": line["y"], "name": line["label"],
                           "xaxis": f"x{suffix}", "yaxis": f"y{suffix}", "legendgroup": line["label"]})  # fmt: skip
    return {"data": traces, "layout": layout}


def _scaling(groups: list[dict[str, Any]], title: str) -> dict[str, Any]:
    low = min(min(g["ranks"]) for g in groups)
    top = max(max(g["ranks"]) for g in groups)
    traces = []
    for g in groups:
        traces.append({"type": "scatter", "x": g["ranks"], "y": g["speedup"], "mode": "lines+markers", "name": g["label"],
                       "legendgroup": g["label"]})  # fmt: skip
        traces.append({"type": "scatter", "x": g["ranks"], "y": [e * 100 for e in g["efficiency"]],
                       "mode": "lines+markers", "name": g["label"], "legendgroup": g["label"], "xaxis": "x2",
                       "yaxis": "y2"})  # fmt: skip
    traces.append({"type": "scatter", "x": [low, top], "y": [1.0, top / low], "mode": "lines", "line": {"dash": "dash"},
                   "name": "ideal"})  # fmt: skip
    traces.append({"type": "scatter", "x": [low, top], "y": [100, 100], "mode": "lines", "line": {"dash": "dash"},
                   "name": "ideal", "showlegend": False, "xaxis": "x2", "yaxis": "y2"})  # fmt: skip
    layout = _two_panels(
        (f"speed-up ({groups[0]['unit']})", "parallel efficiency (%)"), title={"text": f"{title}: scaling"}
    )
    layout["xaxis"]["title"] = layout["xaxis2"]["title"] = {"text": "processes"}
    return {"data": traces, "layout": layout}


def _latency(series: list[dict[str, Any]], title: str) -> dict[str, Any]:
    traces = []
    for s in series:
        ordered = sorted(s["ms"])
        traces.append(
            {"type": "histogram", "x": s["ms"], "name": s["label"], "opacity": 0.6, "legendgroup": s["label"]}
        )
        traces.append({"type": "scatter", "x": ordered, "y": [(i + 1) / len(ordered) for i in range(len(ordered))],
                       "mode": "lines", "line": {"shape": "hv"}, "name": s["label"], "legendgroup": s["label"],
                       "xaxis": "x2", "yaxis": "y2"})  # fmt: skip
    layout = _two_panels(
        ("histogram", "empirical CDF"), title={"text": f"{title}: latency per call (ms)"}, barmode="overlay"
    )
    shapes = []
    for s in series:  # the control loop's deadline (Pi05Inference with control_hz), on both panels
        if s.get("deadline_ms") is not None:
            for axis in ("x", "x2"):
                shapes.append({"type": "line", "xref": axis, "yref": f"{axis.replace('x', 'y')} domain",
                               "x0": s["deadline_ms"], "x1": s["deadline_ms"], "y0": 0, "y1": 1,
                               "line": {"dash": "dash", "width": 1}, "name": f"deadline {s['label']}"})  # fmt: skip
    if shapes:
        layout["shapes"] = shapes
    return {"data": traces, "layout": layout}


def _fits(fits: list[dict[str, Any]], title: str) -> dict[str, Any]:
    traces = []
    for f in fits:
        top = max(f["num_steps"])
        traces.append({"type": "scatter", "x": f["num_steps"], "y": f["ms"], "mode": "markers", "name": f["label"],
                       "legendgroup": f["label"], "showlegend": True})  # fmt: skip
        traces.append({"type": "scatter", "x": [0, top], "y": [f["F_ms"], f["F_ms"] + top * f["s_ms"]], "mode": "lines",
                       "line": {"dash": "dash"}, "name": f"L(N) = {f['F_ms']:.2f} + N x {f['s_ms']:.3f} ms",
                       "legendgroup": f["label"], "showlegend": True})  # fmt: skip
    layout = {
        "title": {"text": f"{title}: latency model"},
        "xaxis": {"title": {"text": "num_steps (N)"}},
        "yaxis": {"title": {"text": "median latency (ms)"}},
    }
    return {"data": traces, "layout": layout}


def _memory(groups: list[dict[str, Any]], title: str) -> dict[str, Any]:
    traces = [
        {
            "type": "scatter",
            "x": g["x"],
            "y": g["mb"],
            "mode": "lines+markers",
            "name": f"{g['label']} ({g['param']})",
            "legendgroup": g["label"],
            "showlegend": True,
        }
        for g in groups
    ]
    layout = {
        "title": {"text": f"{title}: peak memory"},
        "xaxis": {"title": {"text": "batch size / image size"}},
        "yaxis": {"title": {"text": groups[0]["unit"]}},
    }
    return {"data": traces, "layout": layout}


def _timeline_bars(items: list[dict[str, Any]], lanes: dict[int, int], start: str, end: str, **trace: Any):
    """One horizontal bar trace over every lane: a bar per item from ``item[start]`` to ``item[end]``."""
    return {
        "type": "bar",
        "orientation": "h",
        "y": [lanes[i["rank"]] for i in items],
        "base": [i[start] for i in items],
        "x": [i[end] - i[start] for i in items],
        "hoverinfo": "text",
        **trace,
    }


def _timeline(data: dict[str, Any], title: str) -> dict[str, Any]:
    """:func:`figures.rank_timeline` as swimlanes, drawn as :func:`~scopebench.report.plots.timeline_figure` draws them."""
    ranks = data["ranks"]
    lanes = {r: k for k, r in enumerate(ranks)}
    region_lane = {"width": 0.5, "offset": -0.4}
    traces = []
    for region in data["regions"]:
        spans = [s for s in data["spans"] if s["region"] == region]
        hover = [f"rank {s['rank']}, iteration {s['iteration']}: {region} {s['start_ms']:.1f}-{s['end_ms']:.1f} ms"
                 for s in spans]  # fmt: skip
        traces.append(_timeline_bars(spans, lanes, "start_ms", "end_ms", name=region, hovertext=hover,
                                     marker={"color": data["colors"][region]}, **region_lane))  # fmt: skip
    if data["waits"]:
        hover = [f"rank {w['rank']} blocked {w['end_ms'] - w['start_ms']:.1f} ms" for w in data["waits"]]
        pattern = {"shape": "/", "fgcolor": "black", "bgcolor": "rgba(0,0,0,0)", "solidity": 0.3}
        traces.append(_timeline_bars(data["waits"], lanes, "start_ms", "end_ms", name="blocked in a collective",
                                     hovertext=hover, marker={"color": "rgba(0,0,0,0)", "pattern": pattern},
                                     **region_lane))  # fmt: skip
    done = [c for c in data["collectives"] if c["done_ms"] is not None]
    if done:
        hover = [f"rank {c['rank']}: {c['op']} {c['nbytes']} B, {c['done_ms'] - c['issue_ms']:.1f} ms" for c in done]
        traces.append(_timeline_bars(done, lanes, "issue_ms", "done_ms", name="collective: issue to completion",
                                     hovertext=hover, marker={"color": COLLECTIVE_COLOR}, opacity=0.7, width=0.2,
                                     offset=0.15))  # fmt: skip
    pending = [c for c in data["collectives"] if c["done_ms"] is None]
    if pending:
        traces.append({"type": "scatter", "mode": "markers", "x": [c["issue_ms"] for c in pending],
                       "y": [lanes[c["rank"]] + 0.25 for c in pending], "name": "collective: completion unseen",
                       "marker": {"symbol": "line-ns-open", "color": COLLECTIVE_COLOR, "size": 10},
                       "hovertext": [f"rank {c['rank']}: {c['op']}" for c in pending], "hoverinfo": "text"})  # fmt: skip
    labels = [f"rank {r}" + (" (late)" if r == data["late_rank"] else "") for r in ranks]
    labels = [f"<span style='color:{LATE_COLOR}'>{t}</span>" if r == data["late_rank"] else t
              for r, t in zip(ranks, labels)]  # fmt: skip
    heading = f"{title}: per-rank timeline of {data['label']}"
    layout = {
        "title": {"text": heading + (f"<br><sub>{data['subtitle']}</sub>" if data["subtitle"] else "")},
        "barmode": "overlay",
        "xaxis": {"title": {"text": "time (ms): each iteration from its earliest rank's step start"},
                  "range": [0, data["end_ms"] * 1.01 or 1.0]},  # fmt: skip
        "yaxis": {"tickvals": list(range(len(ranks))), "ticktext": labels, "range": [len(ranks) - 0.5, -1.0]},
        "annotations": [
            {"text": f"iteration {it['iteration']}", "x": it["offset_ms"] + it["length_ms"] / 2, "y": -0.7,
             "xref": "x", "yref": "y", "showarrow": False}  # fmt: skip
            for it in data["iterations"]
        ],
        "height": 220 + 80 * len(ranks),
    }
    return {"data": traces, "layout": layout}


def _timelines_html(configs: list[Configuration], title: str, to_html: _Figures) -> list[str]:
    """The per-rank timeline section: one figure per configuration with ``ledger_timeline``."""
    timelines = figures.rank_timelines(configs)
    if not timelines:
        return []
    intro = (
        "<p><small>The first recorded iterations of each multi-rank configuration, every rank on one "
        "clock: its regions, the intervals it was blocked in a collective (hatched) and its collectives "
        "from issue to completion (thin bars); docs/profiler.md, the ledger.</small></p>"
    )
    parts = [f"<h3 id='{slug(title)}-timeline'>Per-rank timeline</h3>", intro]
    return parts + [to_html(_timeline(t, title)) for t in timelines]


def _figures_html(
    configs: list[Configuration], title: str, to_html: _Figures, memory_limit_mb: float | None = None
) -> list[str]:
    parts = []
    stacked = figures.stacked_regions(configs)
    if stacked:
        parts.append(to_html(_stacked(stacked, title)))
    builders = (
        (figures.step_series, _steps),
        (figures.metric_series, _metrics),
        (figures.scaling_groups, _scaling),
        (figures.latency_series, _latency),
        (figures.latency_fits, _fits),
        (figures.memory_groups, _memory),
    )
    for compute, draw in builders:
        found = compute(configs)
        if found:
            parts.append(to_html(draw(found, title)))
    categories = memory_figures.category_bars(configs)
    if categories:
        parts.append(to_html(memory_figures.category_plotly(categories, title)))
    fits = memory_figures.batch_fits(configs, memory_limit_mb)
    if fits:
        parts.append(to_html(memory_figures.batch_plotly(fits, title)))
    return parts


def _table(config: Configuration) -> str:
    rows = phase_rows(config)
    if not rows:
        return f"<pre>{html.escape(format_config(config))}</pre>"
    head = "<tr><th>phase</th><th>n</th><th>mean ms</th><th>median ms</th><th>p95 ms</th><th>p99 ms</th><th>share of step</th></tr>"
    body = []
    for r in rows:
        css = "step" if r["kind"] == "step" else "outside" if r["kind"] in ("callback", "total") else ""
        share = f"{r['share_pct']:.1f}%" if r["share_pct"] is not None else "outside the step"
        body.append(
            f"<tr class='{css}'><td>{html.escape(r['phase'])}</td><td>{r['n']}</td><td>{r['mean_ms']:.3f}</td>"
            f"<td>{r['median_ms']:.3f}</td><td>{r['p95_ms']:.3f}</td><td>{r['p99_ms']:.3f}</td><td>{share}</td></tr>"
        )
    summary = format_config(config).splitlines()
    notes = [
        line
        for line in summary
        if line.startswith(("throughput", "latency", "dataloader", "first call", "compile", "CONTENDED", "host load"))
    ]
    facts = summary[1:3]
    note_html = "".join(f"<div>{html.escape(line)}</div>" for line in facts + notes)
    return f"<table>{head}{''.join(body)}</table>{note_html}"


def _comparison_table(comparison: BackendComparison) -> str:
    """The backend comparison as a table: the fastest backend's medians, the others' differences to them."""
    heads = ("backend", "median step ms", "vs fastest", *comparison.phases)
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in heads) + "</tr>"
    body = []
    for b in comparison.backends:
        css = " class='step'" if b == comparison.fastest else ""
        cells = "".join(f"<td>{html.escape(c)}</td>" for c in (b, *comparison.row(b)))
        body.append(f"<tr{css}>{cells}</tr>")
    pairs = "; ".join(f"{html.escape(k)} = {r:.2f}x" for k, r in comparison.pairs.items())
    return (
        f"<h4>Backend comparison: {html.escape(comparison.label)}</h4>"
        "<p><small>median ms per recorded iteration (step = total - callback); phase columns: the fastest "
        "backend's median, the other backends' difference to it; why: the [backend-comparison] lines above</small></p>"
        f"<table>{head}{''.join(body)}</table>" + (f"<div>{pairs}</div>" if pairs else "")
    )


def render_html(
    sections: list[dict[str, Any]], sources: list[str], warnings: list[str] = (), memory_limit_mb: float | None = None
) -> str:
    """The whole page.

    Args:
        sections: One per benchmark: ``title``, ``configs``, ``findings``, ``warnings`` and
            optionally ``comparisons`` (:class:`~scopebench.report.backend_comparison.BackendComparison`).
        sources: The results files, listed at the top.
        warnings: Warnings that belong to no benchmark section.
        memory_limit_mb: The device limit drawn on memory against batch size (None: none drawn).
    """
    to_html = _Figures()
    out = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'><title>scopebench report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>scopebench report</h1>",
        f"<p>Generated {datetime.now():%Y-%m-%d %H:%M} from: "
        + ", ".join(f"<code>{html.escape(s)}</code>" for s in sources)
        + "</p>",
        "<p>Shares are of the step without the scoring callback (<code>step_time_sec</code> = "
        "<code>total_time_sec - callback_time_sec</code>); "
        "statistics from <code>scopebench.stats</code>; diagnosis rules in <code>docs/diagnosis.md</code>.</p>",
        "<ul>"
        + "".join(f"<li><a href='#{slug(s['title'])}'>{html.escape(s['title'])}</a></li>" for s in sections)
        + "</ul>",
    ]
    out += [f"<p class='warning'>{html.escape(w)}</p>" for w in warnings]
    for section in sections:
        title, configs = section["title"], section["configs"]
        out.append(f"<section id='{slug(title)}'><h2>{html.escape(title)}</h2>")
        out += [f"<p class='warning'>{html.escape(w)}</p>" for w in section["warnings"]]
        out.append("<h3>Diagnosis</h3><ul>")
        for f in section["findings"]:
            out.append(
                f"<li class='finding'><span class='rule'>[{html.escape(f.rule)}]</span> "
                f"<b>{html.escape(f.config)}</b>: {html.escape(f.message)}"
                + (f"<br><i>{html.escape(f.advice)}</i>" if f.advice else "")
                + "</li>"
            )
        out.append("</ul>")
        for comparison in section.get("comparisons", []):
            out.append(_comparison_table(comparison))
        out.append("<h3>Figures</h3>")
        out.extend(_figures_html(configs, title, to_html, memory_limit_mb))
        out.extend(_timelines_html(configs, title, to_html))
        out.append("<h3>Phase tables</h3>")
        for c in configs:
            out.append(f"<h4>{html.escape(c.label)}</h4><p><small>{html.escape(c.solver)}</small></p>{_table(c)}")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)
