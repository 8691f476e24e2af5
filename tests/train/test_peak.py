"""Peak FLOP/s: measured on CPU, looked up on CUDA (device name recorded), override, unknown."""

from __future__ import annotations

import time

import pytest
import torch

from scopebench.train import peak_flops
from scopebench.train.peak import CUDA_PEAK_TFLOPS


def test_cpu_peak_is_measured_once_per_process_and_thread_count():
    first = peak_flops("cpu")
    again = peak_flops("cpu")
    assert first.source == "measured_cpu_matmul" and first.flops_per_sec > 1e8
    assert again == first  # cached, not re-measured


def test_override_wins():
    assert peak_flops("cpu", override_tflops=2.0).flops_per_sec == 2e12
    assert peak_flops("cpu", override_tflops=2.0).source == "override"


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200", "fp32", 67.0),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA L40S", "bf16", 362.0),
    ],
)
def test_cuda_table_by_device_name(monkeypatch, name, precision, tflops):
    # No GPU here: only the device name is recorded; the lookup is real.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak = peak_flops(torch.device("cuda:0"), precision)
    assert peak.flops_per_sec == tflops * 1e12 and peak.source == f"table:{name}"


def test_unknown_cuda_device_and_missing_entry_have_no_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert peak_flops(torch.device("cuda:0")).flops_per_sec is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B200")
    assert CUDA_PEAK_TFLOPS["B200"][1] is None
    none = peak_flops(torch.device("cuda:0"), "fp32")
    assert none.flops_per_sec is None and none.source is None


def test_sustained_matmul_rate_lasts_the_window_and_refuses_bad_windows():
    from scopebench.train.peak import sustained_cpu_matmul_flops

    start = time.perf_counter()
    rate = sustained_cpu_matmul_flops(0.3, size=256)
    assert time.perf_counter() - start >= 0.3
    assert 1e6 < rate < 1e15
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="seconds must be > 0"):
            sustained_cpu_matmul_flops(bad)


def test_measuring_the_cpu_peak_leaves_the_global_rng_alone():
    """The peak is measured once per process (cached): drawing its matrices from the global RNG made
    the first training run in a process take other noise than the next."""
    import torch

    from scopebench.train.peak import measure_cpu_matmul_flops, sustained_cpu_matmul_flops

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    measure_cpu_matmul_flops(size=64, repeats=1)
    sustained_cpu_matmul_flops(0.001, size=64)
    assert torch.equal(torch.rand(3), expected)
