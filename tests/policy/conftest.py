"""Fixtures for the policy tests."""

from __future__ import annotations

import pytest
import torch

from scopebench.policy import Pi05Policy, make_policy


@pytest.fixture
def tiny() -> Pi05Policy:
    """A freshly initialised ``tiny`` policy (seeded)."""
    torch.manual_seed(0)
    return make_policy("tiny")


@pytest.fixture(autouse=True)
def single_thread():
    """Run the tiny models on one thread.

    Their ops are too small to gain from a second thread, and on a busy machine two
    OpenMP threads wait on each other: the 200-step training test took 50 s instead of
    2 s with two threads on a loaded 2-core machine.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
