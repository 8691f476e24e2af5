"""custom and null backends: accuracy, window, call order, files."""

from __future__ import annotations

import csv
import time

import pytest

from scopebench.profiler import create_profiler
from scopebench.profiler.backends import CustomProfiler, NullProfiler


def _run(prof, n, body, seen=None):
    """Run ``n`` iterations; ``seen[k]`` = metrics visible when iteration k+1 starts."""
    seen = [] if seen is None else seen
    calls = {"n": 0}

    def callback():
        if calls["n"] > 0:
            seen.append(prof.get_current_metrics())
        calls["n"] += 1
        return calls["n"] <= n

    for _ in prof.iterate(callback):
        body(prof)
    return seen


def _sleep(sec, log=None):
    """Sleep and log how long it really took (a loaded machine oversleeps)."""
    start = time.perf_counter()
    time.sleep(sec)
    if log is not None:
        log.append(time.perf_counter() - start)


def _two_regions(prof, truth=None):
    truth = {"alpha": [], "beta": []} if truth is None else truth
    with prof.track_step("alpha"):
        _sleep(0.020, truth["alpha"])
    with prof.track_step("beta"):
        _sleep(0.010, truth["beta"])
    time.sleep(0.005)  # untracked work inside the iteration


def test_custom_region_times_match_known_sleeps():
    prof = create_profiler("custom", "cpu", "acc")
    truth = {"alpha": [], "beta": []}
    seen = _run(prof, 5, lambda p: _two_regions(p, truth))
    assert len(seen) == 5
    for i, m in enumerate(seen):
        for region in ("alpha", "beta"):
            true_sec = truth[region][i]
            assert abs(m[f"{region}_time_sec"] - true_sec) <= max(0.05 * true_sec, 0.002), (region, m)
        assert m["total_time_sec"] >= m["alpha_time_sec"] + m["beta_time_sec"]
        assert m["untracked_time_sec"] >= 0.004
        assert m["max_gpu_mb"] == 0.0 and m["alpha_max_gpu_mb"] == 0.0
        assert m["max_rss_mb"] > 10.0


def test_callback_time_is_reported_and_inside_total():
    prof = create_profiler("custom", "cpu", "cb")
    seen = []
    calls = {"n": 0}

    def slow_callback():
        if calls["n"] > 0:
            seen.append(prof.get_current_metrics())
        calls["n"] += 1
        time.sleep(0.015)
        return calls["n"] <= 3

    for _ in prof.iterate(slow_callback):
        with prof.track_step("work"):
            time.sleep(0.005)
    for m in seen:
        assert m["callback_time_sec"] >= 0.014
        assert m["total_time_sec"] >= m["callback_time_sec"] + m["work_time_sec"]
        # The callback is counted once, apart from the body: total = regions + callback +
        # untracked (the callback never leaks into untracked), whatever the machine's speed.
        parts = m["work_time_sec"] + m["callback_time_sec"] + m["untracked_time_sec"]
        assert m["total_time_sec"] == pytest.approx(parts, rel=1e-9, abs=1e-12), m
        assert m["untracked_time_sec"] >= 0.0


def test_window_warmup_2_active_3_over_8_iterations():
    seen = []
    prof = create_profiler("custom", "cpu", "win", warmup=2, active=3)

    def body(p):
        with p.track_step("r"):
            pass

    _run(prof, 8, body, seen)  # the 9th callback call sees iteration 7
    assert len(seen) == 8
    assert prof.get_current_metrics() == {}
    recorded = [i for i, m in enumerate(seen) if m]
    assert recorded == [2, 3, 4]
    assert all(seen[i] == {} for i in (0, 1, 5, 6, 7))


def test_manual_end_iteration_without_iterate():
    prof = create_profiler("custom", "cpu", "manual", warmup=1)
    with prof.track_step("r"):
        pass
    prof.end_iteration()
    assert prof.get_current_metrics() == {}
    with prof.track_step("r"):
        time.sleep(0.002)
    prof.end_iteration()
    assert prof.get_current_metrics()["r_time_sec"] >= 0.0015


def test_repeated_region_accumulates():
    prof = create_profiler("custom", "cpu", "rep")
    for _ in range(3):
        with prof.track_step("r"):
            time.sleep(0.004)
    prof.end_iteration()
    assert prof.get_current_metrics()["r_time_sec"] >= 0.011


class RecordingOps:
    """Stands in for CUDA: records synchronisations and memory calls."""

    is_cuda = True

    def __init__(self):
        self.calls = []
        self.peak = 0.0

    def synchronize(self):
        self.calls.append("sync")

    def reset_peak_memory(self):
        self.calls.append("reset")
        self.peak = 0.0

    def max_memory_mb(self):
        self.calls.append("read")
        return self.peak


def test_custom_cuda_call_order_with_recorder():
    prof = create_profiler("custom", "cpu", "rec")
    prof.ops = ops = RecordingOps()
    prof._ensure_begun()
    ops.calls.clear()
    with prof.track_step("r"):
        ops.calls.append("body")
        ops.peak = 123.0
    assert ops.calls == ["sync", "read", "reset", "body", "sync", "read"]
    ops.peak = 7.0
    prof.end_iteration()
    m = prof.get_current_metrics()
    assert m["r_max_gpu_mb"] == 123.0
    assert m["max_gpu_mb"] == 123.0  # the region's peak survives the later reset


def test_null_profiler_is_a_no_op():
    prof = create_profiler(None, "cpu", "null", save_file=True)
    assert isinstance(prof, NullProfiler)
    prof.ops = ops = RecordingOps()
    seen = _run(prof, 4, _two_regions)
    assert seen == [{}] * 4
    assert ops.calls == []
    assert prof.finalize() == []


def test_files_are_per_run_and_never_overwritten(tmp_path):
    paths = []
    for _ in range(2):  # two runs started within the same second, same name
        prof = create_profiler("custom", "cpu", "same", save_file=True, output_dir=tmp_path)
        _run(prof, 3, _two_regions)
        paths += prof.finalize()
    assert len(set(paths)) == 2
    assert all(p.name.endswith("_rank0_gpu_metrics.csv") for p in paths)
    with open(paths[0]) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["iter"] for r in rows] == ["0", "1", "2"]
    assert float(rows[0]["alpha_time_sec"]) > 0.015
    assert not list(tmp_path.glob(".*.tmp"))


def test_no_file_without_save_file(tmp_path):
    prof = create_profiler("custom", "cpu", "nofile", output_dir=tmp_path)
    _run(prof, 2, _two_regions)
    assert prof.finalize() == []
    assert list(tmp_path.iterdir()) == []


def test_context_manager_finalizes(tmp_path):
    with create_profiler("custom", "cpu", "ctx", save_file=True, output_dir=tmp_path) as prof:
        _run(prof, 2, _two_regions)
    assert isinstance(prof, CustomProfiler)
    assert len(list(tmp_path.glob("ctx_*_gpu_metrics.csv"))) == 1


@pytest.mark.parametrize("mode", ["custom", "torch", "nvidia"])
def test_stop_before_any_iteration_leaves_nothing(mode, tmp_path):
    prof = create_profiler(mode, "cpu", "empty", save_file=True, output_dir=tmp_path)
    assert list(prof.iterate(lambda: False)) == []
    assert prof.finalize() == []
    assert prof.get_current_metrics() == {}


def test_minor_faults_count_sees_fresh_pages_touched_in_the_iteration():
    import mmap

    size = 16 * 2**20
    prof = create_profiler("custom", "cpu", "faults")
    counts = []
    for touch in (False, True, False):
        with prof.track_step("work"):
            if touch:  # a fresh anonymous mapping: every 4 KiB page faults once when written
                buf = mmap.mmap(-1, size)
                for offset in range(0, size, mmap.PAGESIZE):
                    buf[offset] = 1
                buf.close()
        prof.end_iteration()
        counts.append(prof.get_current_metrics()["minor_faults_count"])
    pages = size // mmap.PAGESIZE
    assert counts[1] >= 0.9 * pages, counts
    assert counts[0] < pages / 4 and counts[2] < pages / 4, counts


def test_custom_reports_its_own_time_outside_the_clock():
    seen = _run(create_profiler("custom", "cpu", "own"), 3, _two_regions)
    for m in seen:
        assert 0.0 < m["profiler_overhead_sec"] < m["total_time_sec"], m


def _busy(sec):
    """Spin for ``sec`` (a sleep could return late and hand the CPU away; a spin is work)."""
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("hook", ["_enter_region", "_exit_region"])
def test_custom_measures_its_own_cost_inside_the_clock(hook, monkeypatch):
    """A region hook slowed by 5 ms makes ``profiler_inside_sec`` grow by 5 ms per region (two
    regions: 10 ms); without it the bookkeeping is microseconds. The host sampler is off: a spin
    holds the GIL, and the sampler thread's turns with it would land in whatever the spin times."""
    monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", "0")
    base = _run(create_profiler("custom", "cpu", "inside"), 3, _two_regions)
    slowed = getattr(CustomProfiler, hook)

    def slow(self, *args):
        _busy(0.005)
        return slowed(self, *args)

    monkeypatch.setattr(CustomProfiler, hook, slow)
    seen = _run(create_profiler("custom", "cpu", "inside"), 3, _two_regions)
    for before, m in zip(base, seen):
        assert 0.0 < before["profiler_inside_sec"] < 0.002, before
        # the two spins at least; had it counted the regions' 30 ms of sleep as well, 40 ms at least
        assert 0.010 <= m["profiler_inside_sec"] < 0.035, m
        assert m["profiler_inside_sec"] < m["step_time_sec"]  # inside the clock: part of the step
        assert m["profiler_overhead_sec"] < 0.005, m  # not counted outside as well


def test_custom_reports_the_sampler_thread_cpu(monkeypatch):
    monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", "0.01")
    prof = create_profiler("custom", "cpu", "sampler")
    seen = _run(prof, 4, _two_regions)
    prof.finalize()
    cpu = [m["profiler_sampler_cpu_sec"] for m in seen]
    assert all(0.0 <= c < m["total_time_sec"] for c, m in zip(cpu, seen)), cpu
    assert sum(cpu) > 0.0, cpu  # about three samples per 35 ms iteration, each /proc reads
    monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", "0")
    assert all(
        "profiler_sampler_cpu_sec" not in m for m in _run(create_profiler("custom", "cpu", "off"), 2, _two_regions)
    )


@pytest.mark.parametrize("save_file", [False, True])
def test_rows_are_kept_only_when_they_will_be_written(save_file, tmp_path):
    prof = create_profiler("custom", "cpu", "rows", save_file=save_file, output_dir=tmp_path)
    _run(prof, 4, lambda p: None)
    assert len(prof.rows) == (4 if save_file else 0)
    prof.finalize()
