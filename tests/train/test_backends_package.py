"""The training backends package: one object per backend, found by the package, the only place
that tells backends apart by name.

The design test writes a sixth backend as one module into a copy of the package's path and
checks that the settings, the phase descriptions, the memory estimate and the accelerate
files take it with nothing else changed.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

from scopebench.train import backends
from scopebench.train.backends import all_backends, backend_names, find_backend, get_backend

SRC = Path(__file__).resolve().parents[2] / "src" / "scopebench"
PACKAGE = SRC / "train" / "backends"


def test_every_backend_is_found_in_order_with_its_shipped_file():
    from scopebench.train import load_accelerate_file, shipped_accelerate_file

    assert backend_names() == ("ddp", "zero1", "zero2", "zero3", "fsdp2", "hsdp")
    for backend in all_backends():
        assert load_accelerate_file(shipped_accelerate_file(backend.name)).backend == backend
        assert set(backend.phase_contents) <= {"forward", "bwd", "unscale_clip", "optim_step", "zero_grad_sched"}
        assert all(find_backend(other) for other in backend.compared_with)
    assert find_backend("nccl") is None


def test_an_unknown_backend_is_refused_naming_the_key_and_the_backends():
    allowed = ", ".join(repr(name) for name in backend_names())
    with pytest.raises(ValueError, match=rf"backend must be one of {re.escape(allowed)}, got 'x'"):
        get_backend("x")


def _string_comparisons(path: Path, names: set[str], root: Path = SRC) -> list[str]:
    """``== "zero3"``, ``in ("zero2", "zero3")`` and the like in ``path``'s code (docstrings and
    doctests are text, not comparisons)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        constants = [
            c for side in (node.left, *node.comparators) for c in ast.walk(side) if isinstance(c, ast.Constant)
        ]
        hits = sorted({c.value for c in constants if isinstance(c.value, str) and c.value in names})
        if hits:
            found.append(f"{path.relative_to(root)}:{node.lineno} compares {hits}")
    return found


def test_no_module_outside_the_package_compares_backend_names():
    names = set(backend_names())
    found = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if PACKAGE not in path.parents
        for hit in _string_comparisons(path, names)
    ]
    assert not found, "backend names compared outside scopebench.train.backends:\n" + "\n".join(found)


def test_the_comparison_check_finds_a_comparison(tmp_path):
    """The check above can fail: it sees the spellings the code used before the package."""
    path = tmp_path / "probe.py"
    path.write_text('def f(b, s):\n    return b == "ddp" or b in ("zero2", "zero3") or s.backend != "fsdp2"\n')
    assert len(_string_comparisons(path, set(backend_names()), root=tmp_path)) == 3


SIXTH = '''
"""A sixth backend for the design test: DDP's behaviour, another name."""
from scopebench.train.backends.base import TrainingBackend

BACKEND = TrainingBackend(
    name="sixth",
    title="Sixth",
    order=5,
    accelerate_file="ddp.yaml",
    phase_contents={"bwd": "backward + a sixth all-reduce"},
    compared_with=("ddp",),
)
'''


@pytest.fixture
def sixth(tmp_path, monkeypatch):
    """``sixth.py`` on the package's path; the registry forgets it afterwards."""
    folder = tmp_path / "more"
    folder.mkdir()
    (folder / "sixth.py").write_text(SIXTH)
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(folder)])
    all_backends.cache_clear()
    yield
    all_backends.cache_clear()
    sys.modules.pop("scopebench.train.backends.sixth", None)


def test_a_backend_is_one_module(sixth):
    from scopebench.policy.phases import describe_phases
    from scopebench.policy.settings import TrainSettings, backend_conflict
    from scopebench.train.backends import model_state_bytes

    assert backend_names()[-1] == "sixth"
    assert TrainSettings(backend="sixth").backend == "sixth"
    assert describe_phases("sixth") == "Sixth: bwd = backward + a sixth all-reduce"
    assert backend_conflict("sixth", True, True, world_size=1) is None
    assert model_state_bytes(10, backend="sixth") == model_state_bytes(10, backend="ddp")
    from scopebench.report.backend_comparison import _backend_pairs

    assert ("sixth", "ddp") in _backend_pairs()


def test_a_module_without_its_backend_is_refused_by_name(tmp_path, monkeypatch):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "seventh.py").write_text(SIXTH)  # BACKEND named "sixth" in seventh.py
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(folder)])
    all_backends.cache_clear()
    try:
        with pytest.raises(
            TypeError, match=re.escape("seventh must define BACKEND, a TrainingBackend named 'seventh'")
        ):
            all_backends()
    finally:
        all_backends.cache_clear()
        sys.modules.pop("scopebench.train.backends.seventh", None)
        importlib.invalidate_caches()


RECORDING = '''
"""A backend that steps its own way, for the design test: DDP's hooks, each call recorded."""
from scopebench.train.backends.base import TrainingBackend

CALLS = []


class Recording(TrainingBackend):
    def selects(self, distributed_type, raw):
        return raw.get("recording") is True

    def micro_batch(self, step, last):
        CALLS.append(("micro_batch", last))
        return super().micro_batch(step, last)

    def backward(self, step, loss, last):
        CALLS.append(("backward", last))
        super().backward(step, loss, last)

    def clip(self, step):
        CALLS.append(("clip",))
        return super().clip(step)

    def optimizer_step(self, step):
        CALLS.append(("optimizer_step",))
        super().optimizer_step(step)

    def zero_grad(self, step):
        CALLS.append(("zero_grad",))
        super().zero_grad(step)


BACKEND = Recording(name="recording", title="Recording", order=-1, accelerate_file="ddp.yaml", phase_contents={})
'''


def test_a_backend_that_steps_its_own_way_is_one_module(tmp_path, monkeypatch):
    """The training step calls the backend's hooks, never asks which backend it is: a backend
    whose backward, clipping, optimizer step or zero_grad differ writes them in its module, and
    the run (its checks, accelerator, step) takes it with nothing else changed."""
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings
    from scopebench.policy.tools import StepCounter

    folder = tmp_path / "more"
    folder.mkdir()
    (folder / "recording.py").write_text(RECORDING)
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(folder)])
    all_backends.cache_clear()
    try:
        file = tmp_path / "recording.yaml"
        file.write_text((SRC / "train" / "accelerate_configs" / "ddp.yaml").read_text() + "recording: true\n")
        example = f"{SRC.parents[1]}/examples/flow_policy.py:make_policy"
        settings = TrainSettings(
            policy=example, backend="recording", accelerate_config=str(file), gradient_accumulation_steps=2
        )
        with PolicyTrainRun(settings, dataset_root="", chunk_size=8) as run:
            run.loop(StepCounter(2))
            assert run.backend.name == "recording" and run.work.steps == 2
        calls = sys.modules["scopebench.train.backends.recording"].CALLS
        step = [("micro_batch", False), ("backward", False), ("micro_batch", True), ("backward", True)]
        assert calls == [*step, ("clip",), ("optimizer_step",), ("zero_grad",)] * 2
    finally:
        all_backends.cache_clear()
        sys.modules.pop("scopebench.train.backends.recording", None)
