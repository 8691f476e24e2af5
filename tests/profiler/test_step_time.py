"""``step_time_sec``: the iteration without benchopt's scoring callback, in every timing backend."""

from __future__ import annotations

import pytest

from scopebench.profiler import ProfilerConfig, create_profiler
from scopebench.profiler.base import reduce_across_ranks
from scopebench.profiler.nvidia import NvidiaProfiler


class _Markers:
    """NVTX and capture calls that go nowhere (no CUDA, no ``nvtx`` package needed)."""

    capture_active = True

    def range_push(self, name):
        pass

    def range_pop(self):
        pass

    def profiler_start(self):
        pass

    def profiler_stop(self):
        pass


def _burn(n=200_000):
    """CPU work that takes measurable time whatever the machine (no sleep, no clock)."""
    acc = 0
    for k in range(n):
        acc += k * k
    return acc


def _profiler(mode, **kwargs):
    if mode == "nvidia":
        return NvidiaProfiler(ProfilerConfig(mode="nvidia", **kwargs), markers=_Markers())
    return create_profiler(mode, "cpu", f"step_{mode}", **kwargs)


def _run(prof, n):
    """``n`` iterations with a CPU-burning callback; ``seen[k]``: metrics of iteration ``k``."""
    seen = []
    calls = {"n": 0}

    def callback():
        if calls["n"]:
            seen.append(prof.get_current_metrics())
        calls["n"] += 1
        _burn()
        return calls["n"] <= n

    for _ in prof.iterate(callback):
        with prof.track_step("work"):
            _burn(20_000)
    prof.finalize()
    return seen


@pytest.mark.parametrize("mode", ["custom", "torch"])
def test_step_time_is_total_minus_callback(mode):
    seen = _run(_profiler(mode), 3)
    assert len(seen) == 3
    for m in seen:
        assert m["callback_time_sec"] > 0.0, m  # the burning callback was timed
        assert m["step_time_sec"] == pytest.approx(m["total_time_sec"] - m["callback_time_sec"], rel=1e-12, abs=1e-12)
        assert m["step_time_sec"] < m["total_time_sec"], m


def test_nvidia_reports_step_time_without_the_callback():
    seen = _run(_profiler("nvidia"), 3)
    assert len(seen) == 3
    for m in seen:
        assert "callback_time_sec" not in m  # nsys holds the detail; the step is still known
        assert 0.0 < m["step_time_sec"] < m["total_time_sec"], m


def test_torch_scheduled_mode_reports_step_time():
    seen = _run(_profiler("torch", per_step=False, active=2), 2)
    for m in seen:
        assert 0.0 < m["step_time_sec"] < m["total_time_sec"], m


@pytest.mark.parametrize("mode", ["custom", "torch", "nvidia"])
def test_step_time_only_inside_the_recording_window(mode):
    seen = _run(_profiler(mode, warmup=2, active=2), 6)
    assert len(seen) == 6
    assert [i for i, m in enumerate(seen) if "step_time_sec" in m] == [2, 3]
    assert all(seen[i] == {} for i in (0, 1, 4, 5))


def test_rank_reduction_takes_the_slowest_rank_step():
    # Rank 0's total is the largest but most of it is callback; rank 1's step is the longest.
    per_rank = [
        {"total_time_sec": 1.0, "callback_time_sec": 0.6, "step_time_sec": 0.4},
        {"total_time_sec": 0.9, "callback_time_sec": 0.1, "step_time_sec": 0.8},
    ]
    out = reduce_across_ranks(per_rank, ["total_time_sec"])
    assert out["step_time_sec"] == 0.8
    assert out["total_time_sec"] - out["callback_time_sec"] == pytest.approx(0.4)


def test_a_custom_region_named_step_is_refused_rather_than_overwriting_step_time():
    prof = create_profiler("custom", "cpu", "reserved")
    with pytest.raises(ValueError, match="'step' is reserved"):
        with prof.track_step("step"):
            pass
