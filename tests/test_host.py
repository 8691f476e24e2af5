"""The host record (:mod:`scopebench.host`): this machine's record, fake /proc and /sys
trees for what the kernel may or may not expose, an NVML recorder standing in for
``pynvml``, and ``scopebench info --host [--json]``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from scopebench.cli import main
from scopebench.host import gpu_records, host_record, read_cpu_quota, read_cpufreq, versions

NUM_OR_NULL = {"type": ["number", "null"]}
INT_OR_NULL = {"type": ["integer", "null"]}
BOOL_OR_NULL = {"type": ["boolean", "null"]}
STR_OR_NULL = {"type": ["string", "null"]}
REASONS = {"type": "object", "additionalProperties": {"type": "string", "minLength": 1}}
PROCESS = {
    "type": "object",
    "additionalProperties": False,
    "required": ["pid", "used_memory_mb", "reasons"],
    "properties": {"pid": {"type": "integer"}, "used_memory_mb": NUM_OR_NULL, "reasons": REASONS},
}
GPU_FIELDS = {
    "index": {"type": "integer", "minimum": 0},
    "cuda_index": {"type": "integer", "minimum": 0},
    "measured": {"type": "boolean"},
    "driver_version": {"type": "string"},
    "name": STR_OR_NULL,
    "memory_total_mb": NUM_OR_NULL,
    "memory_used_mb": NUM_OR_NULL,
    "persistence_mode": BOOL_OR_NULL,
    "power_limit_w": NUM_OR_NULL,
    "sm_clock_mhz": NUM_OR_NULL,
    "sm_clock_max_mhz": NUM_OR_NULL,
    "mem_clock_mhz": NUM_OR_NULL,
    "mem_clock_max_mhz": NUM_OR_NULL,
    "pcie_gen": INT_OR_NULL,
    "pcie_gen_max": INT_OR_NULL,
    "pcie_width": INT_OR_NULL,
    "pcie_width_max": INT_OR_NULL,
    "ecc_enabled": BOOL_OR_NULL,
    "ecc_pending_enabled": BOOL_OR_NULL,
    "other_processes": {"type": ["array", "null"], "items": PROCESS},
    "reasons": REASONS,
}
GPU = {"type": "object", "additionalProperties": False, "required": list(GPU_FIELDS), "properties": GPU_FIELDS}
HOST_FIELDS = {
    "hostname": {"type": "string", "minLength": 1},
    "device": {"type": "string"},
    "device_name": {"type": "string"},
    "cpu_model": STR_OR_NULL,
    "logical_cores": {"type": ["integer", "null"], "minimum": 1},
    "usable_cores": {"type": ["integer", "null"], "minimum": 1},
    "usable_cpus": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}},
    "cpu_governors": {"type": ["array", "null"], "items": {"type": "string"}, "minItems": 1},
    "cpu_cur_freq_min_mhz": NUM_OR_NULL,
    "cpu_cur_freq_max_mhz": NUM_OR_NULL,
    "cpu_quota_cores": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "cpu_quota_unlimited": BOOL_OR_NULL,
    "cpu_quota_source": STR_OR_NULL,
    "memory_total_mb": NUM_OR_NULL,
    "memory_available_mb": NUM_OR_NULL,
    "load_average": {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 3, "maxItems": 3},
    "kernel_release": STR_OR_NULL,
    "kernel_version": STR_OR_NULL,
    "gpus": {"type": ["array", "null"], "items": GPU},
    "versions": {
        "type": "object",
        "required": ["python", "torch", "scopebench", "deepinv", "benchopt", "accelerate", "deepspeed"],
        "additionalProperties": STR_OR_NULL,
    },
    "reasons": REASONS,
}
HOST_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": list(HOST_FIELDS),
    "properties": HOST_FIELDS,
}


def unexplained_nulls(record: dict, inherited: dict | None = None, key_prefix: str = "", shown: str = "") -> list[str]:
    """Null fields without a reason. A dict with its own ``reasons`` explains its fields; one
    without is explained by the enclosing ``reasons`` under its dotted path (``versions.deepspeed``)."""
    if "reasons" in record:
        reasons, key_prefix = record["reasons"], ""
    else:
        reasons = inherited or {}
    missing = []
    for key, value in record.items():
        if key == "reasons":
            continue
        if value is None and key_prefix + key not in reasons:
            missing.append(shown + key)
        elif isinstance(value, dict):
            missing += unexplained_nulls(value, reasons, f"{key_prefix}{key}.", f"{shown}{key}.")
        elif isinstance(value, list):
            for n, item in enumerate(value):
                if isinstance(item, dict):
                    missing += unexplained_nulls(item, reasons, f"{key_prefix}{key}[{n}].", f"{shown}{key}[{n}].")
    return missing


def fake_tree(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")
    return root


# --- this machine -----------------------------------------------------------------------


def test_this_machine_record_validates_and_every_null_has_a_reason():
    record = host_record("cpu")
    jsonschema.validate(record, HOST_SCHEMA)
    assert unexplained_nulls(record) == []
    assert record["logical_cores"] == os.cpu_count()
    assert record["usable_cpus"] == sorted(os.sched_getaffinity(0))
    assert record["usable_cores"] == len(os.sched_getaffinity(0))
    assert 0 < record["memory_available_mb"] <= record["memory_total_mb"]
    assert record["versions"] == versions()
    assert record["versions"]["scopebench"] is not None
    # Every reason explains a null field, never decorates a known one.
    assert all(record[key] is None for key in record["reasons"] if "." not in key)


def test_the_null_checker_catches_an_unexplained_null():
    assert unexplained_nulls({"a": None, "reasons": {}}) == ["a"]
    assert unexplained_nulls({"g": [{"b": None, "reasons": {}}], "reasons": {}}) == ["g[0].b"]
    assert unexplained_nulls({"v": {"x": None}, "reasons": {"v.x": "not installed"}}) == []


# --- fake /proc and /sys ----------------------------------------------------------------


def test_cpufreq_present_summarises_governors_and_mhz(tmp_path):
    base = "/sys/devices/system/cpu/cpu{}/cpufreq/"
    root = fake_tree(
        tmp_path,
        {
            base.format(0) + "scaling_governor": "performance",
            base.format(0) + "scaling_cur_freq": "3500000",
            base.format(1) + "scaling_governor": "powersave",
            base.format(1) + "scaling_cur_freq": "1200000",
            base.format(2) + "scaling_governor": "schedutil",  # not ours: outside the usable cpus
        },
    )
    fields, reasons = read_cpufreq([0, 1], root)
    assert fields == {
        "cpu_governors": ["performance", "powersave"],
        "cpu_cur_freq_min_mhz": 1200.0,
        "cpu_cur_freq_max_mhz": 3500.0,
    }
    assert reasons == {}


def test_cpufreq_absent_is_null_with_the_reason(tmp_path):
    (tmp_path / "sys/devices/system/cpu/cpu0").mkdir(parents=True)
    fields, reasons = read_cpufreq([0, 1], tmp_path)
    assert fields == dict.fromkeys(("cpu_governors", "cpu_cur_freq_min_mhz", "cpu_cur_freq_max_mhz"))
    assert (
        reasons["cpu_governors"]
        == f"{tmp_path}/sys/devices/system/cpu/cpu0/cpufreq not present (no cpufreq driver, e.g. a VM)"
    )
    assert set(reasons) == set(fields)


def test_cpufreq_without_cur_freq_keeps_the_governor(tmp_path):
    root = fake_tree(tmp_path, {"/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance"})
    fields, reasons = read_cpufreq([0], root)
    assert fields["cpu_governors"] == ["performance"] and fields["cpu_cur_freq_max_mhz"] is None
    assert set(reasons) == {"cpu_cur_freq_min_mhz", "cpu_cur_freq_max_mhz"}


V2 = {"/sys/fs/cgroup/cgroup.controllers": "cpuset cpu memory", "/proc/self/cgroup": "0::/"}


def test_cgroup_v2_quota_in_cores(tmp_path):
    root = fake_tree(tmp_path, {**V2, "/sys/fs/cgroup/cpu.max": "200000 100000"})
    fields, reasons = read_cpu_quota(root)
    assert fields == {
        "cpu_quota_cores": 2.0,
        "cpu_quota_unlimited": False,
        "cpu_quota_source": f"{tmp_path}/sys/fs/cgroup/cpu.max",
    }
    assert reasons == {}


def test_cgroup_v2_max_is_unlimited(tmp_path):
    root = fake_tree(tmp_path, {**V2, "/sys/fs/cgroup/cpu.max": "max 100000"})
    fields, reasons = read_cpu_quota(root)
    assert fields["cpu_quota_unlimited"] is True and fields["cpu_quota_cores"] is None
    assert reasons == {"cpu_quota_cores": f"no quota: unlimited (cgroup v2 {tmp_path}/sys/fs/cgroup/cpu.max)"}


def test_cgroup_v2_an_ancestor_quota_binds(tmp_path):
    root = fake_tree(
        tmp_path,
        {
            **V2,
            "/proc/self/cgroup": "0::/job/step",
            "/sys/fs/cgroup/job/cpu.max": "150000 100000",
            "/sys/fs/cgroup/job/step/cpu.max": "300000 100000",
            "/sys/fs/cgroup/job/step/other/cpu.max": "50000 100000",  # a child of ours: does not bind
        },
    )
    fields, _ = read_cpu_quota(root)
    assert fields["cpu_quota_cores"] == 1.5
    assert fields["cpu_quota_source"].endswith("/sys/fs/cgroup/job/cpu.max")


def test_cgroup_v2_without_cpu_controller_applies_no_quota(tmp_path):
    fields, reasons = read_cpu_quota(fake_tree(tmp_path, V2))
    assert fields == {"cpu_quota_cores": None, "cpu_quota_unlimited": True, "cpu_quota_source": None}
    assert "cpu controller not enabled" in reasons["cpu_quota_cores"]


@pytest.mark.parametrize("quota, cores", [("50000", 0.5), ("-1", None)])
def test_cgroup_v1_cfs_quota(tmp_path, quota, cores):
    root = fake_tree(
        tmp_path,
        {
            "/proc/self/cgroup": "4:cpu,cpuacct:/docker/abc\n0::/",  # host path, absent in the container
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": quota,
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
        },
    )
    fields, reasons = read_cpu_quota(root)
    assert fields["cpu_quota_cores"] == cores
    assert fields["cpu_quota_unlimited"] is (cores is None)
    assert fields["cpu_quota_source"] == f"{tmp_path}/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"
    assert ("cpu_quota_cores" in reasons) is (cores is None)


def test_no_cgroup_cpu_controller_is_null_with_the_reason(tmp_path):
    fields, reasons = read_cpu_quota(tmp_path)
    assert fields == dict.fromkeys(("cpu_quota_cores", "cpu_quota_unlimited", "cpu_quota_source"))
    assert set(reasons) == set(fields) and "neither v2 cpu.max nor v1" in reasons["cpu_quota_cores"]


def test_record_from_a_fake_tree(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cpus = sorted(os.sched_getaffinity(0))
    files = {
        "/proc/cpuinfo": "processor\t: 0\nmodel name\t: Fake CPU 9000\n\nprocessor\t: 1\nmodel name\t: Other",
        "/proc/meminfo": "MemTotal:        2048000 kB\nMemFree:  1 kB\nMemAvailable:    1024000 kB",
        **V2,
        "/sys/fs/cgroup/cpu.max": "200000 100000",
    }
    for cpu in cpus:
        files[f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"] = "performance"
        files[f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq"] = str(2_000_000 + 1000 * cpu)
    record = host_record("cpu", root=fake_tree(tmp_path, files), load_nvml=FakeNVML)
    jsonschema.validate(record, HOST_SCHEMA)
    assert unexplained_nulls(record) == []
    assert record["cpu_model"] == "Fake CPU 9000"
    assert record["memory_total_mb"] == 2000.0 and record["memory_available_mb"] == 1000.0
    assert record["cpu_governors"] == ["performance"]
    assert record["cpu_cur_freq_min_mhz"] == 2000.0 + cpus[0] and record["cpu_cur_freq_max_mhz"] == 2000.0 + cpus[-1]
    assert record["cpu_quota_cores"] == 2.0
    assert [gpu["name"] for gpu in record["gpus"]] == ["NVIDIA Fake0", "NVIDIA Fake1"]


def test_old_kernel_without_memavailable(tmp_path):
    root = fake_tree(tmp_path, {"/proc/meminfo": "MemTotal:        2048000 kB"})
    record = host_record("cpu", root=root, load_nvml=missing_pynvml)
    assert record["memory_available_mb"] is None
    assert record["reasons"]["memory_available_mb"] == f"no MemAvailable in {tmp_path}/proc/meminfo"
    assert unexplained_nulls(record) == []


# --- NVML -------------------------------------------------------------------------------


class FakeNVML:
    """Records the calls a ``pynvml`` module would get; two GPUs, fixed values.

    ``raising`` maps a function name to the error it raises (``Not Supported``...).
    """

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self, raising: dict[str, str] | None = None, processes=None):
        self.calls: list[str] = []
        self.raising = raising or {}
        self.processes = processes or []

    def __getattr__(self, name):
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append(name)
            if name in self.raising:
                raise self.NVMLError(self.raising[name])
            return getattr(self, "_" + name)(*args)

        return call

    def _nvmlInit(self):
        pass

    def _nvmlShutdown(self):
        pass

    def _nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def _nvmlDeviceGetCount(self):
        return 2

    def _nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def _nvmlDeviceGetUUID(self, handle):
        return f"GPU-0000000{handle[1]}-aaaa"

    def _nvmlDeviceGetName(self, handle):
        return f"NVIDIA Fake{handle[1]}".encode()  # older pynvml returns bytes

    def _nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=80 * 1024**3, used=3 * 1024**3, free=77 * 1024**3)

    def _nvmlDeviceGetPersistenceMode(self, handle):
        return 1

    def _nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000  # mW

    def _nvmlDeviceGetClockInfo(self, handle, clock):
        return {self.NVML_CLOCK_SM: self.sm_clock, self.NVML_CLOCK_MEM: 2619}[clock]

    def _nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 2619}[clock]

    def _nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return 4

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return 5

    def _nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return 8

    def _nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return 16

    def _nvmlDeviceGetEccMode(self, handle):
        return [1, 0]

    def _nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self.processes

    # What the sampler (scopebench.profiler.sampler) reads every period: values a test may set.
    util, sm_clock, power_mw, temp_c, throttle = 45, 1755, 250_000, 71, 0
    energy_mj = 1_000_000.0
    energy_step_mj = 0.0  # added to the energy counter at every read

    def _nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=self.util, memory=10)

    def _nvmlDeviceGetPowerUsage(self, handle):
        return self.power_mw

    def _nvmlDeviceGetTemperature(self, handle, sensor):
        return self.temp_c

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.throttle

    def _nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy_mj += self.energy_step_mj
        return self.energy_mj


def missing_pynvml():
    raise ImportError("No module named 'pynvml'")


def test_nvml_recorder_values_and_shutdown():
    me = os.getpid()
    nvml = FakeNVML(
        processes=[
            SimpleNamespace(pid=me, usedGpuMemory=1024**3),
            SimpleNamespace(pid=4242, usedGpuMemory=2 * 1024**3),
            SimpleNamespace(pid=4343, usedGpuMemory=None),  # pynvml's NVML_VALUE_NOT_AVAILABLE
        ]
    )
    gpus, reason = gpu_records(lambda: nvml, "cuda:1", environ={})
    assert reason is None
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert nvml.calls.count("nvmlShutdown") == 1
    first = gpus[0]
    assert {k: v for k, v in first.items() if k not in ("other_processes", "reasons")} == {
        "index": 0,
        "cuda_index": 0,
        "measured": False,
        "driver_version": "550.54.15",
        "name": "NVIDIA Fake0",
        "memory_total_mb": 81920.0,
        "memory_used_mb": 3072.0,
        "persistence_mode": True,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1755,
        "sm_clock_max_mhz": 1980,
        "mem_clock_mhz": 2619,
        "mem_clock_max_mhz": 2619,
        "pcie_gen": 4,
        "pcie_gen_max": 5,
        "pcie_width": 8,
        "pcie_width_max": 16,
        "ecc_enabled": True,
        "ecc_pending_enabled": False,
    }
    assert first["reasons"] == {}
    assert [p["pid"] for p in first["other_processes"]] == [4242, 4343]  # not this process
    assert first["other_processes"][0] == {"pid": 4242, "used_memory_mb": 2048.0, "reasons": {}}
    assert first["other_processes"][1]["used_memory_mb"] is None
    assert "used_memory_mb" in first["other_processes"][1]["reasons"]
    assert [gpu["measured"] for gpu in gpus] == [False, True]
    jsonschema.validate(gpus, {"type": "array", "items": GPU})


def test_an_unsupported_field_is_null_with_the_nvml_error():
    nvml = FakeNVML(raising={"nvmlDeviceGetEccMode": "Not Supported", "nvmlDeviceGetMaxClockInfo": "No Permission"})
    gpus, _ = gpu_records(lambda: nvml, environ={})
    gpu = gpus[0]
    assert gpu["ecc_enabled"] is None and gpu["ecc_pending_enabled"] is None
    assert gpu["reasons"]["ecc_enabled"] == "nvmlDeviceGetEccMode: Not Supported"
    assert (
        gpu["reasons"]["sm_clock_max_mhz"]
        == gpu["reasons"]["mem_clock_max_mhz"]
        == "nvmlDeviceGetMaxClockInfo: No Permission"
    )
    assert gpu["sm_clock_mhz"] == 1755  # the other fields are still read
    assert set(gpu["reasons"]) == {"ecc_enabled", "ecc_pending_enabled", "sm_clock_max_mhz", "mem_clock_max_mhz"}
    assert unexplained_nulls({"gpus": gpus, "reasons": {}}) == []
    assert nvml.calls[-1] == "nvmlShutdown"


def test_nvml_init_failure_is_null_with_the_error():
    nvml = FakeNVML(raising={"nvmlInit": "Driver Not Loaded"})
    assert gpu_records(lambda: nvml) == (None, "NVML init failed: Driver Not Loaded")
    assert "nvmlShutdown" not in nvml.calls  # nothing to shut down


def test_nvml_failing_after_init_still_shuts_down():
    nvml = FakeNVML(raising={"nvmlDeviceGetCount": "Unknown Error"})
    assert gpu_records(lambda: nvml, environ={}) == (None, "NVML query failed: Unknown Error")
    assert nvml.calls[-1] == "nvmlShutdown"


def test_pynvml_not_installed():
    gpus, reason = gpu_records(missing_pynvml)
    assert gpus is None and reason.startswith("pynvml not installed")
    record = host_record("cpu", load_nvml=missing_pynvml)
    assert record["gpus"] is None and record["reasons"]["gpus"].startswith("pynvml not installed")


@pytest.mark.parametrize(
    "visible, indices",
    [("1", [1]), ("1,0", [1, 0]), ("", []), ("0,7,1", [0]), ("GPU-00000001", [1]), ("MIG-abc", [0, 1])],
)
def test_only_the_gpus_cuda_sees(visible, indices):
    gpus, _ = gpu_records(FakeNVML, "cuda", environ={"CUDA_VISIBLE_DEVICES": visible})
    assert [gpu["index"] for gpu in gpus] == indices
    assert [gpu["cuda_index"] for gpu in gpus] == list(range(len(indices)))
    assert [gpu["measured"] for gpu in gpus] == [n == 0 for n in range(len(indices))]


def test_the_recorder_matches_the_pynvml_api():
    """Canary: every function the recorder stands in for exists in the real module."""
    pynvml = pytest.importorskip("pynvml", reason="pynvml (nvidia-ml-py) is optional and not installed here")
    nvml = FakeNVML()
    gpu_records(lambda: nvml, environ={"CUDA_VISIBLE_DEVICES": "GPU-00000001"})
    missing = [name for name in set(nvml.calls) | {"NVMLError", "NVML_CLOCK_SM"} if not hasattr(pynvml, name)]
    assert missing == []


@pytest.mark.gpu
def test_real_nvml_on_a_gpu_machine():
    pytest.importorskip("pynvml", reason="pynvml (nvidia-ml-py) is optional and not installed here")
    record = host_record("cuda")
    jsonschema.validate(record, HOST_SCHEMA)
    assert unexplained_nulls(record) == []
    measured = [gpu for gpu in record["gpus"] if gpu["measured"]]
    assert len(measured) == 1 and measured[0]["name"] and measured[0]["memory_total_mb"] > 0


# --- scopebench info --host -------------------------------------------------------------


def test_info_host_json_validates(capsys):
    assert main(["info", "--host", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    jsonschema.validate(record, HOST_SCHEMA)
    assert unexplained_nulls(record) == []


def test_info_host_summary_names_every_unknown_field(capsys):
    assert main(["info", "--host"]) == 0
    out = capsys.readouterr().out
    for label in ("host ", "cpu ", "cores ", "frequency ", "memory ", "load ", "kernel ", "versions "):
        assert f"\n{label}" in "\n" + out, label
    record = host_record("cpu")
    for key, why in record["reasons"].items():
        assert f"  {key}: {why}" in out


def test_info_host_summary_of_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    from scopebench.commands.info import format_host

    nvml = FakeNVML(
        raising={"nvmlDeviceGetEccMode": "Not Supported"},
        processes=[SimpleNamespace(pid=4242, usedGpuMemory=2 * 1024**3)],
    )
    record = host_record("cpu", load_nvml=missing_pynvml)
    del record["reasons"]["gpus"]
    record["gpus"], _ = gpu_records(lambda: nvml, "cuda:0")  # device_name("cuda:0") needs CUDA
    out = format_host(record)
    assert "gpu 0 (measured): NVIDIA Fake0, driver 550.54.15" in out
    assert "SM 1755/1980 MHz, memory 2619/2619 MHz" in out
    assert "power limit 700 W; persistence on; ECC unknown" in out
    assert "PCIe        gen 4/5, width x8/16" in out
    assert "others      pid 4242 (2048 MB)" in out
    assert "gpu 1 ecc_enabled: nvmlDeviceGetEccMode: Not Supported" in out


def test_every_policy_tool_records_the_host():
    from scopebench.policy.tools import environment_info

    env = environment_info("cpu")
    jsonschema.validate(env["host_record"], HOST_SCHEMA)
    assert env["host"] == env["host_record"]["hostname"]  # the old key keeps its meaning


def test_info_without_host_is_unchanged(capsys):
    assert main(["info"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"versions", "device", "cpu_count", "torch_threads"}
