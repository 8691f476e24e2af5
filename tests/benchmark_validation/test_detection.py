"""What must hold on this machine (issue 48): two local gloo ranks, each fault injected by the fault
policy, the suite's findings scored by the benchmark's own scoring.

- a rank 50 ms late is detected and named right (rank and phase) under every backend (DDP in the
  quickstart, ``tests/benchmark_validation/test_benchmark_validation.py``; ZeRO-2, ZeRO-3 and
  FSDP2 here, each in another phase), within 25 % of the extra work the policy measured it did,
  and within 10 % at the median over the backends;
- slow input is ``input-bound``, other processes' work beside the run is ``contended``;
- a NaN loss stops the run at the injected iteration, naming the rank.

The margins stand clear of a loaded machine: every step holds 2 x 40 ms of work per rank, a
50 ms delay is a third of it (late-rank's threshold: 10 %), and the error is against what the
policy measured it injected (work that loses the CPU ends late), not against the nominal delay.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest

from scopebench import stats
from scopebench.policy.settings import TrainSettings
from scopebench.profiler import ProfilerConfig
from scopebench.validation import FaultSpec, score
from scopebench.validation.run import FAULT_POLICY, DetectRun

pytestmark = pytest.mark.slow

ITERATIONS = 6


def detect(tmp_path, spec: FaultSpec, backend: str = "ddp", hogs: int = 0):
    """One validation run of ``spec`` on 2 spawned ranks (warm-up 1, then :data:`ITERATIONS`):
    its score and its record."""
    settings = TrainSettings(
        policy=FAULT_POLICY,
        policy_args=spec.policy_args(steps_per_iteration=2),
        backend=backend,
        nproc_per_node=2,
        find_unused_params=False,
    )
    run = DetectRun(settings, hogs=hogs, profiler=ProfilerConfig(mode="custom", warmup=1), output_dir=tmp_path)
    calls = [0]

    def callback() -> bool:
        calls[0] += 1
        return calls[0] <= ITERATIONS + 1 and run.work.nonfinite is None

    with run:
        run.loop(callback)
    stopped = run.stopped_at
    if stopped is not None:
        run.record.stopped_at, run.record.stopped_rank = stopped
    return score(spec, run.record), run.record


LATE = [("zero2", "optim_step"), ("zero3", "forward"), ("fsdp2", "dataload_wait")]


@pytest.fixture(scope="module")
def late(tmp_path_factory) -> dict[str, dict]:
    """A rank 50 ms late in each backend's phase of :data:`LATE`: each run's score, by backend
    (the runs once, for the per-backend and the median tests)."""
    spec = {backend: FaultSpec(fault="late_rank", rank=1, phase=phase, delay_ms=50) for backend, phase in LATE}
    return {backend: detect(tmp_path_factory.mktemp(backend), spec[backend], backend)[0] for backend, _ in LATE}


@pytest.mark.parametrize("backend", [backend for backend, _ in LATE])
def test_a_rank_50_ms_late_is_named_with_its_rank_phase_and_delay(late, backend):
    out = late[backend]
    assert (out["detected"], out["named_right"]) == (1.0, 1.0), out["findings"]
    assert out["injected"] >= 0.05
    assert out["error_pct"] <= 25.0, (out["reported"], out["injected"])
    assert "late-rank" not in out["false_positive_rules"]


def test_the_median_error_over_the_backends_is_within_10_percent(late):
    assert stats.median([out["error_pct"] for out in late.values()]) <= 10.0, late


def test_slow_input_is_input_bound_and_other_processes_work_is_contended(tmp_path):
    """One run for both: every rank's input computes 30 ms more per step while CPU hogs ask for
    a third of the CPUs or more (one of 2 here): the sampler must see at least 80 % of what they
    had (measured from their CPU time; more on a machine others use too)."""
    hogs = max(1, math.ceil(os.cpu_count() / 3))
    out, record = detect(tmp_path, FaultSpec(fault="slow_input", delay_ms=30), hogs=hogs)
    assert (out["detected"], out["named_right"]) == (1.0, 1.0), out["findings"]
    assert out["error_pct"] <= 25.0, (out["reported"], out["injected"])
    # the same rows, scored as the contention fault (one hog process)
    hog = score(FaultSpec(fault="contention", magnitude=hogs), dataclasses.replace(record, first_detected=None))
    assert (hog["detected"], hog["named_right"]) == (1.0, 1.0), hog["findings"]
    # what the hogs had, measured: some of what they asked for, less on a busy machine
    assert len(record.hog_cpu) == ITERATIONS
    assert 0.0 < hog["injected"] <= 100.0 * hogs / len(os.sched_getaffinity(0)) * 1.1, hog["injected"]
    assert hog["reported"] >= 0.8 * hog["injected"], hog["reported"]


def test_a_nan_loss_stops_the_run_at_the_injected_iteration_naming_the_rank(tmp_path):
    out, _ = detect(tmp_path, FaultSpec(fault="nonfinite", rank=1, step=3))
    assert (out["detected"], out["named_right"], out["stopped_at"]) == (1.0, 1.0, 3.0)
    assert out["steps_to_detect"] == 1.0  # found in the iteration it happened
