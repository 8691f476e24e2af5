"""BenchOpt dashboards: each benchmark's plots/ shows the profile in `benchopt plot`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings

import pandas as pd
import pytest
import yaml
from benchopt import BasePlot
from benchopt.plotting import _check_view
from benchopt.plotting.default_plots import BarChart, BoxPlot, ObjectiveCurvePlot, TablePlot
from benchopt.results.parquet import update_metadata
from conftest import REPO

from scopebench.report import dashboard

from .helpers import config_rows

BENCHMARKS = {"policy": REPO, "inference": REPO / "benchmark_inference", "training": REPO / "benchmark_training"}
MIXINS = (dashboard.ProfileStack, dashboard.RegionTimes, dashboard.Scaling, dashboard.PhaseTable)


def plot_class(mixin):
    return type("Plot", (mixin, BasePlot), {})


def test_every_benchmark_ships_the_four_plots():
    for bench in BENCHMARKS.values():
        files = sorted(p.stem for p in (bench / "plots").glob("*.py"))
        assert files == sorted(dashboard.PLOT_NAMES), bench
        for path in (bench / "plots").glob("*.py"):
            assert "class Plot(" in path.read_text() and "BasePlot" in path.read_text()


def test_no_plot_name_extends_another_with_an_underscore():
    # result.js matches a view's options by prefix: `table_x` would break `table`'s view.
    names = [cls._get_name() for cls in (ObjectiveCurvePlot, BarChart, BoxPlot, TablePlot)] + list(dashboard.PLOT_NAMES)
    for name in names:
        for other in names:
            assert name == other or not name.startswith(other + "_"), (name, other)


def test_plots_pass_benchopt_checks_and_images_have_no_alpha_nor_line_break():
    df = pd.DataFrame(config_rows("PnP", {"gradient": 0.003, "denoise": 0.01}, objective="Imaging inference"))
    for mixin in MIXINS:
        plot = plot_class(mixin).get_instance()
        plot._check()
        data, _ = plot._get_all_plots(df)
        for entry in data.values():
            assert "\n" not in entry["title"]
    (image,) = plot_class(dashboard.ProfileStack).get_instance().plot(df)
    array = image["image"]
    assert array.ndim == 3 and array.shape[2] == 3 and 0.0 <= array.min() and array.max() <= 1.0


def test_region_choices_come_from_the_results():
    df = pd.DataFrame(config_rows("Future", {"encode": 0.01, "teleport": 0.02}))
    plot = plot_class(dashboard.RegionTimes).get_instance()
    _, options = plot._get_all_plots(df)
    assert options["region"] == ["step", "encode", "teleport", "benchopt_iteration_time"]
    warm = plot.plot(df, "benchopt_iteration_time")[0]
    assert warm["x"][0] == 0 and len(warm["x"]) == 20  # every iteration, warm-up included
    assert plot.plot(df, "teleport")[0]["x"][0] == 1  # profiler window starts after warm-up


@pytest.mark.parametrize("key", list(BENCHMARKS))
def test_config_yml_holds_only_valid_views(key):
    config = yaml.safe_load((BENCHMARKS[key] / "config.yml").read_text())
    assert set(config) == {"plot_configs"}
    plots = [plot_class(m).get_instance() for m in MIXINS]
    for name, view in config["plot_configs"].items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _check_view(name, view, plots)


def _benchmark_copy(key, parquet, tmp_path):
    """A benchmark folder with the real objective, plots and settings, and one result in outputs/."""
    bench = BENCHMARKS[key]
    copy = tmp_path / f"bench_{key}"
    (copy / "outputs").mkdir(parents=True)
    shutil.copy(bench / "objective.py", copy)
    shutil.copy(bench / "config.yml", copy)
    shutil.copytree(bench / "plots", copy / "plots")
    shutil.copy(parquet, copy / "outputs" / "quickstart.parquet")
    return copy


def _benchopt_plot(copy, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "benchopt", "plot", str(copy), "--no-display", "-f", str(copy / "outputs" / "quickstart.parquet"), *args],
        capture_output=True, text=True, timeout=300, cwd=copy.parent, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("key", list(BENCHMARKS))
def test_benchopt_plot_draws_the_custom_plots(key, quickstarts, tmp_path):
    copy = _benchmark_copy(key, quickstarts[key], tmp_path)
    kinds = [arg for name in dashboard.PLOT_NAMES for arg in ("-k", name)]
    _benchopt_plot(copy, "--no-html", *kinds)
    pdfs = {p.name for p in (copy / "outputs").glob("*.pdf")}
    expected = {"profile_stack.pdf", "region_times_step.pdf", "region_times_benchopt_iteration_time.pdf",
                "scaling_speed-up.pdf", "scaling_efficiency.pdf"}  # fmt: skip
    assert expected <= pdfs, pdfs
    assert len(pdfs) >= len(expected) + 2  # and one per region of the quickstart
    # The HTML page renders benchopt's default plots for every objective_* column too (40 s
    # for the policy quickstart); the parquet's `plots` setting keeps this test to ours.
    update_metadata(copy / "outputs" / "quickstart.parquet", {"plots": list(dashboard.PLOT_NAMES)})
    _benchopt_plot(copy)
    (page,) = (copy / "outputs").glob("*_quickstart.html")
    text = page.read_text()
    for name in dashboard.PLOT_NAMES:
        assert f'"{name}": {{' in text, name  # listed among the page's plots with its data
    assert "data:image/png;base64," in text  # the stacked profile, embedded
    assert '"Where the step goes": {"plot_kind": "profile_stack"}' in text  # the saved views
