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
def single_thread(one_thread):
    """Every policy test on one thread (see ``tests/conftest.py``)."""
    yield


@pytest.fixture(scope="session")
def robot_data(tmp_path_factory):
    """The tiny run config's dataset, written once per session: (settings, root)."""
    from scopebench.policy.settings import DatasetSettings

    settings = DatasetSettings(cache_dir=str(tmp_path_factory.mktemp("datasets")))
    return settings, settings.materialize()
