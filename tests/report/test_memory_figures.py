"""Memory pictures of ``profiler_memory``'s columns: per category and rank, and against batch size."""

from __future__ import annotations

import json

import pytest

from scopebench.cli import main
from scopebench.profiler.memory import CATEGORIES
from scopebench.report.build import build_report, read
from scopebench.report.memory_figures import batch_fit, batch_fits, category_bars

from .browser import console_errors, remote_sources, render
from .helpers import config_rows, write

PLOTLY_BANNER = "plotly.js v"
#: Rank 0 and rank 1 of a 2-rank run at their step peaks (MiB); rank 1 is the worst.
RANK0 = {"parameters": 40.0, "gradients": 40.0, "optimizer_state": 80.0, "activations": 30.0, "gather_buffers": 10.0}
RANK1 = {"parameters": 40.0, "gradients": 40.0, "optimizer_state": 80.0, "activations": 50.0, "gather_buffers": 10.0}


def _columns(breakdown: dict[str, float], suffix: str = "", grow: float = 0.0) -> dict:
    """``mem_<category>_mb<suffix>`` (0 for the categories not given) and ``mem_peak_mb<suffix>``;
    activations grow by ``grow`` MiB per iteration."""
    out = {}
    for key in CATEGORIES:
        value = breakdown.get(key, 0.0)
        out[f"mem_{key}_mb{suffix}"] = (lambda i, v=value: v + grow * i) if key == "activations" else value
    out[f"mem_peak_mb{suffix}"] = lambda i: sum(breakdown.values()) + grow * i
    return out


def _two_ranks(per_rank: bool = True) -> dict:
    """Rank 0's row of a 2-rank run: the worst rank's breakdown, per-rank peaks (and categories)."""
    extra = {**_columns(RANK1, grow=1.0), "mem_worst_rank": 1, "world_size": 2, "mem_rank_imbalance_pct": 10.0}
    for rank, breakdown in enumerate((RANK0, RANK1)):
        columns = _columns(breakdown, f"_rank{rank}", grow=1.0)
        extra[f"mem_peak_mb_rank{rank}"] = columns[f"mem_peak_mb_rank{rank}"]
        if per_rank:
            extra.update(columns)
    return extra


def _sweep(batches=(2, 4, 8), fixed=100.0, per_sample=25.0) -> list[list[dict]]:
    return [
        config_rows("Pi05Train", {"forward": 0.01}, params={"batch_size": b, "backend": "ddp"}, n=4,
                    extra={"mem_peak_mb": fixed + per_sample * b, "mem_parameters_mb": fixed,
                           "mem_activations_mb": per_sample * b})  # fmt: skip
        for b in batches
    ]


def test_bars_per_rank_add_up_at_each_ranks_largest_peak_categories_in_order(tmp_path):
    groups = [
        config_rows("Pi05Train", {"forward": 0.01}, params={"backend": "zero3"}, n=5, extra=_two_ranks()),
        config_rows("Pi05Train", {"forward": 0.01}, params={"backend": "ddp"}, n=5, extra=_columns(RANK0)),
    ]
    data = category_bars(read([write(tmp_path / "r.parquet", *groups)]).configs)
    assert data["labels"] == [
        "Pi05Train[backend=zero3] · rank 0",
        "Pi05Train[backend=zero3] · rank 1",
        "Pi05Train[backend=ddp]",
    ]
    assert data["ranks"] == [0, 1, None]
    # In CATEGORIES order; temporaries, buffers and other are zero everywhere: left out.
    assert data["categories"] == ["parameters", "gradients", "optimizer_state", "activations", "gather_buffers"]
    # The last recorded iteration (4) has the largest peak: activations grew by 1 MiB per iteration.
    assert data["mb"]["activations"] == [34.0, 54.0, 30.0]
    assert data["mb"]["optimizer_state"] == [80.0, 80.0, 80.0]
    for k, peak in enumerate(data["peak_mb"]):
        assert sum(data["mb"][c][k] for c in data["categories"]) == pytest.approx(peak)
    assert data["peak_mb"] == [204.0, 224.0, 200.0]


def test_a_file_without_per_rank_categories_shows_the_worst_rank(tmp_path):
    rows = config_rows("Pi05Train", {"forward": 0.01}, params={"backend": "zero3"}, n=3, extra=_two_ranks(False))
    data = category_bars(read([write(tmp_path / "r.parquet", rows)]).configs)
    assert data["labels"] == ["Pi05Train · worst rank 1"] and data["mb"]["activations"] == [52.0]


def test_the_line_of_a_batch_sweep_and_the_largest_batch_read_off_it(tmp_path):
    fits = batch_fits(read([write(tmp_path / "r.parquet", *_sweep())]).configs, limit_mb=400.0)
    assert len(fits) == 1
    fit = fits[0]
    assert fit["batch"] == [2.0, 4.0, 8.0] and fit["mb"] == [150.0, 200.0, 300.0]
    assert fit["fixed_mb"] == pytest.approx(100.0) and fit["per_sample_mb"] == pytest.approx(25.0)
    assert fit["r2"] == pytest.approx(1.0) and fit["largest_batch"] == 12  # 100 + 25 x 12 = 400
    assert batch_fits(read([write(tmp_path / "r.parquet", *_sweep())]).configs)[0]["largest_batch"] is None


def test_batch_fit_reads_off_the_limit_and_needs_two_batches():
    # line 9.667 + 2.25 b: 9.667 + 2.25 x 9 = 29.9 <= 30 < 32.2
    assert batch_fit("a", [1, 2, 3], [12.0, 14.0, 16.5], limit_mb=30.0)["largest_batch"] == 9
    assert batch_fit("a", [1, 2], [50.0, 60.0], limit_mb=30.0)["largest_batch"] == 0  # the fixed part alone is over
    assert batch_fit("a", [1, 2], [50.0, 40.0], limit_mb=30.0)["largest_batch"] is None  # no growth: no read-off
    single = batch_fit("a", [4, 4], [20.0, 21.0], limit_mb=30.0)
    assert single["fixed_mb"] is None and single["largest_batch"] is None


@pytest.fixture(scope="module")
def memory_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory_report")
    zero3 = config_rows("Pi05Train", {"forward": 0.01}, params={"backend": "zero3"}, n=4, extra=_two_ranks())
    path = write(folder / "r.parquet", zero3, *_sweep())
    return build_report([path], folder / "out", memory_gb=400 * 2**20 / 1e9)


def test_report_writes_both_memory_pngs_and_figures_in_a_self_contained_html(memory_report):
    names = {p.name for p in memory_report.pngs}
    assert {"pi05_policy_memory_categories.png", "pi05_policy_memory_batch.png"} <= names, names
    for png in memory_report.pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    text = memory_report.html.read_text()
    assert "memory by category per rank" in text and "memory against batch size" in text
    assert (
        "largest batch on the line: 12" in text and "Pi05Train[backend=zero3] \\u00b7 rank 1" in text
    )  # plotly escapes the dot
    assert remote_sources(text) == [] and text.count(PLOTLY_BANNER) == 1
    manifest = json.loads((memory_report.html.parent / "report.json").read_text())
    assert [f["largest_batch"] for f in manifest["memory_batch_fits"]] == [12]


@pytest.mark.slow
def test_memory_figures_render_in_a_browser_without_network(memory_report):
    dom, log = render(memory_report.html)
    figures = memory_report.html.read_text().count('class="plotly-graph-div"')
    assert dom.count('class="main-svg"') >= figures >= 5
    assert console_errors(log) == [], console_errors(log)


def test_results_without_memory_columns_give_no_memory_figure(tmp_path):
    path = write(tmp_path / "r.parquet", *[config_rows("Pi05Train", {"forward": 0.01 * b}, params={"batch_size": b},
                                                       extra={"max_gpu_mb": 10.0 * b}) for b in (2, 4)])  # fmt: skip
    report = build_report([path], tmp_path / "out", memory_gb=1.0)
    names = {p.name for p in report.pngs}
    assert "pi05_policy_memory.png" in names  # the allocator's peak against the batch, as before
    assert not {"pi05_policy_memory_categories.png", "pi05_policy_memory_batch.png"} & names
    text = report.html.read_text()
    assert "memory by category" not in text and "memory against batch size" not in text


def test_report_refuses_a_memory_limit_that_is_not_positive(tmp_path, capsys):
    path = write(tmp_path / "r.parquet", *_sweep())
    assert main(["report", path, "-o", str(tmp_path / "out"), "--memory-gb", "0"]) == 2
    assert "--memory-gb" in capsys.readouterr().err and not (tmp_path / "out").exists()
