"""accelerate set-up: one process, the environment left as found, state released, canaries."""

from __future__ import annotations

import os
import re

import pytest
import torch

from scopebench.distributed import get_dist_info
from scopebench.train import AcceleratorSettings, build_accelerator, release_accelerator
from scopebench.train.backends import backend_names


def test_single_process_accelerator_is_one_cpu_process_and_leaves_the_environment_alone(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    threads = torch.get_num_threads()
    acc = build_accelerator(AcceleratorSettings(), get_dist_info(), torch.device("cpu"))
    try:
        assert acc.num_processes == 1 and acc.device.type == "cpu"
        assert str(acc.distributed_type) == "DistributedType.NO"
        model = acc.prepare(torch.nn.Linear(2, 2))
        assert isinstance(model, torch.nn.Linear)  # no DDP wrapper for one process
    finally:
        release_accelerator()
    assert not any(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS"))
    assert torch.get_num_threads() == threads
    from accelerate.state import AcceleratorState, PartialState

    assert AcceleratorState._shared_state == {} and PartialState._shared_state == {}


def test_bf16_precision_autocasts_on_cpu():
    acc = build_accelerator(AcceleratorSettings(precision="bf16"), get_dist_info(), torch.device("cpu"))
    try:
        with acc.autocast():
            out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
        assert out.dtype == torch.bfloat16
    finally:
        release_accelerator()


#: The backends the settings allow, as the refusal lists them (the registry's, in order).
_ALLOWED = ", ".join(repr(name) for name in backend_names())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backend": "deepspeed"}, rf"backend must be one of {re.escape(_ALLOWED)}, got 'deepspeed'"),
        ({"precision": "fp16"}, r"precision must be one of 'fp32', 'bf16', got 'fp16'"),
        ({"find_unused_params": "yes"}, r"find_unused_params must be true or false, got 'yes'"),
        ({"timeout_sec": 0}, r"group_timeout_sec must be a finite number > 0, got 0"),
    ],
)
def test_settings_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AcceleratorSettings(**kwargs)
