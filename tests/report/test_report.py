"""scopebench report on real quickstart results: PNGs, and one HTML file that renders offline."""

from __future__ import annotations

import pytest

from scopebench.cli import main
from scopebench.report.build import build_report

from .browser import console_errors, remote_sources, render
from .helpers import config_rows, write

PLOTLY_BANNER = "plotly.js v"


@pytest.fixture(scope="module")
def reports(quickstarts, tmp_path_factory):
    out = {}
    for key, parquet in quickstarts.items():
        out[key] = build_report([parquet], tmp_path_factory.mktemp(f"report_{key}"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("key", ["policy", "inference", "training"])
def test_report_writes_pngs_and_a_self_contained_html(reports, key):
    report = reports[key]
    names = {p.name for p in report.pngs}
    assert {p.name.rsplit("_", 1)[-1] for p in report.pngs} >= {"regions.png", "time.png", "metrics.png"}, names
    for png in report.pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    if key == "policy":  # Pi05Inference: latency per call
        assert any(p.name.endswith("_latency.png") for p in report.pngs)
    text = report.html.read_text()
    assert remote_sources(text) == []
    assert text.count(PLOTLY_BANNER) == 1  # plotly.js inlined once, not once per figure
    assert text.count('class="plotly-graph-div"') >= 3
    assert "Phase tables" in text and "Diagnosis" in text and "share of step" in text


def test_remote_source_check_reads_tags_not_text():
    page = "<script>var u = 'https://cdn.plot.ly/x.js';</script><a href='https://example.org'>x</a>"
    assert remote_sources(page) == []
    bad = (
        "<script src='https://cdn.plot.ly/plotly.min.js'></script><link href='//fonts/x.css'><img src='http://a/b.png'>"
    )
    assert [tag for tag, _ in remote_sources(bad)] == ["script", "link", "img"]


@pytest.mark.slow
def test_html_renders_in_a_browser_without_network(reports, tmp_path):
    for report in reports.values():
        dom, log = render(report.html)
        assert dom.count("main-svg") >= 3, f"no plot rendered in {report.html}"
        assert console_errors(log) == [], console_errors(log)
    # Negative control: a page that needs a CDN fails the same check.
    control = tmp_path / "cdn.html"
    control.write_text(
        "<html><body><div id='p'></div><script src='https://cdn.plot.ly/plotly-2.35.2.min.js'></script>"
        "<script>Plotly.newPlot('p', [{x: [1, 2], y: [1, 2]}]);</script></body></html>"
    )
    dom, log = render(control)
    assert "main-svg" not in dom and any("Plotly is not defined" in e for e in console_errors(log))
    assert remote_sources(control.read_text()) != []


def test_report_command_prints_html_and_png_paths(tmp_path, capsys):
    path = write(
        tmp_path / "r.parquet", config_rows("PnP", {"gradient": 0.003, "denoise": 0.01}, objective="Imaging inference")
    )
    assert main(["report", path, "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"html: {tmp_path / 'out' / 'report.html'}" in out and "png: " in out
    assert (tmp_path / "out" / "report.txt").read_text().startswith("##### Imaging inference")
    assert remote_sources((tmp_path / "out" / "report.html").read_text()) == []


def test_sweeps_give_scaling_latency_fit_and_memory_pictures(tmp_path):
    groups = []
    for nproc, bwd in ((1, 0.020), (2, 0.012), (4, 0.008)):
        rows = config_rows("Pi05Train", {"forward": 0.01 / nproc, "bwd": bwd}, params={"nproc_per_node": nproc},
                           extra={"world_size": nproc})  # fmt: skip
        groups.append(rows)
    for steps in (1, 5, 10):
        groups.append(
            config_rows(
                "Pi05Inference", {"prefill": 0.05, "denoise": 0.007 * steps}, params={"num_steps": steps}, noise=0.0
            )
        )
    for batch in (2, 4, 8):
        groups.append(config_rows("UnrolledPnP", {"forward": 0.001 * batch}, params={"batch_size": batch},
                                  extra={"max_gpu_mb": 100.0 * batch}, objective="unrolled"))  # fmt: skip
    report = build_report([write(tmp_path / "sweep.parquet", *groups)], tmp_path / "out")
    names = {p.name for p in report.pngs}
    assert {"pi05_policy_scaling.png", "pi05_policy_latency_fit.png", "unrolled_memory.png"} <= names, names
    text = report.html.read_text()
    assert "L(N) = 50.10 + N x 7.000 ms" in text  # the fit recovers F (prefill + untracked) and s
    assert text.count(PLOTLY_BANNER) == 1


def test_a_new_report_removes_pictures_that_no_longer_apply(tmp_path):
    first = [config_rows("Pi05Inference", {"denoise": 0.007 * s}, params={"num_steps": s}) for s in (1, 10)]
    build_report([write(tmp_path / "a.parquet", *first)], tmp_path / "out")
    assert (tmp_path / "out" / "pi05_policy_latency_fit.png").exists()
    build_report([write(tmp_path / "b.parquet", first[0])], tmp_path / "out")
    assert not (tmp_path / "out" / "pi05_policy_latency_fit.png").exists()
