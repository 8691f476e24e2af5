"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def worker_path(monkeypatch):
    """Make ``tests/`` importable by spawned workers (they inherit the environment)."""
    tests_dir = str(Path(__file__).resolve().parent)
    current = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", tests_dir + (os.pathsep + current if current else ""))
    return tests_dir
