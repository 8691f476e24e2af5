"""AdamW with a fused tri-state, learning-rate schedules."""

from __future__ import annotations

import warnings

import pytest
import torch

from scopebench.train import build_adamw, build_scheduler


def test_fused_adamw_where_unsupported_warns_once_and_steps():
    param = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))  # no fused kernel for complex
    with pytest.warns(UserWarning, match=r"fused_adamw=true: fused AdamW is unavailable here .*complex64") as seen:
        opt = build_adamw([param], lr=0.1, fused=True)
    assert len(seen) == 1 and not opt.defaults["fused"]
    param.grad = torch.ones_like(param)
    opt.step()  # torch would raise here with fused=True


def test_fused_adamw_is_used_where_supported_and_default_otherwise():
    w = torch.nn.Parameter(torch.zeros(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build_adamw([w], lr=1e-3, fused=True).defaults["fused"] is True
        assert build_adamw([w], lr=1e-3, fused=False).defaults["fused"] is False
        assert build_adamw([w], lr=1e-3).defaults["fused"] is None


def test_constant_schedule_after_warmup():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = build_scheduler(opt, name="constant", warmup_steps=1)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [1.0, 2.0, 2.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "linear"}, r"scheduler must be one of 'constant', 'cosine', got 'linear'"),
        ({"warmup_steps": -1}, r"warmup_steps must be an integer >= 0, got -1"),
    ],
)
def test_bad_schedule_settings(kwargs, match):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=match):
        build_scheduler(opt, **kwargs)


def test_bad_learning_rate():
    with pytest.raises(ValueError, match=r"learning_rate must be a finite number > 0, got 'abc' \(str\)"):
        build_adamw([torch.nn.Parameter(torch.zeros(1))], lr="abc")
