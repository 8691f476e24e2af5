"""The fault policy on one process: each fault goes where and when its spec says, and says what it injected.

The injected durations are checked as lower bounds (work of ``delay_ms`` lasts at least that
long, however loaded the machine) or as exact zeros (a step without the fault injects nothing).
"""

from __future__ import annotations

import math

import pytest
import torch

from scopebench.validation import FaultSpec, fault_policy
from scopebench.validation.faults import INJECTED_TERM, CpuHogs


def steps(policy, n: int, optimizer=None) -> list[float]:
    """``n`` training steps of ``policy`` as the suite runs them (input, loss, backward, step):
    each step's :data:`INJECTED_TERM` in seconds."""
    data = iter(torch.utils.data.DataLoader(policy.dataset, batch_size=4))
    out = []
    for _ in range(n):
        batch = policy.preprocess(next(data), torch.device("cpu"))
        loss, terms = policy.loss(policy.model, batch)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
        out.append(float(terms[INJECTED_TERM]))
    return out


@pytest.mark.parametrize(
    "args, message",
    [
        ({"fault": "slow_rank"}, "^fault must be one of 'none', 'late_rank', 'slow_input', 'contention', "),
        (
            {"phase": "backward"},
            "^phase must be one of 'forward', 'bwd', 'optim_step', 'dataload_wait', got 'backward'$",
        ),
        ({"every": 0}, "^every must be an integer >= 1, got 0$"),
        ({"delay_ms": -5}, "^delay_ms must be a finite number >= 0, got -5$"),
        ({"rank": -1}, "^rank must be an integer >= 0, got -1$"),
        ({"step": 0}, "^step must be an integer >= 1, got 0$"),
        ({"magnitude": "big"}, "^magnitude must be a finite number >= 0, got 'big'"),
    ],
)
def test_a_fault_out_of_range_is_refused_naming_the_key(args, message):
    with pytest.raises(ValueError, match=message):
        FaultSpec(**args)
    with pytest.raises(ValueError, match=message):
        fault_policy(**args)


@pytest.mark.parametrize("phase", ["forward", "bwd", "dataload_wait", "optim_step"])
def test_a_late_rank_works_longer_in_its_phase_one_step_in_every(phase):
    policy = fault_policy("late_rank", rank=0, phase=phase, delay_ms=20, every=2, work_ms=0)
    optimizer = torch.optim.AdamW(policy.model.parameters())
    try:
        injected = steps(policy, 4, optimizer)
    finally:
        policy.model.close()
    assert injected[0] >= 0.02 and injected[2] >= 0.02, injected
    assert injected[1] == 0.0 and injected[3] == 0.0, injected


def test_another_rank_s_fault_is_not_this_rank_s():
    policy = fault_policy("late_rank", rank=1, phase="bwd", delay_ms=20, work_ms=0)  # this process is rank 0
    assert steps(policy, 2) == [0.0, 0.0]


def test_closing_the_model_removes_the_optimizer_hook():
    policy = fault_policy("late_rank", rank=0, phase="optim_step", delay_ms=20, work_ms=0)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    policy.model.close()
    assert steps(policy, 1, optimizer) == [0.0]  # benchopt's process runs other cells after this one


def test_slow_input_is_every_rank_s_input():
    policy = fault_policy("slow_input", rank=1, delay_ms=20, work_ms=0)
    assert min(steps(policy, 2)) >= 0.02


def test_both_steps_of_an_iteration_get_the_fault():
    """With an unprofiled step beside each profiled one (2 steps per iteration) "one step in
    ``every``" counts iterations: iterations 1 and 3 of every=2 are steps 1, 2, 5, 6."""
    policy = fault_policy("late_rank", rank=0, phase="forward", delay_ms=10, every=2, work_ms=0, steps_per_iteration=2)
    hit = [x > 0 for x in steps(policy, 6)]
    assert hit == [True, True, False, False, True, True]


def test_the_loss_is_nan_at_the_injected_iteration_on_the_injected_rank():
    policy = fault_policy("nonfinite", rank=0, step=2, work_ms=0, steps_per_iteration=2)
    losses = [float(policy.loss(policy.model, [torch.randn(4, 32)])[0].detach()) for _ in range(6)]
    assert [math.isnan(x) for x in losses] == [False, False, True, True, False, False]
    other = fault_policy("nonfinite", rank=1, step=1, work_ms=0)
    assert math.isfinite(float(other.loss(other.model, [torch.randn(4, 32)])[0].detach()))


def test_memory_growth_keeps_magnitude_mib_per_faulty_step():
    policy = fault_policy("memory_growth", magnitude=2, every=2, work_ms=0)
    steps(policy, 4)
    assert [t.numel() * t.element_size() for t in policy.model.kept] == [2 * 2**20] * 2
    policy.model.close()
    assert policy.model.kept == []


def test_comm_heavy_adds_magnitude_million_parameters_that_get_a_gradient():
    policy = fault_policy("comm_heavy", magnitude=0.5, work_ms=0)
    plain = fault_policy("none", work_ms=0)
    count = sum(p.numel() for p in policy.model.parameters()) - sum(p.numel() for p in plain.model.parameters())
    assert count == 500_000
    steps(policy, 1)
    assert policy.model.idle.grad is not None and policy.model.idle.grad.shape == (500_000,)


def test_cpu_hogs_run_while_the_context_lasts():
    with CpuHogs(1) as hogs:
        (proc,) = hogs.procs
        assert proc.poll() is None
    assert proc.poll() is not None and hogs.procs == []
    with pytest.raises(ValueError, match="^magnitude must be a whole number of processes for contention, got 1.5$"):
        CpuHogs(1.5)
