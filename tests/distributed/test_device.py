"""The one device rule: which device a rank computes on (CUDA faked where it cannot exist)."""

from __future__ import annotations

import pytest
import torch

from scopebench.distributed import check_device, resolve_device


def test_cpu_and_auto_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu", 3) == torch.device("cpu")
    assert resolve_device("auto", 3) == torch.device("cpu")


def test_local_ranks_spread_over_the_visible_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [resolve_device("auto", r) for r in range(4)] == [torch.device(f"cuda:{i}") for i in (0, 1, 0, 1)]
    assert resolve_device("cuda", 3) == torch.device("cuda:1")
    assert resolve_device("cuda:0", 3) == torch.device("cuda:0")
    assert resolve_device("cpu", 1) == torch.device("cpu")
    assert check_device("device", "cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"device='cuda:2' names no visible GPU \(2 visible\)"):
        check_device("device", "cuda:2")


@pytest.mark.parametrize(
    "value, message",
    [
        ("tpu", "device must be 'auto', 'cpu' or 'cuda', got 'tpu'"),
        (0, "device must be 'auto', 'cpu' or 'cuda', got 0"),
    ],
)
def test_bad_settings(value, message):
    with pytest.raises(ValueError, match=message):
        check_device("device", value)


def test_cuda_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda' but CUDA is not available on this machine"):
        check_device("device", "cuda")


@pytest.mark.gpu
def test_a_rank_gets_its_gpu():
    assert resolve_device("auto", 0) == torch.device("cuda:0")
    assert resolve_device("auto", torch.cuda.device_count()) == torch.device("cuda:0")
