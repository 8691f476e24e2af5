"""The backend comparison: Pi05Train configurations that differ only in ``backend`` (ddp / zero2 / zero3 / fsdp2)."""

from __future__ import annotations

import json

import pytest

from scopebench.policy.phases import PHASE_CONTENTS
from scopebench.report.backend_comparison import backend_comparisons
from scopebench.report.build import build_report, diagnose_groups, read, summarize_results
from scopebench.report.diagnosis import diagnose_all
from scopebench.report.results import configurations, load_results

from .helpers import config_rows, write

PHASES = {
    "dataload_wait": 0.0005,
    "forward": 0.010,
    "bwd": 0.020,
    "unscale_clip": 0.0002,
    "optim_step": 0.002,
    "zero_grad_sched": 0.0003,
    "sync_gather": 0.0001,
}
#: Per backend, the phases that differ from DDP's (seconds): ZeRO-2 reduces instead of all-reducing
#: but gathers parameters in its step; ZeRO-3 gathers parameters in forward and bwd.
SLOWER = {
    "ddp": {},
    "zero2": {"bwd": 0.0185, "optim_step": 0.003},
    "zero3": {"forward": 0.014, "bwd": 0.026, "optim_step": 0.0025},
    # FSDP2: per-unit all-gathers in forward, re-gathers + reduce-scatter in bwd, a clip all-reduce.
    "fsdp2": {"forward": 0.012, "bwd": 0.023, "unscale_clip": 0.0007},
}
UNTRACKED = 1e-4  # config_rows adds it to every step


def step_ms(backend: str) -> float:
    return (sum({**PHASES, **SLOWER[backend]}.values()) + UNTRACKED) * 1e3


def train(backend: str, **params) -> list[dict]:
    params = {"backend": backend, "nproc_per_node": 2, "batch_size": 4, **params}
    phases = {**PHASES, **SLOWER[backend]}
    # The composite the solver reports too: a sum of regions, never named as a cause.
    backward_step = sum(phases[p] for p in ("bwd", "unscale_clip", "optim_step", "zero_grad_sched"))
    extra = {"world_size": 2, "backward_step_time_sec": backward_step}
    return config_rows("Pi05Train", phases, params=params, noise=0.0, extra=extra)


@pytest.fixture
def three(tmp_path):
    return write(tmp_path / "backends.parquet", train("ddp"), train("zero2"), train("zero3"))


def test_backends_are_compared_and_zero3_explained(three):
    configs = configurations(load_results([three]))
    assert [c.label for c in configs] == [f"Pi05Train[backend={b}]" for b in ("ddp", "zero2", "zero3")]
    (comparison,) = backend_comparisons(configs)
    assert comparison.backends == ("ddp", "zero2", "zero3") and comparison.fastest == "zero2"
    for backend in comparison.backends:
        assert comparison.step_ms[backend] == pytest.approx(step_ms(backend))
    assert comparison.ratio["zero3"] == pytest.approx(step_ms("zero3") / step_ms("zero2"))
    assert comparison.pairs == pytest.approx(
        {"zero3/zero2": step_ms("zero3") / step_ms("zero2"), "zero2/ddp": step_ms("zero2") / step_ms("ddp")}
    )
    assert comparison.delta_ms["zero3"]["forward"] == pytest.approx(4.0)
    assert comparison.delta_ms["zero3"]["bwd"] == pytest.approx(7.5)
    assert comparison.delta_ms["zero3"]["optim_step"] == pytest.approx(-0.5)
    assert comparison.delta_ms["zero3"]["backward_step"] == pytest.approx(7.0)
    assert comparison.named["zero3"] == ["forward", "bwd"]

    findings = [f for f in diagnose_all(configs) if f.rule == "backend-comparison"]
    assert [f.config for f in findings] == ["Pi05Train[backend=ddp]", "Pi05Train[backend=zero3]"]
    zero3 = findings[1].message
    ratio = step_ms("zero3") / step_ms("zero2")
    assert zero3.startswith(f"zero3 is {ratio:.2f}x slower than zero2") and f"{ratio:.2f}" == "1.34"
    assert "forward +4.000 ms, bwd +7.500 ms" in zero3
    assert "dataload_wait" not in zero3 and "optim_step" not in zero3
    # The contents are PHASE_CONTENTS' own words, not a copy.
    for phase in ("forward", "bwd"):
        assert f"{phase} = {PHASE_CONTENTS['zero3'][phase]}" in zero3
    assert "under DDP: bwd = backward + DDP's gradient all-reduce" in findings[0].message


def test_summary_prints_the_comparison_table(three):
    results = read([three])
    findings = [f for group in diagnose_groups(results).values() for f in group]
    text = summarize_results(results, findings)
    table = text[text.index("backend comparison: Pi05Train") :].splitlines()
    assert table[1].split()[:3] == ["backend", "step", "vs"] and "forward" in table[1]
    zero3 = next(line for line in table if line.startswith("zero3 "))
    assert zero3.split()[1:6] == [f"{step_ms('zero3'):.3f}", "1.34x", "+0.000", "+4.000", "+7.500"]
    assert next(line for line in table if line.startswith("zero2 ")).split()[2] == "fastest"
    assert "zero3 / zero2 = 1.34x; zero2 / ddp = 0.98x" in text
    assert text.index("backend comparison:") < text.index("[backend-comparison] Pi05Train[backend=zero3]: zero3 is")


def test_report_json_and_html_hold_the_comparison(three, tmp_path):
    report = build_report([three], tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "report.json").read_text())
    (comparison,) = manifest["backend_comparisons"]
    assert comparison["fastest"] == "zero2" and comparison["named"]["zero3"] == ["forward", "bwd"]
    assert any(
        f["rule"] == "backend-comparison" and f["config"] == "Pi05Train[backend=zero3]" for f in manifest["findings"]
    )
    page = report.html.read_text()
    assert "Backend comparison: Pi05Train" in page and "zero3/zero2 = 1.34x" in page
    assert "backend comparison: Pi05Train" in report.text


def test_one_backend_gives_no_comparison(tmp_path):
    path = write(tmp_path / "one.parquet", train("zero2"))
    configs = configurations(load_results([path]))
    assert backend_comparisons(configs) == []
    assert [f.rule for f in diagnose_all(configs)] == ["no-problem"]
    results = read([path])
    assert "backend comparison" not in summarize_results(results, diagnose_all(results.configs))


def test_no_comparison_when_another_parameter_differs(tmp_path):
    path = write(tmp_path / "mixed.parquet", train("ddp", batch_size=4), train("zero3", batch_size=8))
    configs = configurations(load_results([path]))
    assert backend_comparisons(configs) == []
    assert [f for f in diagnose_all(configs) if f.rule == "backend-comparison"] == []


def test_one_comparison_per_group(tmp_path):
    groups = [train(b, batch_size=n) for n in (4, 8) for b in ("ddp", "zero3")]
    configs = configurations(load_results([write(tmp_path / "two.parquet", *groups)]))
    comparisons = backend_comparisons(configs)
    assert sorted(c.label for c in comparisons) == ["Pi05Train[batch_size=4]", "Pi05Train[batch_size=8]"]
    assert all(c.fastest == "ddp" and list(c.explanations) == ["zero3"] for c in comparisons)


def test_fsdp2_joins_the_comparison_and_its_phases_are_explained(tmp_path):
    path = write(tmp_path / "four.parquet", *(train(b) for b in ("ddp", "zero2", "zero3", "fsdp2")))
    configs = configurations(load_results([path]))
    (comparison,) = backend_comparisons(configs)
    assert comparison.backends == ("ddp", "fsdp2", "zero2", "zero3") and comparison.fastest == "zero2"
    assert comparison.pairs["fsdp2/zero2"] == pytest.approx(step_ms("fsdp2") / step_ms("zero2"))
    assert comparison.pairs["fsdp2/ddp"] == pytest.approx(step_ms("fsdp2") / step_ms("ddp"))
    assert comparison.named["fsdp2"] == ["forward", "bwd"]
    (finding,) = [f for f in diagnose_all(configs) if f.config == "Pi05Train[backend=fsdp2]"]
    assert finding.rule == "backend-comparison"
    assert finding.message.startswith(f"fsdp2 is {step_ms('fsdp2') / step_ms('zero2'):.2f}x slower than zero2")
    assert "forward +2.000 ms, bwd +4.500 ms" in finding.message
    for phase in ("forward", "bwd"):
        assert f"{phase} = {PHASE_CONTENTS['fsdp2'][phase]}" in finding.message
