"""What the machine did during the profiler window: a light sampler thread in each rank.

Every :data:`PERIOD_SEC` (100 ms) the thread ``scopebench-host-sampler`` reads the CPU
counters of :mod:`scopebench.host_load` (``/proc/stat`` over the CPUs this process may
use, and the CPU time of the run's own process groups, scanned again for new members at
once when the interval looks busy: :data:`RESCAN_OTHER_PCT`) and, on a CUDA device with NVML
(``nvidia-ml-py``), the measured GPU's utilisation, SM clock, power, temperature, memory
used, throttle reasons, energy counter and (read every :data:`PROCESS_EVERY` samples,
the latest count standing in between) the other processes on it. The profiler (:mod:`scopebench.profiler.base`) starts it when the
window's first iteration begins and stops it when the window ends; it does not exist
outside the window, nor with ``profiler_mode: null``. ``SCOPEBENCH_SAMPLER_PERIOD_SEC``
sets the period (``0`` turns it off).

At the end of each recorded iteration the profiler asks for :meth:`HostSampler.window`:
the samples from the last one taken before the iteration began to the latest one. An
iteration shorter than the period gets the last full interval (neighbouring short
iterations then share values); the first iteration of a window gets nothing until one
period has passed. The CPU shares need :data:`MIN_INTERVAL_TICKS` ticks: a shorter
interval reaches back to earlier samples of the window, and gets no CPU share until the
window holds that many. Columns (docs/profiler.md): ``host_other_cpu_pct``,
``host_steal_pct``, ``gpu_util_pct``, ``gpu_sm_clock_mhz``, ``gpu_power_w`` (means over
the samples), ``gpu_temp_c``, ``gpu_mem_used_mb``, ``gpu_other_procs_count`` (maxima),
``gpu_throttle`` (throttle-reason bits seen, OR-ed; :func:`throttle_names`),
``gpu_sm_clock_max_mhz`` and ``gpu_energy_j`` (mean power from the energy counter over
the samples, times the iteration's ``total_time_sec``). A signal the machine does not give
is absent, never 0; why is in :attr:`HostSampler.reasons`. Across ranks
(:meth:`HostSampler.cross_rank`) ``gpu_throttle`` is OR-ed and ``gpu_energy_j`` summed;
the other columns take the base class's maximum (the busiest rank).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from scopebench.environment import SETTINGS, env_setting
from scopebench.host_load import OwnTime, read_cpu_times, shares, usable_cpus
from scopebench.profiler.device import MB

__all__ = ["GPU_COLUMNS", "HostSampler", "PERIOD_SEC", "THREAD_NAME", "sampler_period", "throttle_names"]

ENV_PERIOD = "SCOPEBENCH_SAMPLER_PERIOD_SEC"
#: Seconds between samples unless :data:`ENV_PERIOD` says otherwise (0.1: the setting's default).
PERIOD_SEC = float(SETTINGS[ENV_PERIOD].default)
THREAD_NAME = "scopebench-host-sampler"
#: CPU ticks (over the usable CPUs) an interval needs for a CPU share: a share over fewer is
#: mostly tick rounding (one tick of 3 is 33 %), so a shorter interval reaches back to earlier
#: samples. 20 ticks: 100 ms on two CPUs at ``USER_HZ = 100``, good to about ±5 %.
MIN_INTERVAL_TICKS = 20
#: An interval whose other share exceeds this makes the sample scan ``/proc`` for the run's new
#: processes at once (:meth:`scopebench.host_load.OwnTime.read`), not at the next periodic scan (%).
RESCAN_OTHER_PCT = 5.0
#: The GPU's process list is read every this many samples (it costs more than the rest).
PROCESS_EVERY = 10
#: NVML clock-event reason bits (``nvmlClocksEventReason*``) that slow the GPU down.
THROTTLING = {4: "sw_power_cap", 8: "hw_slowdown", 32: "sw_thermal", 64: "hw_thermal", 128: "hw_power_brake"}
#: Bits that do not mean a slowdown under load.
NOT_THROTTLING = {1: "gpu_idle", 2: "applications_clocks", 16: "sync_boost", 256: "display_clocks"}
#: Every GPU column the sampler may report (absent, with a reason, when NVML does not give it).
GPU_COLUMNS = (
    "gpu_util_pct",
    "gpu_sm_clock_mhz",
    "gpu_sm_clock_max_mhz",
    "gpu_power_w",
    "gpu_temp_c",
    "gpu_mem_used_mb",
    "gpu_throttle",
    "gpu_energy_j",
    "gpu_other_procs_count",
)
_MEANS = ("gpu_util_pct", "gpu_sm_clock_mhz", "gpu_power_w")
_MAXIMA = ("gpu_temp_c", "gpu_mem_used_mb", "gpu_other_procs_count")


def sampler_period(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between samples from ``SCOPEBENCH_SAMPLER_PERIOD_SEC`` (default 0.1; 0 = off),
    read by :func:`scopebench.environment.env_setting` (the one reader of the settings).

    Raises:
        ValueError: not a number, below 10 ms (the thread would cost too much), or above
            :data:`scopebench.environment.MAX_SAMPLER_PERIOD_SEC` (inf and nan included: an
            infinite wait killed the thread in the middle of a report).
    """
    return env_setting(ENV_PERIOD, environ)


def _enough_ticks(by_seq: dict[int, tuple], first: int, latest: int) -> int:
    """The latest sample at or before ``first`` from which to ``latest`` at least
    :data:`MIN_INTERVAL_TICKS` CPU ticks passed (the oldest kept one when none has: its
    interval then gives no CPU share). ``by_seq``: the kept samples by number."""
    end = by_seq.get(latest)
    if end is None or end[2] is None:
        return first
    start = first
    while start in by_seq and by_seq[start][2] is not None:
        if end[2].total - by_seq[start][2].total >= MIN_INTERVAL_TICKS or start - 1 not in by_seq:
            return start
        start -= 1
    return first


def throttle_names(mask: int, only_throttling: bool = True) -> list[str]:
    """Names of the reason bits in ``mask``.

    :Examples:
        >>> throttle_names(4 | 1 | 64), throttle_names(1, only_throttling=False)
        (['sw_power_cap', 'hw_thermal'], ['gpu_idle'])
    """
    table = THROTTLING if only_throttling else {**THROTTLING, **NOT_THROTTLING}
    return [name for bit, name in sorted(table.items()) if int(mask) & bit]


def _import_pynvml():
    import pynvml

    return pynvml


class GpuProbe:
    """NVML readings of the measured GPU; a signal that fails once is dropped with its reason.

    Args:
        device: The measured CUDA device.
        load_nvml: Returns the ``pynvml`` module (tests pass a recorder).
        own_pids: Returns the run's pids (not "other" processes on the GPU).
    """

    def __init__(self, device: Any, load_nvml: Callable[[], Any], own_pids: Callable[[], Iterable[int]]) -> None:
        from scopebench.host import measured_nvml_index

        self.reasons: dict[str, str] = {}
        self.handle = self.nvml = None
        self.own_pids = own_pids
        self.count = 0
        self.other_procs: float | None = None
        self.constant: dict[str, float] = {}
        try:
            nvml = load_nvml()
        except ImportError:
            self.reason = "pynvml not installed (pip install nvidia-ml-py)"
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            self.reason = f"NVML init failed: {error}"
            return
        self.nvml = nvml
        try:
            index = measured_nvml_index(nvml, device)
            if index is None:
                self.reason = f"{device} is not a GPU CUDA sees"
            else:
                self.handle, self.reason = nvml.nvmlDeviceGetHandleByIndex(index), None
        except nvml.NVMLError as error:
            self.reason = f"NVML query failed: {error}"
        if self.handle is None:
            self.close()
            return
        events = "nvmlDeviceGetCurrentClocksEventReasons"  # the newer name of the throttle reasons
        if not hasattr(nvml, events):
            events = "nvmlDeviceGetCurrentClocksThrottleReasons"
        #: column -> (NVML function, its arguments after the handle, conversion)
        self.signals: dict[str, tuple[str, tuple, Callable[[Any], Any]]] = {
            "gpu_util_pct": ("nvmlDeviceGetUtilizationRates", (), lambda u: float(u.gpu)),
            "gpu_sm_clock_mhz": ("nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_SM,), float),
            "gpu_power_w": ("nvmlDeviceGetPowerUsage", (), lambda mw: mw / 1000.0),
            "gpu_temp_c": ("nvmlDeviceGetTemperature", (nvml.NVML_TEMPERATURE_GPU,), float),
            "gpu_mem_used_mb": ("nvmlDeviceGetMemoryInfo", (), lambda m: m.used / MB),
            "gpu_throttle": (events, (), int),
            "energy_mj": ("nvmlDeviceGetTotalEnergyConsumption", (), float),
        }
        try:
            self.constant["gpu_sm_clock_max_mhz"] = float(
                nvml.nvmlDeviceGetMaxClockInfo(self.handle, nvml.NVML_CLOCK_SM)
            )
        except nvml.NVMLError as error:
            self.reasons["gpu_sm_clock_max_mhz"] = f"nvmlDeviceGetMaxClockInfo: {error}"

    @property
    def available(self) -> bool:
        return self.handle is not None

    def read(self) -> dict[str, float]:
        """One reading; signals that fail now are dropped for the rest of the window."""
        nvml, out = self.nvml, {}
        for key, (name, args, convert) in list(self.signals.items()):
            try:
                out[key] = convert(getattr(nvml, name)(self.handle, *args))
            except nvml.NVMLError as error:  # "Not Supported" (energy before Volta, power on some boards)
                del self.signals[key]
                self.reasons["gpu_energy_j" if key == "energy_mj" else key] = f"{name}: {error}"
        if self.count % PROCESS_EVERY == 0 and "gpu_other_procs_count" not in self.reasons:
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
                own = set(self.own_pids())
                self.other_procs = float(sum(1 for p in procs if p.pid not in own))
            except nvml.NVMLError as error:
                self.reasons["gpu_other_procs_count"] = f"nvmlDeviceGetComputeRunningProcesses: {error}"
                self.other_procs = None
        if self.other_procs is not None:  # the latest count stands for the samples until the next
            out["gpu_other_procs_count"] = self.other_procs
        self.count += 1
        return out

    def close(self) -> None:
        if self.nvml is not None:
            nvml, self.nvml, self.handle = self.nvml, None, None
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass


class HostSampler:
    """The sampler thread of one rank (see the module docstring).

    Args:
        device: The measured device; NVML is read only for a CUDA device.
        period_sec: Seconds between samples.
        pgids: Process groups of the run on this host (default: this process's).
        root: Where ``/proc`` is read.
        load_nvml: Returns the ``pynvml`` module.
    """

    def __init__(
        self,
        device: Any = "cpu",
        period_sec: float = PERIOD_SEC,
        pgids: Iterable[int] | None = None,
        root: str = "/",
        load_nvml: Callable[[], Any] = _import_pynvml,
        cuda: bool | None = None,
    ) -> None:
        self.device, self.period_sec, self.pgids, self.root = device, period_sec, pgids, root
        self.load_nvml = load_nvml
        self.cuda = str(device).startswith("cuda") if cuda is None else cuda
        self.cpus = usable_cpus()
        self.reasons: dict[str, str] = {}
        self.thread_cpu_sec: float | None = None
        self.samples_taken = 0
        self._samples: list[tuple] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu: GpuProbe | None = None
        #: The latest sample's number (:meth:`mark`).
        self.seq = -1
        self._cache: tuple[int, dict[str, float], float | None] | None = None
        #: The sample number and this thread's CPU time at the last :meth:`thread_cpu_into`.
        self._cpu_read_at: int | None = None
        self._cpu_sec_at = 0.0
        #: ``(n, columns)``: what :meth:`window_into` with ``thread_cpu`` writes for an iteration
        #: that began at sample ``n`` and ended before the next one (``profiler_sampler_cpu_sec``
        #: 0), once it wrote them; a profiler copies them while :attr:`seq` is still ``n``, one
        #: comparison instead of a call per iteration. Never set where the columns depend on the
        #: iteration's length (the energy of a GPU with an energy counter).
        self.steady: tuple[int, dict[str, float]] = (-2, {})

    @property
    def running(self) -> bool:
        return self._thread is not None

    def cpu_sec(self) -> float | None:
        """The sampler thread's CPU time so far, read from another thread (Linux's per-thread
        clock); :attr:`thread_cpu_sec` once stopped, ``None`` when neither can be read."""
        thread = self._thread
        if thread is None or thread.ident is None:
            return self.thread_cpu_sec
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):  # the thread just ended; no such clock off Linux
            return self.thread_cpu_sec

    def start(self) -> None:
        """Scan the run's processes, open NVML, take the first sample, start the thread."""
        self._own = OwnTime(self.pgids, self.root)
        if self.cuda:
            self._gpu = GpuProbe(self.device, self.load_nvml, lambda: self._own.known)
            if self._gpu.reason:
                self.reasons["gpu"] = self._gpu.reason
        else:
            self.reasons["gpu"] = f"{self.device} is not a CUDA device"
        self.sample()
        if self._samples[-1][2] is None:
            self.reasons["host_other_cpu_pct"] = self.reasons["host_steal_pct"] = f"no {Path(self.root) / 'proc/stat'}"
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread and close NVML (idempotent). Called from the thread itself (a
        dropped profiler collected there by the garbage collector): it stops after this call."""
        if self._thread is None:
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        if self._gpu is not None:
            self.reasons.update(self._gpu.reasons)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.period_sec):
                self.sample()
        finally:
            self.thread_cpu_sec = time.thread_time()  # this thread's own CPU time, read inside it
            if self._gpu is not None:  # sampling is over (also when stop() was called from here)
                self._gpu.close()

    def sample(self) -> None:
        """Take one reading now (the thread calls it every period)."""
        cpu = read_cpu_times(self.cpus, self.root)
        own = self._own.read()
        last = self._samples[-1] if self._samples else None
        if cpu is not None and last is not None and last[2] is not None:
            # Busy since the last sample: first look for the run's processes born since the
            # last scan (dataloader workers), whose time would otherwise count as other.
            if shares((last[2], last[3]), (cpu, own)).get("host_other_cpu_pct", 0.0) > RESCAN_OTHER_PCT:
                own = self._own.read(rescan=True)
        gpu = self._gpu.read() if self._gpu is not None and self._gpu.available else {}
        with self._lock:
            self.seq += 1
            self._samples.append((self.seq, time.perf_counter(), cpu, own, gpu))
            self.samples_taken += 1

    def mark(self) -> int:
        """The latest sample's number: pass it to :meth:`window` at the iteration's end."""
        return self.seq

    def window(self, mark: int, wall_sec: float) -> dict[str, float]:
        """Columns of the iteration that began at sample ``mark`` and lasted ``wall_sec``.

        An iteration without a sample of its own reuses the last full interval, computed
        once (the profiler's bookkeeping per iteration stays a dict update).
        """
        out: dict[str, float] = {}
        self.window_into(out, mark, wall_sec)
        return out

    def window_into(self, out: dict[str, Any], mark: int, wall_sec: float, thread_cpu: bool = False) -> None:
        """:meth:`window`, written into ``out`` (the iteration's metrics: no copy); with
        ``thread_cpu``, :meth:`thread_cpu_into` too (one call per iteration on the hot path)."""
        latest = self.seq
        cache = self._cache
        if latest != mark or cache is None or cache[0] != latest:
            cache = self._window_rates(mark, latest)
        out.update(cache[1])
        if cache[2] is not None:
            out["gpu_energy_j"] = cache[2] * wall_sec
        if thread_cpu:
            if latest == self._cpu_read_at:
                out["profiler_sampler_cpu_sec"] = 0.0
            else:
                self.thread_cpu_into(out)
            if latest == mark == self._cpu_read_at and cache[2] is None and self.steady[0] != latest:
                self.steady = (latest, {**cache[1], "profiler_sampler_cpu_sec": 0.0})

    def thread_cpu_into(self, out: dict[str, Any]) -> None:
        """``profiler_sampler_cpu_sec`` into ``out``: this thread's CPU time since the previous
        call (since the thread's start for the first). Its clock (a system call) is read only when
        a sample was taken since: between samples the thread waits, and what it spends after a
        sample counts at the next reading. Absent where the clock cannot be read."""
        latest = self.seq
        if latest == self._cpu_read_at:
            out["profiler_sampler_cpu_sec"] = 0.0
            return
        now = self.cpu_sec()
        if now is not None:
            self._cpu_read_at = latest
            out["profiler_sampler_cpu_sec"] = max(now - self._cpu_sec_at, 0.0)
            self._cpu_sec_at = now

    def _window_rates(self, mark: int, latest: int) -> tuple[int, dict[str, float], float | None]:
        """The rates of :meth:`window` from sample ``mark`` to ``latest``, and the mean power;
        kept for the next iterations when no sample was taken since ``mark``."""
        first = mark if latest > mark else latest - 1
        with self._lock:
            by_seq = {s[0]: s for s in self._samples}
            cpu_first = _enough_ticks(by_seq, first, latest)
            # Keep what the next window may need: its mark (>= latest), the one before, and
            # the samples back to enough CPU ticks before them (never more than before now).
            keep = min(cpu_first, min(mark, latest) - 1)
            self._samples = [s for s in self._samples if s[0] >= keep]
        rates, power = self._interval(by_seq, first, latest, cpu_first)
        if latest == mark:
            self._cache = (latest, rates, power)
        return latest, rates, power

    def _interval(
        self, by_seq: dict[int, tuple], first: int, latest: int, cpu_first: int
    ) -> tuple[dict[str, float], float | None]:
        """Rates and means between samples ``first`` and ``latest`` (the CPU shares from
        ``cpu_first``), and the mean power (W) from the energy counter (``None`` without it).
        ``by_seq``: the samples by number."""
        if first not in by_seq or latest not in by_seq:
            return {}, None
        a, b = by_seq[first], by_seq[latest]
        out: dict[str, float] = {}
        c = by_seq.get(cpu_first)
        if c is not None and c[2] is not None and b[2] is not None and b[2].total - c[2].total >= MIN_INTERVAL_TICKS:
            out.update(shares((c[2], c[3]), (b[2], b[3])))
        inside = [s[4] for seq, s in by_seq.items() if first < seq <= latest]
        for key in _MEANS + _MAXIMA:
            values = [g[key] for g in inside if key in g]
            if values:
                out[key] = sum(values) / len(values) if key in _MEANS else max(values)
        masks = [g["gpu_throttle"] for g in inside if "gpu_throttle" in g]
        if masks:
            out["gpu_throttle"] = float(_or(masks))
        if self._gpu is not None and inside:
            out.update(self._gpu.constant)
        power = None
        if "energy_mj" in a[4] and "energy_mj" in b[4] and b[1] > a[1]:
            power = (b[4]["energy_mj"] - a[4]["energy_mj"]) / 1000.0 / (b[1] - a[1])
        return out, power

    @staticmethod
    def cross_rank(per_rank: list[dict[str, Any]]) -> dict[str, float]:
        """Rank 0's reduced values that are not a maximum: throttle bits OR-ed, energy summed."""
        out: dict[str, float] = {}
        masks = [row["gpu_throttle"] for row in per_rank if "gpu_throttle" in row]
        if masks:
            out["gpu_throttle"] = float(_or(masks))
        energy = [row["gpu_energy_j"] for row in per_rank if "gpu_energy_j" in row]
        if energy:
            out["gpu_energy_j"] = sum(energy)
        return out


def _or(masks: Iterable[float]) -> int:
    mask = 0
    for value in masks:
        mask |= int(value)
    return mask
