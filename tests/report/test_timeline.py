"""The per-rank timeline of the first recorded steps (``ledger_timeline``): its data."""

from __future__ import annotations

import pytest

from scopebench.profiler.ledger import RankRecord, ledger_timeline
from scopebench.report.build import read
from scopebench.report.figures import TIMELINE_GAP_SHARE, rank_timeline

from .helpers import config_rows, write

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
