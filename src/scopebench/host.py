"""What machine is this and what state is it in: the host record kept with every tool run.

A number measured on a shared machine means little without the machine's state: a
``powersave`` governor, a cgroup quota of 2 cores on a 64-core box, a neighbour's process
on the same GPU or a GPU on a PCIe link that trained down to x4 each move a timing by tens
of percent. :func:`host_record` reads that state from ``/proc``, ``/sys`` and NVML once;
``scopebench info --host`` prints it and every policy tool's JSON carries it under
``environment.host_record``.

Every field the kernel or the driver does not expose is ``None`` and the record's
``reasons`` dict (one per record, per GPU and per GPU process) says why, so a missing
signal never reads as a fake 0. Files are read under a ``root`` argument so tests point it
at a fake ``/proc`` and ``/sys`` tree; NVML comes through an injectable loader (default:
``import pynvml``, package ``nvidia-ml-py``, optional) so tests pass a recorder.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["MB", "gpu_records", "host_record", "measured_nvml_index", "read_cpu_quota", "read_cpufreq", "versions"]

#: Bytes per MiB, the unit of every ``_mb`` figure (defined here, below the profiler, which
#: reads the host and re-exports it as :data:`scopebench.profiler.device.MB`).
MB = 1024.0 * 1024.0

#: Packages whose versions the record carries (``python`` is added).
VERSIONED_PACKAGES = ("torch", "scopebench", "deepinv", "benchopt", "accelerate", "deepspeed")
NO_CPUFREQ = "not present (no cpufreq driver, e.g. a VM)"


def _read(root: str | Path, path: str) -> str | None:
    """The text of ``root/path`` stripped, ``None`` when it does not exist or cannot be read."""
    try:
        return (Path(root) / path.lstrip("/")).read_text().strip()
    except OSError:
        return None


def _key_values(text: str, sep: str = ":") -> dict[str, str]:
    """``key: value`` lines (``/proc/cpuinfo``, ``/proc/meminfo``), first occurrence wins.

    :Examples:

    >>> _key_values("MemTotal:  24683568 kB\\nMemAvailable: 1024 kB")
    {'MemTotal': '24683568 kB', 'MemAvailable': '1024 kB'}
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, found, value = line.partition(sep)
        if found:
            out.setdefault(key.strip(), value.strip())
    return out


def versions() -> dict[str, str | None]:
    """Versions of python and :data:`VERSIONED_PACKAGES`; ``None`` for one not installed."""
    from scopebench.environment import package_version

    found: dict[str, str | None] = {"python": platform.python_version()}
    found.update({name: package_version(name) for name in VERSIONED_PACKAGES})
    return found


def read_cpufreq(cpus: list[int], root: str | Path = "/") -> tuple[dict[str, Any], dict[str, str]]:
    """Governors and current frequencies of ``cpus``, summarised, with reasons for what is absent.

    Returns ``({"cpu_governors": sorted set, "cpu_cur_freq_min_mhz", "cpu_cur_freq_max_mhz"},
    reasons)``; ``scaling_cur_freq`` is in kHz.
    """
    governors, freqs_mhz = set(), []
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/cpufreq"
        governor = _read(root, f"{base}/scaling_governor")
        if governor:
            governors.add(governor)
        freq_khz = _read(root, f"{base}/scaling_cur_freq")
        if freq_khz and freq_khz.isdigit():
            freqs_mhz.append(int(freq_khz) / 1000.0)
    fields = {
        "cpu_governors": sorted(governors) or None,
        "cpu_cur_freq_min_mhz": min(freqs_mhz) if freqs_mhz else None,
        "cpu_cur_freq_max_mhz": max(freqs_mhz) if freqs_mhz else None,
    }
    first = Path(root) / f"sys/devices/system/cpu/cpu{cpus[0] if cpus else 0}/cpufreq"
    absent = f"{first} {NO_CPUFREQ}"
    reasons = {
        "cpu_governors": absent if not first.is_dir() else f"no readable scaling_governor under {first.parent.parent}",
        "cpu_cur_freq_min_mhz": absent if not first.is_dir() else "no readable scaling_cur_freq",
    }
    reasons["cpu_cur_freq_max_mhz"] = reasons["cpu_cur_freq_min_mhz"]
    return fields, {key: why for key, why in reasons.items() if fields[key] is None}


def _cgroup_chain(mount: Path, own: str | None) -> list[Path]:
    """This process's cgroup folder under ``mount`` and its ancestors, leaf first.

    A container without a cgroup namespace lists its host path in ``/proc/self/cgroup``
    while it sees its own cgroup at the mount root: paths that do not exist are skipped.
    """
    parts = [p for p in (own or "/").split("/") if p]
    chain = [mount.joinpath(*parts[:n]) for n in range(len(parts), 0, -1)] + [mount]
    return [folder for folder in chain if folder.is_dir()]


def _parse_quota(quota: str, period: str, v2: bool) -> float | None:
    """Cores a quota allows, ``None`` when unlimited (v2 ``max``, v1 ``-1``).

    :Examples:

    >>> _parse_quota("200000", "100000", v2=True), _parse_quota("max", "100000", v2=True)
    (2.0, None)
    >>> _parse_quota("-1", "100000", v2=False)
    """
    if quota == "max" or int(quota) < 0:
        return None
    return int(quota) / int(period)


def read_cpu_quota(root: str | Path = "/") -> tuple[dict[str, Any], dict[str, str]]:
    """The cgroup CPU quota of this process, in cores (v2 ``cpu.max``, else v1 CFS files).

    A quota on any ancestor binds, so the smallest along the chain wins. Returns
    ``({"cpu_quota_cores", "cpu_quota_unlimited", "cpu_quota_source"}, reasons)``.
    """
    own: dict[str, str] = {}
    for line in (_read(root, "/proc/self/cgroup") or "").splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        for name in controllers.split(",") if controllers else ["v2"]:
            own.setdefault(name, path)
    cgroup = Path(root) / "sys/fs/cgroup"
    found: list[tuple[float | None, str]] = []
    version = None
    if (cgroup / "cgroup.controllers").exists():
        version = "v2"
        for folder in _cgroup_chain(cgroup, own.get("v2")):
            text = _read(folder, "cpu.max")
            if text:
                quota, _, period = text.partition(" ")
                found.append((_parse_quota(quota, period or "100000", v2=True), str(folder / "cpu.max")))
    else:
        for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            for folder in _cgroup_chain(cgroup / mount, own.get("cpu")):
                quota, period = _read(folder, "cpu.cfs_quota_us"), _read(folder, "cpu.cfs_period_us")
                if quota and period:
                    version = "v1"
                    found.append((_parse_quota(quota, period, v2=False), str(folder / "cpu.cfs_quota_us")))
            if found:
                break
    keys = ("cpu_quota_cores", "cpu_quota_unlimited", "cpu_quota_source")
    limited = [(cores, source) for cores, source in found if cores is not None]
    if limited:
        cores, source = min(limited)
        return dict(zip(keys, (cores, False, source))), {}
    if found:
        return dict(zip(keys, (None, True, found[0][1]))), {
            "cpu_quota_cores": f"no quota: unlimited (cgroup {version} {found[0][1]})"
        }
    if version == "v2":
        # Without the cpu controller on this path no quota can apply: that is known, not missing.
        why = f"cgroup v2 at {cgroup} has no cpu.max on this process's path (cpu controller not enabled)"
        return dict(zip(keys, (None, True, None))), {"cpu_quota_cores": why, "cpu_quota_source": why}
    why = f"no cgroup CPU controller under {cgroup} (neither v2 cpu.max nor v1 cpu.cfs_quota_us)"
    return dict.fromkeys(keys), dict.fromkeys(keys, why)


def _cpu_record(root: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    fields: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    cpuinfo = _key_values(_read(root, "/proc/cpuinfo") or "")
    fields["cpu_model"] = cpuinfo.get("model name") or platform.processor() or None
    if fields["cpu_model"] is None:
        reasons["cpu_model"] = "no 'model name' in /proc/cpuinfo and platform.processor() is empty"
    fields["logical_cores"] = os.cpu_count()
    if fields["logical_cores"] is None:
        reasons["logical_cores"] = "os.cpu_count() could not tell"
    if hasattr(os, "sched_getaffinity"):
        usable = sorted(os.sched_getaffinity(0))
        fields["usable_cores"], fields["usable_cpus"] = len(usable), usable
    else:
        fields["usable_cores"] = fields["usable_cpus"] = None
        reasons["usable_cores"] = reasons["usable_cpus"] = "os.sched_getaffinity is not available on this platform"
    cpus = fields["usable_cpus"] or list(range(fields["logical_cores"] or 1))
    for part in (read_cpufreq(cpus, root), read_cpu_quota(root)):
        fields.update(part[0])
        reasons.update(part[1])
    return fields, reasons


def _memory_and_load(root: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    fields: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    meminfo = _key_values(_read(root, "/proc/meminfo") or "")
    for field, key in (("memory_total_mb", "MemTotal"), ("memory_available_mb", "MemAvailable")):
        value = meminfo.get(key, "").split()
        fields[field] = int(value[0]) * 1024 / MB if value and value[0].isdigit() else None
        if fields[field] is None:
            reasons[field] = f"no {key} in {Path(root) / 'proc/meminfo'}"
    try:
        fields["load_average"] = list(os.getloadavg())
    except (AttributeError, OSError) as error:
        fields["load_average"] = None
        reasons["load_average"] = f"os.getloadavg() failed: {error}"
    return fields, reasons


def _import_pynvml():
    import pynvml

    return pynvml


def _text(value: Any) -> str:
    """NVML strings: ``bytes`` in older pynvml releases, ``str`` in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _visible_indices(nvml: Any, count: int, environ: Mapping[str, str]) -> list[int]:
    """NVML indices of the GPUs this process's CUDA sees, in CUDA order (``CUDA_VISIBLE_DEVICES``).

    Integer indices and ``GPU-`` UUID prefixes are mapped; anything else (MIG) shows all GPUs.
    """
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    tokens = [token.strip() for token in spec.split(",") if token.strip()]
    if all(token.lstrip("-").isdigit() for token in tokens):
        indices = []
        for token in tokens:  # CUDA stops at the first invalid index
            if not 0 <= int(token) < count:
                break
            indices.append(int(token))
        return indices
    if all(token.startswith("GPU-") for token in tokens):
        uuids = [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        matches = ([i for i, uuid in enumerate(uuids) if uuid.startswith(token)] for token in tokens)
        return [match[0] for match in matches if match]
    return list(range(count))


def _measured_cuda_index(device: Any) -> int | None:
    """The CUDA index ``device`` names (``cuda`` is the current device, 0 unless set), else None."""
    kind, _, index = str(device).partition(":")
    if kind != "cuda":
        return None
    return int(index) if index.isdigit() else 0


def measured_nvml_index(nvml: Any, device: Any, environ: Mapping[str, str] | None = None) -> int | None:
    """NVML index of the GPU ``device`` (``cuda``, ``cuda:1``) names, ``None`` off CUDA or when
    CUDA cannot see it (``CUDA_VISIBLE_DEVICES`` mapped as in :func:`gpu_records`)."""
    cuda_index = _measured_cuda_index(device)
    if cuda_index is None:
        return None
    visible = _visible_indices(nvml, nvml.nvmlDeviceGetCount(), os.environ if environ is None else environ)
    return visible[cuda_index] if cuda_index < len(visible) else None


def _gpu(nvml: Any, index: int, cuda_index: int, measured: bool, driver: str, pid: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    gpu: dict[str, Any] = {"index": index, "cuda_index": cuda_index, "measured": measured, "driver_version": driver}
    reasons: dict[str, str] = {}

    def query(fields: tuple[str, ...], name: str, *args: Any, convert: Callable[[Any], tuple] = lambda v: (v,)):
        try:
            gpu.update(zip(fields, convert(getattr(nvml, name)(handle, *args))))
        except nvml.NVMLError as error:  # "Not Supported" on consumer boards, "No Permission" ...
            gpu.update(dict.fromkeys(fields))
            reasons.update(dict.fromkeys(fields, f"{name}: {error}"))

    query(("name",), "nvmlDeviceGetName", convert=lambda v: (_text(v),))
    query(
        ("memory_total_mb", "memory_used_mb"), "nvmlDeviceGetMemoryInfo", convert=lambda m: (m.total / MB, m.used / MB)
    )
    query(("persistence_mode",), "nvmlDeviceGetPersistenceMode", convert=lambda v: (bool(v),))
    query(("power_limit_w",), "nvmlDeviceGetEnforcedPowerLimit", convert=lambda mw: (mw / 1000.0,))
    for clock, constant in (("sm", nvml.NVML_CLOCK_SM), ("mem", nvml.NVML_CLOCK_MEM)):
        query((f"{clock}_clock_mhz",), "nvmlDeviceGetClockInfo", constant)
        query((f"{clock}_clock_max_mhz",), "nvmlDeviceGetMaxClockInfo", constant)
    query(("pcie_gen",), "nvmlDeviceGetCurrPcieLinkGeneration")
    query(("pcie_gen_max",), "nvmlDeviceGetMaxPcieLinkGeneration")
    query(("pcie_width",), "nvmlDeviceGetCurrPcieLinkWidth")
    query(("pcie_width_max",), "nvmlDeviceGetMaxPcieLinkWidth")
    query(("ecc_enabled", "ecc_pending_enabled"), "nvmlDeviceGetEccMode", convert=lambda m: (bool(m[0]), bool(m[1])))
    # Inside a container without its host's pid namespace NVML reports host pids, so this
    # process may show up here as "other".
    query(
        ("other_processes",),
        "nvmlDeviceGetComputeRunningProcesses",
        convert=lambda procs: ([_process(p) for p in procs if p.pid != pid],),
    )
    gpu["reasons"] = reasons
    return gpu


def _process(proc: Any) -> dict[str, Any]:
    used = getattr(proc, "usedGpuMemory", None)
    entry = {"pid": proc.pid, "used_memory_mb": used / MB if used is not None else None, "reasons": {}}
    if used is None:
        entry["reasons"]["used_memory_mb"] = "NVML does not report it (no permission or a container)"
    return entry


def gpu_records(
    load_nvml: Callable[[], Any] = _import_pynvml,
    device: Any = "cpu",
    *,
    pid: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """One dict per GPU visible to this process, through NVML; ``(None, reason)`` without NVML.

    Args:
        load_nvml: Returns the ``pynvml`` module (tests pass a recorder).
        device: The measured device; its GPU gets ``measured: True``.
        pid: This process (excluded from ``other_processes``); default ``os.getpid()``.
        environ: Where ``CUDA_VISIBLE_DEVICES`` is read; default ``os.environ``.
    """
    try:
        nvml = load_nvml()
    except ImportError:
        return None, "pynvml not installed (pip install nvidia-ml-py)"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        return None, f"NVML init failed: {error}"
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        visible = _visible_indices(nvml, nvml.nvmlDeviceGetCount(), os.environ if environ is None else environ)
        measured = _measured_cuda_index(device)
        pid = os.getpid() if pid is None else pid
        return [_gpu(nvml, i, at, at == measured, driver, pid) for at, i in enumerate(visible)], None
    except nvml.NVMLError as error:
        return None, f"NVML query failed: {error}"
    finally:
        nvml.nvmlShutdown()


def host_record(
    device: Any = "cpu", *, root: str | Path = "/", load_nvml: Callable[[], Any] = _import_pynvml
) -> dict[str, Any]:
    """What machine this is and what state it is in now (fields: docs/tools.md, ``info``).

    Args:
        device: The device being measured (``cpu``, ``cuda:1``...).
        root: Where ``/proc`` and ``/sys`` are read (tests pass a fake tree).
        load_nvml: Returns the ``pynvml`` module; raising ImportError means not installed.

    Returns:
        A JSON-able dict; every ``None`` field has its reason in ``reasons``.
    """
    from scopebench.environment import device_name

    record: dict[str, Any] = {"hostname": socket.gethostname(), "device": str(device)}
    record["device_name"] = device_name(device)
    reasons: dict[str, str] = {}
    for fields, why in (_cpu_record(root), _memory_and_load(root)):
        record.update(fields)
        reasons.update(why)
    record["kernel_release"] = platform.release() or None
    record["kernel_version"] = platform.version() or None
    reasons.update(
        {key: "platform module returned nothing" for key in ("kernel_release", "kernel_version") if not record[key]}
    )
    record["gpus"], gpu_reason = gpu_records(load_nvml, device)
    if gpu_reason:
        reasons["gpus"] = gpu_reason
    record["versions"] = versions()
    # One reasons dict per record: a package that is not installed is named with its path.
    reasons.update({f"versions.{name}": "not installed" for name, v in record["versions"].items() if v is None})
    record["reasons"] = reasons
    return record
