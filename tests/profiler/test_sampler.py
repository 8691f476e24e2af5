"""The host sampler (:mod:`scopebench.profiler.sampler`, :mod:`scopebench.host_load`): a thread
only inside the window, its own CPU cost, the CPU shares on a fake ``/proc``, and the NVML
paths with a recorder standing in for ``pynvml``."""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
from types import SimpleNamespace

import pytest
from test_host import FakeNVML, missing_pynvml

from scopebench.host_load import CLK_TCK, OwnTime, read_cpu_times, usable_cpus
from scopebench.profiler import create_profiler
from scopebench.profiler.sampler import (
    GPU_COLUMNS,
    MIN_INTERVAL_TICKS,
    THREAD_NAME,
    HostSampler,
    sampler_period,
    throttle_names,
)

HOUR = 3600.0  # a period the thread never reaches: the test takes every sample itself


def sampler_threads(exclude: frozenset = frozenset()) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t not in exclude]


def run_loop(mode: str, n: int = 6, warmup: int = 1, active: int = 2) -> list[int]:
    """Run a profiler loop; return how many sampler threads it had in each iteration (threads
    of profilers that other tests dropped, not yet collected, are not counted)."""
    before = frozenset(sampler_threads())
    prof = create_profiler(mode, "cpu", "sampler", warmup=warmup, active=active)
    seen = []
    calls = iter(range(n + 1))
    for _ in prof.iterate(lambda: next(calls) < n):
        with prof.track_step("work"):
            seen.append(len(sampler_threads(before)))
    prof.finalize()
    seen.append(len(sampler_threads(before)))
    return seen


def test_a_profiler_dropped_inside_its_window_stops_its_thread():
    before = frozenset(sampler_threads())
    prof = create_profiler("custom", "cpu", "sampler", warmup=0, active=0)
    loop = prof.iterate(None)
    next(loop)  # the window is open: its thread runs
    (thread,) = sampler_threads(before)
    del loop, prof  # never finalized
    gc.collect()
    thread.join(timeout=60)
    assert not thread.is_alive()


# --- the thread and the window ----------------------------------------------------------


def test_a_thread_only_inside_the_window():
    assert run_loop("custom", n=6, warmup=1, active=2) == [0, 1, 1, 0, 0, 0, 0]


def test_the_thread_ends_with_the_run_when_the_window_is_open_ended():
    assert run_loop("custom", n=3, warmup=0, active=0) == [1, 1, 1, 0]


@pytest.mark.parametrize("mode", ["null", None])
def test_no_sampler_thread_with_the_profiler_off(mode):
    assert run_loop(mode, n=4, warmup=0, active=0) == [0, 0, 0, 0, 0]
    prof = create_profiler(mode, "cpu")
    assert prof.sampler is None


def test_the_period_is_validated_and_zero_turns_it_off(monkeypatch):
    assert sampler_period({}) == 0.1 and sampler_period({"SCOPEBENCH_SAMPLER_PERIOD_SEC": "0.5"}) == 0.5
    for bad in ("-1", "fast", "0.001"):
        with pytest.raises(ValueError, match=f"SCOPEBENCH_SAMPLER_PERIOD_SEC must be 0 .* got '{bad}'"):
            sampler_period({"SCOPEBENCH_SAMPLER_PERIOD_SEC": bad})
    monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", "fast")
    with pytest.raises(ValueError, match="SCOPEBENCH_SAMPLER_PERIOD_SEC"):
        create_profiler("custom", "cpu")  # refused when the profiler is built, before any iteration
    create_profiler("null", "cpu")  # no sampler, nothing to refuse
    monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", "0")
    assert run_loop("custom", n=2, warmup=0, active=0) == [0, 0, 0]


def test_cpu_columns_on_a_real_run():
    prof = create_profiler("custom", "cpu", "sampler", warmup=0, active=0)
    prof.keep_rows = True
    calls = iter(range(4))
    for _ in prof.iterate(lambda: next(calls) < 3):
        with prof.track_step("work"):
            first = prof.sampler.samples_taken
            while prof.sampler.samples_taken < first + 2:  # two periods pass inside the iteration
                time.sleep(0.01)
    prof.finalize()
    for row in prof.rows:
        assert 0.0 <= row["host_other_cpu_pct"] <= 100.0 and 0.0 <= row["host_steal_pct"] <= 100.0
        assert not set(GPU_COLUMNS) & row.keys()  # a CPU run: no GPU column, never a 0
    assert prof.sampler.reasons == {"gpu": "cpu is not a CUDA device"}


# --- CPU shares on a fake /proc -----------------------------------------------------------


class FakeProc:
    """A fake ``/proc``: ``stat`` over the usable CPUs, ``uptime`` and per-pid ``stat`` files."""

    def __init__(self, root):
        self.root = root
        self.cpus = usable_cpus()
        (root / "proc").mkdir()
        self.uptime = 1000.0

    def write(self, busy: int, idle: int, steal: int = 0, procs: dict[int, tuple] = ()):
        """Per CPU ``busy`` (user) / ``idle`` / ``steal`` ticks; ``procs``: pid -> (pgrp, ticks,
        starttime[, ppid, ticks of the children it waited for]). A pid no longer in ``procs`` is gone."""
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        lines += [f"cpu{c} {busy} 0 0 {idle} 0 0 0 {steal} 0 0" for c in self.cpus]
        (self.root / "proc/stat").write_text("\n".join(lines) + "\nintr 1 2 3\n")
        (self.root / "proc/uptime").write_text(f"{self.uptime} 0\n")
        procs = dict(procs)
        for folder in (self.root / "proc").iterdir():
            if folder.name.isdigit() and int(folder.name) not in procs:
                shutil.rmtree(folder)
        for pid, (pgrp, ticks, born, *rest) in procs.items():
            ppid, waited = rest if rest else (1, 0)
            folder = self.root / f"proc/{pid}"
            folder.mkdir(exist_ok=True)
            fields = ["S", str(ppid), str(pgrp)] + ["0"] * 8 + [str(ticks), "0", str(waited)] + ["0"] * 5 + [str(born)]
            (folder / "stat").write_text(f"{pid} (py (thon)) " + " ".join(fields) + "\n")


def test_other_share_is_busy_minus_the_run_over_total(tmp_path):
    proc, n = FakeProc(tmp_path), len(usable_cpus())
    proc.write(busy=100, idle=100, procs={10: (7, 50, 1), 11: (8, 30, 1)})  # 11: not the run
    sampler = HostSampler("cpu", HOUR, pgids={7}, root=tmp_path)
    sampler.start()
    mark = sampler.mark()
    # Per CPU 100 more ticks: 60 busy (of which the run took 30 in all), 40 idle, 10 stolen.
    proc.write(busy=160, idle=130, steal=10, procs={10: (7, 50 + 30 * n, 1), 11: (8, 99, 1)})
    sampler.sample()
    out = sampler.window(mark, 1.0)
    sampler.stop()
    assert out["host_other_cpu_pct"] == pytest.approx((60 * n - 30 * n) / (100 * n) * 100.0)
    assert out["host_steal_pct"] == pytest.approx(10.0)


def test_a_process_of_the_run_born_later_is_the_runs_from_its_birth(tmp_path):
    proc = FakeProc(tmp_path)
    proc.write(busy=100, idle=100, procs={10: (7, 0, 1)})
    own = OwnTime({7}, tmp_path, rescan_sec=0.0)
    assert own.read() == 0
    proc.uptime = 2000.0
    # A dataloader worker of the run, born after the first scan, already used 40 ticks.
    proc.write(busy=200, idle=100, procs={10: (7, 5, 1), 12: (7, 40, int(1500 * CLK_TCK))})
    assert own.read() == 5 + 40
    assert set(own.known) == {10, 12}


def test_a_worker_that_exits_between_readings_counts_once_through_its_parents_cutime(tmp_path):
    proc = FakeProc(tmp_path)
    proc.write(busy=100, idle=100, procs={10: (7, 0, 1), 12: (7, 0, 1, 10, 0)})
    own = OwnTime({7}, tmp_path, rescan_sec=3600.0)
    proc.write(busy=200, idle=100, procs={10: (7, 5, 1), 12: (7, 30, 1, 10, 0)})
    assert own.read() == 5 + 30
    # The worker ran 20 more ticks and exited; the parent reaped it: cutime holds its 50.
    proc.write(busy=300, idle=100, procs={10: (7, 8, 1, 1, 50)})
    assert own.read() == 8 + 50
    # A parent that reaps its child only after the child's pid went: the rest comes then.
    proc.write(busy=300, idle=100, procs={10: (7, 8, 1, 1, 50), 13: (7, 10, 1, 10, 0)})
    own.read(rescan=True)
    base = own.read()
    proc.write(busy=300, idle=100, procs={10: (7, 8, 1, 1, 50)})  # gone, not reaped yet
    assert own.read() == base
    proc.write(busy=300, idle=100, procs={10: (7, 9, 1, 1, 50 + 14)})  # reaped: 10 seen + 4 unseen
    assert own.read() == base + 1 + 4


def test_a_worker_born_and_gone_between_scans_is_the_runs_through_its_parent(tmp_path):
    proc = FakeProc(tmp_path)
    proc.write(busy=100, idle=100, procs={10: (7, 0, 1)})
    own = OwnTime({7}, tmp_path, rescan_sec=3600.0)
    proc.write(busy=200, idle=100, procs={10: (7, 4, 1, 1, 60)})  # a worker never scanned: 60 ticks
    assert own.read() == 4 + 60


def test_a_child_in_another_group_is_never_the_runs_not_even_when_its_parent_reaps_it(tmp_path):
    """A process of the run that starts a helper in its own session (a test's busy loop, a
    daemon) and reaps it: the helper's time was another's while it ran; the parent's cutime then
    takes all of it at once, which must not count as the run's (CI: a pytest worker reaped two
    busy loops while the other worker's tool ran, whose sampler read 0.8 % other CPU)."""
    proc = FakeProc(tmp_path)
    proc.write(busy=100, idle=100, procs={10: (7, 0, 1), 20: (99, 500, 1, 10, 0)})  # 20: the helper
    own = OwnTime({7}, tmp_path, rescan_sec=3600.0)
    proc.write(busy=200, idle=100, procs={10: (7, 5, 1), 20: (99, 800, 1, 10, 0)})
    assert own.read() == 5
    proc.write(busy=300, idle=100, procs={10: (7, 7, 1, 1, 830)})  # it ran 30 more, then was reaped
    assert own.read() == 7 + 30  # only its time since the last reading is lost to the run
    # A helper gone but not yet reaped: the parent's cutime jumps later, and is not the run's then.
    proc.write(busy=300, idle=100, procs={10: (7, 7, 1, 1, 830), 21: (99, 40, 1, 10, 0)})
    own.read(rescan=True)
    base = own.read()
    proc.write(busy=300, idle=100, procs={10: (7, 7, 1, 1, 830)})
    assert own.read() == base
    proc.write(busy=300, idle=100, procs={10: (7, 8, 1, 1, 830 + 40)})
    assert own.read() == base + 1


def test_a_busy_interval_makes_the_sampler_scan_for_the_runs_new_processes(tmp_path):
    proc, n = FakeProc(tmp_path), len(usable_cpus())
    proc.write(busy=0, idle=100, procs={10: (7, 0, 1)})
    sampler = HostSampler("cpu", HOUR, pgids={7}, root=tmp_path)
    sampler.start()
    sampler._own.rescan_sec = 3600.0  # no periodic scan in this test
    mark = sampler.mark()
    proc.uptime = 2000.0
    # A dataloader worker born after the first scan took every CPU busy tick of the interval.
    proc.write(busy=50, idle=150, procs={10: (7, 0, 1), 12: (7, 50 * n, int(1500 * CLK_TCK), 10, 0)})
    sampler.sample()
    out = sampler.window(mark, 1.0)
    assert out["host_other_cpu_pct"] == pytest.approx(0.0) and 12 in sampler._own.known
    # A quiet interval scans nothing: a process of the run born then waits for the periodic scan.
    mark = sampler.mark()
    proc.write(busy=50, idle=250, procs={10: (7, 0, 1), 12: (7, 50 * n, 1), 14: (7, 0, int(1900 * CLK_TCK))})
    sampler.sample()
    sampler.stop()
    assert sampler.window(mark, 1.0)["host_other_cpu_pct"] == pytest.approx(0.0) and 14 not in sampler._own.known


def test_an_interval_of_few_ticks_reaches_back_to_enough_ticks_for_a_cpu_share(tmp_path):
    proc, n = FakeProc(tmp_path), len(usable_cpus())
    per_cpu = -(-MIN_INTERVAL_TICKS // n)  # ticks per CPU that make MIN_INTERVAL_TICKS over them all
    proc.write(busy=0, idle=0)
    sampler = HostSampler("cpu", HOUR, root=tmp_path)
    sampler.start()
    mark = sampler.mark()
    proc.write(busy=0, idle=per_cpu - 1)  # one tick short on each CPU: no share, not a rounding
    sampler.sample()
    assert "host_other_cpu_pct" not in sampler.window(mark, 0.01)
    mark = sampler.mark()
    proc.write(busy=1, idle=per_cpu - 1)  # one busy tick per CPU: alone a 100 % interval
    sampler.sample()
    out = sampler.window(mark, 0.01)
    sampler.stop()
    # measured from the first sample: per_cpu ticks of which 1 busy, on each CPU
    assert out["host_other_cpu_pct"] == pytest.approx(100.0 / per_cpu)


def test_no_proc_stat_gives_no_cpu_column_with_the_reason(tmp_path):
    (tmp_path / "proc").mkdir()
    assert read_cpu_times([0], tmp_path) is None
    sampler = HostSampler("cpu", HOUR, root=tmp_path)
    sampler.start()
    mark = sampler.mark()
    sampler.sample()
    out = sampler.window(mark, 1.0)
    sampler.stop()
    assert out == {}
    assert "no " in sampler.reasons["host_other_cpu_pct"] and "proc/stat" in sampler.reasons["host_other_cpu_pct"]


def test_a_short_iteration_gets_the_last_full_interval_and_the_first_gets_nothing(tmp_path):
    proc = FakeProc(tmp_path)
    proc.write(busy=0, idle=100)
    sampler = HostSampler("cpu", HOUR, root=tmp_path)
    sampler.start()
    assert sampler.window(sampler.mark(), 0.01) == {}  # no full interval yet: absent, not 0
    proc.write(busy=50, idle=150)
    sampler.sample()
    mark = sampler.mark()
    # No sample inside this iteration: the interval that ended at its start stands for it.
    assert sampler.window(mark, 0.01)["host_other_cpu_pct"] == pytest.approx(50.0)
    sampler.stop()


# --- NVML through a recorder ------------------------------------------------------------


def gpu_sampler(nvml, **kw) -> HostSampler:
    sampler = HostSampler("cuda:0", HOUR, load_nvml=lambda: nvml, cuda=True, **kw)
    sampler.start()
    return sampler


def test_gpu_columns_from_nvml(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML(
        processes=[SimpleNamespace(pid=os.getpid(), usedGpuMemory=1), SimpleNamespace(pid=4242, usedGpuMemory=2)]
    )
    nvml.energy_step_mj = 500.0  # 0.5 J per reading
    sampler = gpu_sampler(nvml)
    mark = sampler.mark()
    nvml.util, nvml.throttle = 55, 4  # sw_power_cap
    sampler.sample()
    nvml.util, nvml.throttle, nvml.temp_c = 65, 64 | 1, 80  # hw_thermal (and idle)
    sampler.sample()
    out = sampler.window(mark, wall_sec=2.0)
    sampler.stop()
    assert out["gpu_util_pct"] == pytest.approx(60.0)  # the mean of the samples inside
    assert out["gpu_sm_clock_mhz"] == 1755 and out["gpu_sm_clock_max_mhz"] == 1980
    assert out["gpu_power_w"] == pytest.approx(250.0)
    assert out["gpu_temp_c"] == 80 and out["gpu_mem_used_mb"] == 3072.0
    assert out["gpu_throttle"] == 4 | 64 | 1 and throttle_names(out["gpu_throttle"]) == ["sw_power_cap", "hw_thermal"]
    elapsed = sampler._samples[-1][1] - sampler._samples[0][1]
    assert out["gpu_energy_j"] == pytest.approx(1.0 / elapsed * 2.0)  # mean power times the iteration
    assert out["gpu_other_procs_count"] == 1  # this process is the run's, 4242 is not
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert "gpu" not in sampler.reasons


def test_a_gpu_signal_nvml_does_not_support_is_absent_with_the_reason(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML(
        raising={"nvmlDeviceGetTotalEnergyConsumption": "Not Supported", "nvmlDeviceGetPowerUsage": "No Permission"}
    )
    sampler = gpu_sampler(nvml)
    mark = sampler.mark()
    sampler.sample()
    sampler.sample()
    out = sampler.window(mark, 1.0)
    sampler.stop()
    assert "gpu_energy_j" not in out and "gpu_power_w" not in out and out["gpu_util_pct"] == 45
    assert sampler.reasons["gpu_energy_j"] == "nvmlDeviceGetTotalEnergyConsumption: Not Supported"
    assert sampler.reasons["gpu_power_w"] == "nvmlDeviceGetPowerUsage: No Permission"
    assert nvml.calls.count("nvmlDeviceGetTotalEnergyConsumption") == 1  # not asked again every period


@pytest.mark.parametrize(
    "nvml, reason",
    [
        (missing_pynvml, "pynvml not installed"),
        (lambda: FakeNVML(raising={"nvmlInit": "Driver Not Loaded"}), "NVML init failed: Driver Not Loaded"),
        (lambda: FakeNVML(raising={"nvmlDeviceGetCount": "Unknown Error"}), "NVML query failed: Unknown Error"),
    ],
)
def test_without_nvml_the_gpu_columns_are_absent_never_zero(nvml, reason, monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    proc = FakeProc(tmp_path)
    proc.write(busy=0, idle=100)
    sampler = HostSampler("cuda:0", HOUR, load_nvml=nvml, cuda=True, root=tmp_path)
    sampler.start()
    mark = sampler.mark()
    proc.write(busy=10, idle=190)
    sampler.sample()
    out = sampler.window(mark, 1.0)
    sampler.stop()
    assert not set(GPU_COLUMNS) & out.keys() and "host_other_cpu_pct" in out
    assert sampler.reasons["gpu"].startswith(reason)


def test_a_device_cuda_does_not_see(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nvml = FakeNVML()
    sampler = HostSampler("cuda:1", HOUR, load_nvml=lambda: nvml, cuda=True)
    sampler.start()
    sampler.stop()
    assert sampler.reasons["gpu"] == "cuda:1 is not a GPU CUDA sees"
    assert nvml.calls[-1] == "nvmlShutdown"


def test_ranks_or_their_throttle_bits_and_sum_their_energy():
    per_rank = [{"gpu_throttle": 4.0, "gpu_energy_j": 1.5}, {"gpu_throttle": 64.0, "gpu_energy_j": 2.0}, {}]
    assert HostSampler.cross_rank(per_rank) == {"gpu_throttle": 68.0, "gpu_energy_j": 3.5}
    assert HostSampler.cross_rank([{}, {}]) == {}


def test_the_recorder_matches_the_pynvml_api_of_the_sampler(monkeypatch):
    """Canary: every function the sampler calls exists in the real module."""
    pynvml = pytest.importorskip("pynvml", reason="pynvml (nvidia-ml-py) is optional and not installed here")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML()
    sampler = gpu_sampler(nvml)
    sampler.sample()
    sampler.stop()
    names = set(nvml.calls) | {"NVMLError", "NVML_CLOCK_SM", "NVML_TEMPERATURE_GPU"}
    assert [name for name in names if not hasattr(pynvml, name)] == []


@pytest.mark.gpu
def test_real_nvml_sampler_on_a_gpu():
    import pynvml  # noqa: F401  (nvidia-ml-py is a dev dependency: missing here is a failure)

    sampler = HostSampler("cuda", 0.1)
    sampler.start()
    mark = sampler.mark()
    while sampler.samples_taken < 3:
        time.sleep(0.05)
    out = sampler.window(mark, 0.2)
    sampler.stop()
    assert "gpu" not in sampler.reasons, sampler.reasons
    assert set(GPU_COLUMNS) <= out.keys() | sampler.reasons.keys()  # each column present or explained
    assert 0 <= out["gpu_util_pct"] <= 100 and out["gpu_sm_clock_mhz"] > 0
