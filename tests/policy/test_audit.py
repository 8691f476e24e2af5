"""Unused-parameter audit of the policy."""

from __future__ import annotations

from scopebench.policy import find_unused_parameters, make_policy

from .helpers import make_batch


def test_no_unused_parameter_with_both_losses(tiny):
    audit = find_unused_parameters(tiny, make_batch(tiny), include_zero_grad=True)
    assert audit.unused == []
    assert audit.frozen == []
    assert len(audit.used) == len(list(tiny.parameters()))
    assert all(p.grad is None for p in tiny.parameters())  # gradients are cleared again
    # zero-initialised gates give the expert blocks all-zero gradients at init
    assert "layers.0.expert.q_proj.weight" in audit.zero_grad
    assert "UNUSED is empty: DDP can run with find_unused_parameters=False" in audit.format()


def test_discrete_head_is_unused_when_its_weight_is_zero():
    model = make_policy("tiny", ce_weight=0.0)
    audit = find_unused_parameters(model, make_batch(model))
    assert {"discrete_head.weight", "discrete_head.bias", "prefix_norm.weight"} <= set(audit.unused)
    assert not any(".expert." in name for name in audit.unused)
    text = audit.format()
    assert "UNUSED (requires_grad=True, grad is None)" in text and "  [discrete_head]  (2 tensors," in text
    assert "keep find_unused_parameters=True" in text


def test_frozen_parameters_are_reported():
    model = make_policy("tiny", freeze_vision_encoder=True)
    audit = find_unused_parameters(model, make_batch(model))
    assert audit.frozen and all(name.startswith("vision.") for name in audit.frozen)
    assert audit.unused == []
    assert audit.count("frozen") == sum(p.numel() for p in model.vision.parameters())
