"""Print the versions of the suite's main packages, the device and the CPU resources; with
``--host``, what machine this is and what state it is in.

Why: a timing from a shared machine is only comparable with another when the machine's
state is known (CPU governor, cgroup quota, load, a neighbour on the GPU, its clocks and
PCIe link); ``--host`` shows it before a run, and every policy tool's JSON records the same
fields under ``environment.host_record``.

Run: ``scopebench info`` prints JSON with keys ``versions`` (package -> version),
``device`` (the CUDA device's name, else the CPU's), ``cpu_count`` (logical CPUs of the
machine), ``torch_threads`` (intra-op threads torch uses in this process).

``scopebench info --host`` prints a readable summary: CPU model, usable cores and cgroup
quota, governors and current frequencies, memory, load, kernel, each GPU's clocks, power
limit, PCIe link, ECC and the other processes on it, then every unknown field with its
reason. ``scopebench info --host --json`` prints the record (:func:`scopebench.host.host_record`):
``hostname, device, device_name, cpu_model, logical_cores, usable_cores, usable_cpus,
cpu_governors, cpu_cur_freq_min_mhz, cpu_cur_freq_max_mhz, cpu_quota_cores,
cpu_quota_unlimited, cpu_quota_source, memory_total_mb, memory_available_mb,
load_average (1, 5, 15 min), kernel_release, kernel_version, gpus, versions, reasons``;
each GPU: ``index, cuda_index, measured, driver_version, name, memory_total_mb,
memory_used_mb, persistence_mode, power_limit_w, sm_clock_mhz, sm_clock_max_mhz,
mem_clock_mhz, mem_clock_max_mhz, pcie_gen, pcie_gen_max, pcie_width, pcie_width_max,
ecc_enabled, ecc_pending_enabled, other_processes (pid, used_memory_mb, reasons),
reasons``. A field the kernel or NVML does not expose is null and ``reasons`` names why.
"""

from __future__ import annotations

import argparse
import os
import platform
from typing import Any

from scopebench.commands._common import print_json

HELP = "versions and device, as JSON; --host: the machine's state (CPU, cgroup, memory, load, GPUs)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", action="store_true", help="the machine's state instead (readable summary)")
    parser.add_argument("--json", action="store_true", help="with --host: print the host record as JSON")


def info() -> dict:
    import torch

    from scopebench.environment import device_name, package_version

    versions = {name: package_version(name) for name in ("scopebench", "deepinv", "benchopt")}
    versions.update(torch=torch.__version__, python=platform.python_version())
    device = device_name("cuda" if torch.cuda.is_available() else "cpu")
    return {
        "versions": versions,
        "device": device,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def _cpu_ranges(cpus: list[int]) -> str:
    """``0-3,8,10-11`` for a sorted CPU list.

    :Examples:

    >>> _cpu_ranges([0, 1, 2, 3, 8, 10, 11])
    '0-3,8,10-11'
    """
    spans: list[list[int]] = []
    for cpu in cpus:
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _value(value: Any, unit: str = "", fmt: str = "{}") -> str:
    return "unknown" if value is None else fmt.format(value) + unit


def _pair(current: Any, maximum: Any, unit: str = "") -> str:
    """``1980/1980 MHz``: the current value against its maximum."""
    if current is None and maximum is None:
        return "unknown"
    return f"{_value(current)}/{_value(maximum)}{unit}"


def _flag(value: bool | None) -> str:
    return "unknown" if value is None else ("on" if value else "off")


def _gpu_lines(gpu: dict[str, Any]) -> list[str]:
    mark = " (measured)" if gpu["measured"] else ""
    lines = [
        f"gpu {gpu['index']}{mark}: {_value(gpu['name'])}, driver {gpu['driver_version']}",
        f"  clocks      SM {_pair(gpu['sm_clock_mhz'], gpu['sm_clock_max_mhz'], ' MHz')}, "
        f"memory {_pair(gpu['mem_clock_mhz'], gpu['mem_clock_max_mhz'], ' MHz')} (current/max)",
        f"  power limit {_value(gpu['power_limit_w'], ' W', '{:.0f}')}; persistence {_flag(gpu['persistence_mode'])}; "
        f"ECC {_flag(gpu['ecc_enabled'])}",
        f"  PCIe        gen {_pair(gpu['pcie_gen'], gpu['pcie_gen_max'])}, "
        f"width x{_pair(gpu['pcie_width'], gpu['pcie_width_max'])} (current/max)",
        f"  memory      {_value(gpu['memory_used_mb'], ' MB', '{:.0f}')} used of "
        f"{_value(gpu['memory_total_mb'], ' MB', '{:.0f}')}",
    ]
    others = gpu["other_processes"]
    if others is None:
        lines.append("  others      unknown")
    else:
        listed = ", ".join(f"pid {p['pid']} ({_value(p['used_memory_mb'], ' MB', '{:.0f}')})" for p in others)
        lines.append(f"  others      {listed or 'none'}")
    return lines


def _unknown_lines(reasons: dict[str, str], prefix: str = "") -> list[str]:
    return [f"  {prefix}{key}: {why}" for key, why in reasons.items()]


def format_host(record: dict[str, Any]) -> str:
    """The host record as a readable multi-line summary (unknown fields last, with reasons)."""
    cpus = record["usable_cpus"]
    if record["cpu_quota_cores"] is not None:
        quota = f"quota {record['cpu_quota_cores']:g} cores ({record['cpu_quota_source']})"
    else:
        quota = {True: "no cgroup quota", False: "quota unknown", None: "quota unknown"}[record["cpu_quota_unlimited"]]
    governors = ", ".join(record["cpu_governors"]) if record["cpu_governors"] else "unknown"
    load = record["load_average"]
    lines = [
        f"host        {record['hostname']} (device {record['device']}: {record['device_name']})",
        f"cpu         {_value(record['cpu_model'])}",
        f"cores       {_value(record['usable_cores'])} usable of {_value(record['logical_cores'])} logical"
        + (f" (cpus {_cpu_ranges(cpus)})" if cpus else "")
        + f"; {quota}",
        f"frequency   governor {governors}; current "
        f"{_pair(record['cpu_cur_freq_min_mhz'], record['cpu_cur_freq_max_mhz'], ' MHz')} (min/max over usable cpus)",
        f"memory      {_value(record['memory_available_mb'], ' MB', '{:.0f}')} available of "
        f"{_value(record['memory_total_mb'], ' MB', '{:.0f}')}",
        f"load        {' '.join(f'{x:.2f}' for x in load) + ' (1, 5, 15 min)' if load else 'unknown'}",
        f"kernel      {_value(record['kernel_release'])} {record['kernel_version'] or ''}".rstrip(),
    ]
    for gpu in record["gpus"] or []:
        lines += _gpu_lines(gpu)
    if not record["gpus"]:
        lines.append("gpus        " + ("none visible" if record["gpus"] == [] else "unknown"))
    lines.append("versions    " + ", ".join(f"{name} {_value(v)}" for name, v in record["versions"].items()))
    unknown = _unknown_lines(record["reasons"])
    for gpu in record["gpus"] or []:
        unknown += _unknown_lines(gpu["reasons"], f"gpu {gpu['index']} ")
        for proc in gpu["other_processes"] or []:
            unknown += _unknown_lines(proc["reasons"], f"gpu {gpu['index']} pid {proc['pid']} ")
    if unknown:
        lines += ["unknown (null in --json):"] + unknown
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if not args.host:
        print_json(info())
        return 0
    import torch

    from scopebench.host import host_record

    record = host_record("cuda" if torch.cuda.is_available() else "cpu")
    if args.json:
        print_json(record)
    else:
        print(format_host(record))
    return 0
