"""The custom backend's per-iteration path (issue 47): what it skips, and that nothing changes.

Its cost is measured by ``perf/profiler_overhead.py`` (item 6, against a minimal timer); these
tests hold what the cheaper path must keep: a region nested in itself, the profiler freed when
its run ends, the sampler's clock read only after a new sample, the sampler's period read once.
"""

from __future__ import annotations

import gc
import time
import weakref

from scopebench.profiler import create_profiler
from scopebench.profiler import sampler as sampler_module
from scopebench.profiler.backends import CustomProfiler
from scopebench.profiler.sampler import HostSampler

HOUR = 3600.0  # a period the thread never reaches: the test takes every sample itself


def _spin(sec: float) -> None:
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        pass


def test_a_region_nested_in_itself_counts_both_in_every_iteration():
    """After its first iteration a region's object is reused; the inner one of the same name
    gets its own, so the outer keeps its start and both are counted, as in the first."""
    prof = create_profiler("custom", "cpu", "nested")
    prof.keep_rows = True

    def body(p):
        with p.track_step("a"):
            _spin(0.002)
            with p.track_step("a"):
                _spin(0.002)

    calls = iter(range(5))
    for _ in prof.iterate(lambda: next(calls) < 4):
        body(prof)
    prof.finalize()
    assert len(prof.rows) == 4
    for row in prof.rows:
        assert row["a_time_sec"] >= 0.006, row  # outer (4 ms) + inner (2 ms), both counted
        assert row["a_time_sec"] <= row["step_time_sec"] * 2, row


def test_the_custom_backend_skips_its_idle_hooks_on_cpu_and_runs_a_replaced_one(monkeypatch):
    prof = create_profiler("custom", "cpu", "idle")
    with prof.track_step("a"):
        pass
    assert prof._idle_hooks
    prof.end_iteration()
    assert type(prof.track_step("a")).__name__ == "IdleRegion"
    prof.finalize()
    monkeypatch.setattr(CustomProfiler, "_exit_region", lambda self, name, token: None)
    prof = create_profiler("custom", "cpu", "replaced")
    with prof.track_step("a"):
        pass
    prof.end_iteration()
    assert not prof._idle_hooks and type(prof.track_step("a")).__name__ == "Region"
    prof.finalize()


def test_a_finalized_profiler_is_freed_without_the_garbage_collector():
    """Its reused regions refer back to it: the run's end drops them, so no cycle is left for the
    collector to free later, in whichever thread it happens to run (the sampler's, once)."""
    gc.disable()
    try:
        prof = create_profiler("custom", "cpu", "freed")
        for _ in range(3):
            with prof.track_step("a"):
                pass
            prof.end_iteration()
        prof.finalize()
        ref = weakref.ref(prof)
        del prof
        assert ref() is None
    finally:
        gc.enable()


def test_the_sampler_stopped_from_its_own_thread_ends_without_an_error():
    """A dropped profiler collected in the sampler's thread stops the sampler from there."""
    sampler = HostSampler("cpu", period_sec=0.01)
    errors: list[BaseException] = []
    sampler.start()
    thread = sampler._thread
    take = sampler.sample

    def sample_then_stop():
        take()
        try:
            sampler.stop()
        except BaseException as exc:  # noqa: BLE001 -- the test reports it below
            errors.append(exc)
            raise

    sampler.sample = sample_then_stop
    thread.join(timeout=60)
    assert not thread.is_alive() and errors == [] and not sampler.running
    assert sampler.thread_cpu_sec is not None


def test_the_sampler_thread_clock_is_read_only_after_a_new_sample(monkeypatch):
    sampler = HostSampler("cpu", period_sec=HOUR)
    sampler.start()
    reads = []
    clock = sampler.cpu_sec
    monkeypatch.setattr(sampler, "cpu_sec", lambda: reads.append(1) or clock())
    try:
        seen = []
        for _ in range(4):
            out: dict = {}
            sampler.thread_cpu_into(out)
            seen.append(out["profiler_sampler_cpu_sec"])
        assert len(reads) == 1 and seen[1:] == [0.0, 0.0, 0.0], (reads, seen)
        sampler.sample()  # a new sample: the next iteration reads the clock again
        out = {}
        sampler.thread_cpu_into(out)
        assert len(reads) == 2 and out["profiler_sampler_cpu_sec"] >= 0.0
    finally:
        sampler.stop()


def test_with_the_sampler_off_its_period_is_read_once_per_run(monkeypatch):
    monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", "0")
    asked = []
    period = sampler_module.sampler_period
    monkeypatch.setattr(sampler_module, "sampler_period", lambda *a: asked.append(1) or period(*a))
    prof = create_profiler("custom", "cpu", "off")
    asked.clear()  # building the profiler validates the variable
    for _ in range(5):
        with prof.track_step("a"):
            pass
        prof.end_iteration()
    prof.finalize()
    assert prof.sampler is None and len(asked) == 1
    assert "profiler_sampler_cpu_sec" not in prof.last_local


def test_the_one_rank_path_keeps_every_row_and_column(tmp_path):
    """One rank without the ledger skips the exchange's machinery: the rows, the reduced rows
    and what get_current_metrics shows are what the exchange made of them."""
    prof = create_profiler("custom", "cpu", "rows", save_file=True, output_dir=tmp_path)
    shown = []
    calls = iter(range(5))

    def callback():
        shown.append(prof.get_current_metrics())
        return next(calls) < 4

    for _ in prof.iterate(callback):
        with prof.track_step("a"):
            pass
    prof.finalize()
    assert [row["iter"] for row in prof.rows] == [0, 1, 2, 3] and {row["rank"] for row in prof.rows} == {0}
    assert [dict(row, iter=None, rank=None) for row in prof.rows] == [
        dict(m, iter=None, rank=None) for m in prof.reduced_rows
    ]
    assert shown[1:] == prof.reduced_rows


def test_short_iterations_share_a_usage_reading_and_the_faults_add_up(monkeypatch):
    """The process's resource usage is read at an iteration's end only when ``USAGE_PERIOD_SEC``
    passed since the last reading: iterations of microseconds share one (the faults land on the
    iteration that reads them, the others show 0), one of a millisecond or more reads its own,
    and the column's sum over the window is every fault since the window began."""
    from scopebench.profiler import backends

    faults = {"n": 1000}
    reads = []

    class Usage:
        def __init__(self):
            self.ru_minflt = faults["n"]
            self.ru_maxrss = 2048

    def fake_getrusage(who):
        reads.append(faults["n"])
        return Usage()

    monkeypatch.setattr(backends, "getrusage", fake_getrusage)
    prof = create_profiler("custom", "cpu", "usage")
    prof.keep_rows = True
    short, long = 2000, 3
    steps = iter(range(short + long + 1))
    for i in prof.iterate(lambda: next(steps) < short + long):
        with prof.track_step("a"):
            faults["n"] += 3  # what the iteration faulted
            if i >= short:
                _spin(2 * backends.USAGE_PERIOD_SEC)
    prof.finalize()
    counts = [row["minor_faults_count"] for row in prof.rows]
    assert len(counts) == short + long
    assert sum(counts) == reads[-1] - reads[0], (sum(counts), reads[0], reads[-1])
    assert reads[-1] == faults["n"]  # the last (long) iteration read at its end
    # a long iteration after a long one: exactly its own (the first also carries the short ones' since
    # their last reading)
    assert counts[-long + 1 :] == [3] * (long - 1) and counts[-long] >= 3, counts[-long:]
    assert len(reads) < short / 4, len(reads)  # short ones share readings
    assert 0 in counts[:short] and max(counts[:short]) > 3, counts[:short]
    assert {row["max_rss_mb"] for row in prof.rows} == {2048 * backends._RSS_TO_MB}


def test_a_row_copied_from_the_last_one_has_exactly_this_iteration_s_regions():
    """Off CUDA a row starts as a copy of the last row of the same regions: a region that did not
    run has no column, one that runs again gets its own time, and each row's columns are those a
    row built afresh has, in the same order (the column order of the run's CSV)."""
    prof = create_profiler("custom", "cpu", "layout")
    prof.keep_rows = True
    plans = [("a", "b"), ("a",), ("a", "b"), ("b", "a"), (), ("a", "b"), ("a", "b", "c"), ("a", "b")]
    steps = iter(range(len(plans) + 1))
    spins = {"a": 0.001, "b": 0.003, "c": 0.002}
    for i in prof.iterate(lambda: next(steps) < len(plans)):
        for name in plans[i]:
            with prof.track_step(name):
                _spin(spins[name])
    prof.finalize()
    fixed = [
        "total_time_sec",
        "step_time_sec",
        "callback_time_sec",
        "untracked_time_sec",
        "max_gpu_mb",
        "max_rss_mb",
        "minor_faults_count",
    ]
    tail = ["profiler_inside_sec", "profiler_sampler_cpu_sec", "profiler_overhead_sec"]
    for plan, row in zip(plans, prof.rows):
        regions = [
            f"{name}_{col}"
            for name in (plan if plan != ("b", "a") else ("a", "b"))
            for col in ("time_sec", "max_gpu_mb")
        ]
        assert list(row)[2:] == fixed + regions + tail, (plan, list(row))
        for name, sec in spins.items():
            if name in plan:
                assert sec <= row[f"{name}_time_sec"] <= row["step_time_sec"], (plan, name, row)
                assert row[f"{name}_max_gpu_mb"] == 0.0
        regions_sum = sum(row[f"{name}_time_sec"] for name in plan)
        assert row["untracked_time_sec"] == max(row["total_time_sec"] - row["callback_time_sec"] - regions_sum, 0.0)
        assert row["step_time_sec"] == row["total_time_sec"] - row["callback_time_sec"]


def test_an_iteration_without_a_new_sample_copies_the_sampler_s_last_columns(monkeypatch):
    """After an iteration that computed the sampler's columns for its sample, the next ones that
    begin and end at that sample take them as they are (``HostSampler.steady``) without a call;
    an iteration during which a sample was taken computes its own, as every one did before."""
    monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", str(HOUR))  # the test takes every sample
    prof = create_profiler("custom", "cpu", "steady")
    prof.keep_rows = True
    computed = []
    sampled_in = {3, 7}
    steps = iter(range(11))
    for i in prof.iterate(lambda: next(steps) < 10):
        if i == 0:  # the window began: the sampler exists, its first sample taken
            window_into = prof.sampler.window_into
            monkeypatch.setattr(
                prof.sampler,
                "window_into",
                lambda out, *a: computed.append(prof.iteration - 1) or window_into(out, *a),  # counted on already
            )
        with prof.track_step("a"):
            _spin(0.06)  # the CPU ticks a share needs, over two iterations
            if i in sampled_in:
                prof.sampler.sample()
    prof.finalize()
    # computed: the first iteration, each that saw a sample, and the one after it (a new mark)
    assert computed == [0, 3, 4, 7, 8], computed
    rows = prof.rows
    for i, row in enumerate(rows):
        assert row["profiler_sampler_cpu_sec"] >= 0.0
        if i not in computed:  # copied: the columns of the last iteration that computed them
            last = max(k for k in computed if k < i)
            expected = {k: v for k, v in rows[last].items() if k.startswith("host_")}
            assert {k: v for k, v in row.items() if k.startswith("host_")} == expected, (i, row)
            assert row["profiler_sampler_cpu_sec"] == 0.0
    assert any(k.startswith("host_") for k in rows[5]), rows[5]  # a sample 0.06 s after its last
