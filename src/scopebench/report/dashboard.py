"""BenchOpt dashboard plots (``benchopt plot <benchmark>``), without importing benchopt.

Each benchmark's ``plots/<name>.py`` is a thin adapter: ``class Plot(<Mixin>, BasePlot)``
with one of the mixins below, which hold the name, type, options and the code. benchopt
1.10 finds ``plots/*.py`` by itself; facts this module relies on:

* plot ``type`` is one of scatter / bar_chart / boxplot / table / image; there is no
  stacked bar, so the profile is an ``image`` holding a matplotlib figure as an RGB array
  (no alpha channel: benchopt's PNG encoder expects RGB or grey) and a one-line title
  (benchopt turns ``\\n`` into ``<br />`` in the HTML, which breaks image titles);
* a plot whose name starts with another plot's name followed by ``_`` breaks that plot's
  view (``result.js`` matches options by prefix): our names are ``profile_stack``,
  ``region_times``, ``scaling``, ``phase_table`` (none extends ``objective_curve``,
  ``bar_chart``, ``boxplot`` or ``table``);
* ``--no-html`` saves ``<name>_<option values>.pdf`` with ``Path.with_suffix``, which
  cuts at the last dot: option values here are region names and words, never dataset
  or solver names (which hold ``0.03``), so files never collide;
* ``--no-html`` never closes its figures; the image plot closes its own.
"""

from __future__ import annotations

from scopebench.report import figures
from scopebench.report.results import configurations

__all__ = ["PhaseTable", "ProfileStack", "RegionTimes", "Scaling", "PLOT_NAMES"]

STEP = "step"
WALL = "benchopt_iteration_time"


_LAST: list = [None, None]


def _configs(df):
    """Configurations of ``df``; benchopt calls every plot and option with the same frame, so the last one is kept."""
    if _LAST[0] is not df:
        _LAST[:] = [df, configurations(df)]
    return _LAST[1]


class ProfileStack:
    """Stacked region time per solver configuration (an image)."""

    name = "profile_stack"
    type = "image"
    options: dict = {}

    def plot(self, df):
        from scopebench.report.plots import figure_to_rgb, stacked_figure

        data = figures.stacked_regions(_configs(df))
        if data is None:
            return [{"image": None, "label": "no profiled iterations in these results"}]
        return [{"image": figure_to_rgb(stacked_figure(data)), "label": "mean ms per iteration, callback excluded"}]

    def get_metadata(self, df):
        return {"title": "Where the step goes: mean region time per configuration (callback excluded)"}


def _region_choices(df) -> list[str]:
    names: list[str] = []
    for c in _configs(df):
        names += [r for r in (*c.regions, *c.composites) if r not in names]
    return [STEP, *names, WALL]


class RegionTimes:
    """One region's time (or the step, or benchopt's time per iteration) against the iteration."""

    name = "region_times"
    type = "scatter"
    options = {"region": _region_choices}

    def plot(self, df, region):
        out = []
        for c in _configs(df):
            if region == WALL:
                series = next((s for s in figures.step_series([c]) if s["wall_ms"]), None)
                x, y = (series["wall_iteration"], series["wall_ms"]) if series else ([], [])
            elif region == STEP:
                x, y = c.iterations(), [v * 1e3 for v in c.step_values()]
            elif region in c.region_columns:
                rows = c.recorded[c.recorded[f"objective_{c.region_columns[region]}"].notna()]
                x = [int(v) - 1 for v in rows["stop_val"]]
                y = [float(v) * 1e3 for v in rows[f"objective_{c.region_columns[region]}"]]
            else:
                continue
            if x:
                out.append({"x": x, "y": y, "label": c.label, **self.get_style(c.label)})
        return out

    def get_metadata(self, df, region):
        what = {STEP: "step (callback excluded)", WALL: "benchopt time per iteration, warm-up included"}
        return {
            "title": f"{what.get(region, region)} per iteration",
            "xlabel": "iteration",
            "ylabel": "ms",
            "scale": "semilog-y",
        }


class Scaling:
    """Speed-up or parallel efficiency against processes, with the ideal line."""

    name = "scaling"
    type = "scatter"
    options = {"measure": ["speed-up", "efficiency"]}

    def plot(self, df, measure):
        groups = figures.scaling_groups(_configs(df))
        out = []
        for g in groups:
            y = g["speedup"] if measure == "speed-up" else [e * 100 for e in g["efficiency"]]
            out.append({"x": g["ranks"], "y": y, "label": g["label"], **self.get_style(g["label"])})
        if groups:
            low = min(min(g["ranks"]) for g in groups)
            top = max(max(g["ranks"]) for g in groups)
            ideal = [1.0, top / low] if measure == "speed-up" else [100.0, 100.0]
            out.append({"x": [low, top], "y": ideal, "label": "ideal", **self.get_style("ideal")})
        return out

    def get_metadata(self, df, measure):
        groups = figures.scaling_groups(_configs(df))
        unit = groups[0]["unit"] if groups else "no sweep over nproc_per_node in these results"
        ylabel = f"speed-up ({unit})" if measure == "speed-up" else "parallel efficiency (%)"
        return {
            "title": f"Scaling: {measure} against processes",
            "xlabel": "processes",
            "ylabel": ylabel,
            "scale": "linear",
        }


class PhaseTable:
    """The phase table of every configuration (mean / median / p95 / share of the step)."""

    name = "phase_table"
    type = "table"
    options: dict = {}

    def plot(self, df):
        from scopebench.report.tables import phase_rows

        rows = []
        for c in _configs(df):
            for r in phase_rows(c):
                share = round(r["share_pct"], 2) if r["share_pct"] is not None else "outside the step"
                rows.append(
                    [
                        c.label,
                        r["phase"],
                        r["n"],
                        round(r["mean_ms"], 4),
                        round(r["median_ms"], 4),
                        round(r["p95_ms"], 4),
                        share,
                    ]
                )
        return rows

    def get_metadata(self, df):
        return {
            "title": "Phase table (ms; share of the step without the scoring callback)",
            "columns": ["configuration", "phase", "n", "mean ms", "median ms", "p95 ms", "share %"],
            "default_order_column": 0,
            "default_order_ascending": True,
        }


#: Names of the custom plots, as benchopt lists them.
PLOT_NAMES = tuple(cls.name for cls in (ProfileStack, RegionTimes, Scaling, PhaseTable))
