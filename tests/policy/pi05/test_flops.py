"""FLOPs formulas: consistent with each other and with torch's operator-level counter."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from scopebench.policy import make_policy

from ..helpers import make_batch


def test_training_is_three_forwards_and_inference_is_affine_in_steps(tiny):
    b = 3
    assert tiny.estimate_flops(b, "train") == 3 * tiny.estimate_flops(b, "forward")
    f = [tiny.estimate_flops(b, "inference", num_steps=n) for n in (1, 2, 10)]
    step = f[1] - f[0]
    assert step > 0 and f[2] == f[0] + 9 * step  # L(N) = F + N * s
    assert tiny.estimate_flops(2 * b, "train") == 2 * tiny.estimate_flops(b, "train")


@pytest.mark.parametrize("overrides", [{}, {"ce_weight": 0.0}, {"knowledge_insulation": True}])
def test_estimates_equal_torch_flop_counter(overrides):
    # The eager path spells attention as matmuls, which FlopCounterMode counts
    # (it does not count the CPU fused SDPA kernel).
    model = make_policy("tiny", attention_implementation="eager", **overrides)
    batch = make_batch(model, batch_size=3)
    with FlopCounterMode(display=False) as counter:
        model(batch)
    assert counter.get_total_flops() == model.estimate_flops(3, "forward")
    for steps in (1, 3):
        with FlopCounterMode(display=False) as counter:
            model.sample_actions(batch, num_steps=steps)
        assert counter.get_total_flops() == model.estimate_flops(3, "inference", num_steps=steps)


def test_pi05_flops_are_plausible():
    with torch.device("meta"):
        model = make_policy("pi05")
    cfg = model.config
    tokens = cfg.prefix_len()
    # the prefill is at least 2 * (decoder params) * tokens, and not wildly more
    lower = 2 * 1.9e9 * tokens
    prefill = model.estimate_flops(1, "inference", num_steps=1)
    assert lower < prefill < 3 * lower
    assert model.estimate_flops(1, "train") > prefill


def test_bad_mode_is_rejected(tiny):
    with pytest.raises(ValueError, match=r"mode must be one of \('train', 'forward', 'inference'\), got 'backward'"):
        tiny.estimate_flops(1, "backward")
