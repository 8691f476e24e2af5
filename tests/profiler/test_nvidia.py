"""nvidia backend: CPU fallback and the CUDA call order (with recorders)."""

from __future__ import annotations

import warnings

import pytest

import scopebench.profiler.nvidia as nvidia_mod
from scopebench.profiler import ProfilerConfig
from scopebench.profiler.nvidia import NvidiaProfiler


class RecordingMarkers:
    capture_active = True

    def __init__(self):
        self.calls = []

    def range_push(self, name):
        self.calls.append(f"push:{name}")

    def range_pop(self):
        self.calls.append("pop")

    def profiler_start(self):
        self.calls.append("start")

    def profiler_stop(self):
        self.calls.append("stop")


def _loop(prof, n):
    calls = {"n": 0}

    def callback():
        calls["n"] += 1
        return calls["n"] <= n

    for _ in prof.iterate(callback):
        with prof.track_step("denoise"):
            pass
    prof.finalize()


def test_call_order_start_at_window_begin_stop_after_last():
    rec = RecordingMarkers()
    prof = NvidiaProfiler(ProfilerConfig(mode="nvidia", warmup=1, active=2), markers=rec)
    _loop(prof, 5)
    assert rec.calls == [
        "start",
        "push:iter_1",
        "push:denoise",
        "pop",
        "pop",
        "push:iter_2",
        "push:denoise",
        "pop",
        "pop",
        "stop",
    ]


def test_open_window_stops_capture_at_finalize():
    rec = RecordingMarkers()
    prof = NvidiaProfiler(ProfilerConfig(mode="nvidia", warmup=2), markers=rec)
    _loop(prof, 3)
    assert rec.calls == ["start", "push:iter_2", "push:denoise", "pop", "pop", "stop"]


def test_early_stop_inside_window_still_stops_capture():
    rec = RecordingMarkers()
    prof = NvidiaProfiler(ProfilerConfig(mode="nvidia", warmup=0, active=10), markers=rec)
    _loop(prof, 1)
    assert rec.calls[0] == "start" and rec.calls[-1] == "stop"
    assert rec.calls.count("push:iter_0") == 1
    assert rec.calls.count("stop") == 1
    # no range is opened for the iteration the callback declined; pushes and pops balance
    assert "push:iter_1" not in rec.calls
    assert sum(c.startswith("push") for c in rec.calls) == rec.calls.count("pop")


def test_cpu_fallback_runs_reports_total_and_warns_once(monkeypatch):
    monkeypatch.setattr(nvidia_mod, "_warned", False)
    with pytest.warns(RuntimeWarning, match="without CUDA") as record:
        prof = NvidiaProfiler(ProfilerConfig(mode="nvidia"))
    assert len(record) == 1
    seen = []
    calls = {"n": 0}

    def callback():
        if calls["n"]:
            seen.append(prof.get_current_metrics())
        calls["n"] += 1
        return calls["n"] <= 2

    for _ in prof.iterate(callback):
        with prof.track_step("denoise"):
            pass
    assert all(m["total_time_sec"] > 0 and m["max_gpu_mb"] == 0.0 for m in seen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NvidiaProfiler(ProfilerConfig(mode="nvidia"))  # second one: silent
