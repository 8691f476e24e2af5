"""The per-rank timeline of the first recorded steps (``ledger_timeline``): its data, PNG and HTML section."""

from __future__ import annotations

import pytest

from scopebench.cli import main
from scopebench.profiler.ledger import RankRecord, ledger_timeline
from scopebench.report.build import build_report, read
from scopebench.report.figures import TIMELINE_GAP_SHARE, rank_timeline

from .browser import console_errors, remote_sources, render
from .helpers import config_rows, write

PLOTLY_BANNER = "plotly.js v"
#: Where the steps start on rank 0's clock: the timeline counts from the earliest start.
CLOCK = 1000.0


def _stalled_step(iteration: int) -> str:
    """``ledger_timeline`` of a 2-rank step (via the profiler's own writer): both ranks run
    ``fwd`` for 50 ms, rank 1 computes ``bwd`` for 200 + 10 x ``iteration`` ms longer than rank 0,
    which waits for it in the gradient all-reduce; rank 1 starts 1 ms after rank 0; each rank
    issues a broadcast at the end that it is not seen to complete."""
    stall = 0.2 + 0.01 * iteration
    t0 = CLOCK + iteration
    records = []
    for rank, work in ((0, 0.04), (1, 0.04 + stall)):
        start = t0 + 0.001 * rank
        issue, done = start + 0.05 + work, t0 + 0.051 + 0.04 + stall + 0.01
        end = done + 0.005
        records.append(
            RankRecord(
                rank,
                [("fwd", start, start + 0.05), ("bwd", start + 0.05, done)],
                [("g", 2 * iteration, "all_reduce", 2, 4096, issue, done),
                 ("g", 2 * iteration + 1, "broadcast", 2, 8, done + 0.001, None)],  # fmt: skip
                [(issue, done, [0])],
                end,
                start,
            )
        )
    return ledger_timeline(records)


def _rows(with_timeline: bool = True, **params) -> list[dict]:
    extra = {"world_size": 2, "late_rank": 1, "late_rank_delay_sec": 0.2, "late_rank_region": "bwd"}
    if with_timeline:  # the profiler writes it on the first three recorded iterations only
        extra["ledger_timeline"] = lambda i: _stalled_step(i) if i <= 3 else None
    return config_rows("Pi05Train", {"fwd": 0.05, "bwd": 0.25}, n=6, noise=0.0, extra=extra, params=params)


def _timeline(tmp_path, *groups):
    config, *_ = read([write(tmp_path / "r.parquet", *groups)]).configs
    return rank_timeline(config)


def test_lanes_spans_and_offsets_in_ms(tmp_path):
    data = _timeline(tmp_path, _rows())
    assert data["ranks"] == [0, 1] and data["regions"] == ["fwd", "bwd"]
    assert data["colors"]["fwd"] != data["colors"]["bwd"]
    # Iterations 1 to 3 (warm-up iteration 0 is not recorded); each lasts from rank 0's start to
    # rank 1's end: 1 + 50 + 40 + stall + 10 + 5 ms.
    assert [it["iteration"] for it in data["iterations"]] == [1, 2, 3]
    lengths = [it["length_ms"] for it in data["iterations"]]
    assert lengths == pytest.approx([316.0, 326.0, 336.0])
    gap = TIMELINE_GAP_SHARE * 336.0
    offsets = [it["offset_ms"] for it in data["iterations"]]
    assert offsets == pytest.approx([0.0, 316.0 + gap, 316.0 + 326.0 + 2 * gap])
    assert data["end_ms"] == pytest.approx(316.0 + 326.0 + 336.0 + 2 * gap)

    def spans(rank, iteration):
        return [(s["region"], s["start_ms"], s["end_ms"]) for s in data["spans"]
                if s["rank"] == rank and s["iteration"] == iteration]  # fmt: skip

    assert spans(0, 1) == [("fwd", 0.0, 50.0), ("bwd", 50.0, pytest.approx(311.0))]
    third = offsets[2]
    assert spans(1, 3) == [("fwd", pytest.approx(third + 1.0), pytest.approx(third + 51.0)),
                           ("bwd", pytest.approx(third + 51.0), pytest.approx(third + 331.0))]  # fmt: skip
    # Rank 0 is blocked from its all-reduce's issue (90 ms) to its completion: the wait for rank 1.
    (wait,) = [w for w in data["waits"] if w["rank"] == 0 and w["iteration"] == 1]
    assert (wait["start_ms"], wait["end_ms"]) == pytest.approx((90.0, 311.0))
    reduce, broadcast = [c for c in data["collectives"] if c["rank"] == 1 and c["iteration"] == 2]
    assert (reduce["op"], reduce["nbytes"]) == ("all_reduce", 4096)
    assert (reduce["issue_ms"], reduce["done_ms"]) == pytest.approx((offsets[1] + 311.0, offsets[1] + 321.0))
    assert broadcast["op"] == "broadcast" and broadcast["done_ms"] is None
    assert data["late_rank"] == 1 and data["subtitle"] == "rank 1 arrives 200.0 ms late per step in bwd"


def test_no_late_rank_no_subtitle_and_only_the_first_repetition(tmp_path):
    rows = _rows()
    for row in rows:
        row.pop("objective_late_rank", None)
    again = [{**row, "idx_rep": 1} for row in rows]
    data = _timeline(tmp_path, rows + again)
    assert data["late_rank"] is None and data["subtitle"] is None
    assert [it["iteration"] for it in data["iterations"]] == [1, 2, 3]


def test_a_value_that_is_not_the_ledger_s_json_gives_no_timeline(tmp_path):
    rows = _rows()
    for row in rows:
        if row.get("objective_ledger_timeline") is not None:
            row["objective_ledger_timeline"] = "{not json"
    assert _timeline(tmp_path, rows) is None


@pytest.fixture(scope="module")
def timeline_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("timeline_report")
    stalled = _rows(backend="ddp")
    without = _rows(with_timeline=False, backend="zero2")
    return build_report([write(folder / "r.parquet", stalled, without)], folder / "out")


def test_report_writes_one_timeline_png_per_configuration_that_has_one(timeline_report):
    names = [p.name for p in timeline_report.pngs if "_timeline" in p.name]
    assert names == ["pi05_policy_timeline_pi05train_backend_ddp.png"]
    png = timeline_report.html.parent / names[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_the_html_has_the_timeline_section_with_a_lane_per_rank(timeline_report):
    text = timeline_report.html.read_text()
    assert text.count("<h3 id='pi05_policy-timeline'>Per-rank timeline</h3>") == 1
    section = text[text.index("Per-rank timeline</h3>") : text.index("<h3>Phase tables</h3>")]
    assert section.count('class="plotly-graph-div"') == 1  # the configuration without the column has none
    assert "per-rank timeline of Pi05Train[backend=ddp]" in section and "backend=zero2" not in section
    assert '"ticktext":["rank 0","\\u003cspan style=' in section and "rank 1 (late)" in section
    assert "rank 1 arrives 200.0 ms late per step in bwd" in section
    assert all(f"iteration {k}" in section for k in (1, 2, 3))
    assert remote_sources(text) == [] and text.count(PLOTLY_BANNER) == 1


def test_results_without_the_column_give_no_timeline_and_no_error(tmp_path, capsys):
    path = write(tmp_path / "r.parquet", _rows(with_timeline=False))
    assert main(["report", path, "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "png: " in out and "_timeline" not in out
    assert "Per-rank timeline" not in (tmp_path / "out" / "report.html").read_text()


def test_the_report_command_lists_the_timeline_png(tmp_path, capsys):
    assert main(["report", write(tmp_path / "r.parquet", _rows()), "-o", str(tmp_path / "out")]) == 0
    assert f"png: {tmp_path / 'out' / 'pi05_policy_timeline_pi05train.png'}" in capsys.readouterr().out


@pytest.mark.slow
def test_the_timeline_renders_in_a_browser_without_network(timeline_report):
    dom, log = render(timeline_report.html)
    figures = timeline_report.html.read_text().count('class="plotly-graph-div"')
    assert dom.count('class="main-svg"') >= figures
    assert console_errors(log) == [], console_errors(log)
    section = dom[dom.index("Per-rank timeline</h3>") :]
    assert ">rank 0<" in section and ">rank 1 (late)<" in section  # one lane per rank, drawn
    assert ">iteration 3<" in section
