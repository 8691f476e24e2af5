"""Fixtures for the policy tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


#: The tiny run config the tool tests run.
TINY = str(Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml")


@pytest.fixture
def data_args(robot_data):
    """``--config tiny.yml`` on the session's dataset cache, as the tools take it."""
    return ["--config", TINY, f"--dataset.cache_dir={robot_data[0].cache_dir}"]


@pytest.fixture(scope="session")
def robot_data(tmp_path_factory):
    """The tiny run config's dataset, written once per session: (settings, root)."""
    from scopebench.policy.settings import DatasetSettings

    settings = DatasetSettings(cache_dir=str(tmp_path_factory.mktemp("datasets")))
    return settings, settings.materialize()


@pytest.fixture
def started(monkeypatch):
    """The Python processes the test started in this process (none may start: each raises).

    The local spawn's workers and ``accelerate launch`` each start ``sys.executable``; other
    commands (``ldconfig`` through ``ctypes.util.find_library``) run as usual.
    """
    seen: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(args, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes)) else list(args)
        if argv[:1] == [sys.executable]:
            seen.append(argv)
            raise AssertionError(f"a process was started: {argv}")
        return real_popen(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    return seen
