"""Every training backend, one after another, in this process: what a run leaves behind is caught.

benchopt runs a grid's cells one after another in one process, rank 0 being that process and
the other ranks spawned by the run (the local spawn). A backend that leaves process-wide state
behind (DeepSpeed ZeRO-3 replaced ``torch.nn.functional.linear`` and counted on in its counters;
its engine's hooks, its module stack and DTensor's caches kept every run's model or mesh, and
their gloo sockets, alive) changes or burdens every later cell. Here ddp, zero2, zero3, fsdp2 and
hsdp train the tiny policy on two ranks in turn, the test process being rank 0, and after each
run (dropped) the process must be as it was before the first: the same functions in torch,
DeepSpeed, accelerate and DTensor, the same module-level values and container sizes, the same
environment, torch settings, threads, child processes, signal handlers and open files and
sockets; and each run's losses are the golden ones (``golden/losses_fp32.json``, written by
fresh torchrun processes), so a leftover that alters a later run's numerics fails too.
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import sys
import threading
import warnings
from collections import Counter

import pytest
import torch
from conftest import REPO

from .test_backends import GOLDEN, TOLERANCE, TRAINED

TINY = REPO / "configs" / "policy" / "tiny.yml"
STEPS = 3
#: Modules whose globals and classes are the process-wide state of the backends' libraries.
LIBRARIES = (
    "torch.nn.functional",
    "torch.distributed.distributed_c10d",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.device_mesh",
    "deepspeed.runtime.zero",
    "deepspeed.utils.groups",
    "deepspeed.comm",
    "deepspeed.accelerator",
    "accelerate.state",
)
#: What may differ after a run, and why it is no leftover of the run.
EXPECTED = {
    # torch's record of the last default group's backend: set by every init_process_group, the
    # same "gloo" for every run here (destroy_process_group does not reset it)
    "torch.distributed.distributed_c10d._backend",
    # torch registers its built-in gloo backend on the process's first gloo group, once
    "torch.distributed.distributed_c10d.Backend._plugins",
    # DeepSpeed adds its Muon optimizer to this list on its first ZeRO optimizer check (once: guarded)
    "deepspeed.runtime.zero.utils.ZERO_SUPPORTED_OPTIMIZERS",
    # FSDP2 makes one FSDP subclass per module class it shards and keeps it for the next run:
    # classes only, the same ones for every run (no run's object)
    "torch.distributed.fsdp._fully_shard._fully_shard.cls_to_fsdp_cls",
}
_SIMPLE = (int, float, str, bool, type(None))


def _entries(namespace, prefix: str) -> dict[str, tuple[str, object]]:
    """``prefix.name`` -> ("object", the callable) / ("value", a plain value) / ("size", a container's length)."""
    out = {}
    for name, value in list(vars(namespace).items()):
        if name.startswith("__") and name != "__init__":
            continue
        key = f"{prefix}.{name}"
        if isinstance(value, _SIMPLE) or (isinstance(value, tuple) and all(isinstance(v, _SIMPLE) for v in value)):
            out[key] = ("value", value)
        elif isinstance(value, (list, dict, set)):
            out[key] = ("size", len(value))
        elif callable(value) or isinstance(value, (staticmethod, classmethod, property)):
            out[key] = ("object", value)
    return out


def _subclasses(cls: type) -> set[type]:
    seen, todo = set(), [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen


def _ppid(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _open_files() -> Counter:
    """What this process holds open, by target: files, sockets (by kind), epoll instances. Copies
    of the standard streams are left out: DeepSpeed's first op load duplicates one, once."""
    targets = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
    streams = {targets.get(fd) for fd in (0, 1, 2)}
    return Counter(
        target.split(":[")[0] if target.startswith(("socket:", "anon_inode:")) else target
        for target in targets.values()
        if target not in streams
    )


def process_state() -> dict[str, tuple[str, object]]:
    """Everything of this process a run could leave changed (the module docstring)."""
    with warnings.catch_warnings():  # looking at torch.distributed.reduce_op warns it is deprecated
        warnings.simplefilter("ignore", FutureWarning)
        return _process_state()


def _process_state() -> dict[str, tuple[str, object]]:
    state: dict[str, tuple[str, object]] = {}
    for prefix, namespace in {
        "torch": torch,
        "torch.Tensor": torch.Tensor,
        "torch.nn.Module": torch.nn.Module,
        "torch.nn.Parameter": torch.nn.Parameter,
        "torch.autograd": torch.autograd,
    }.items():
        state.update(_entries(namespace, prefix))
    for cls in _subclasses(torch.nn.Module):
        state[f"{cls.__module__}.{cls.__qualname__}.__init__"] = ("object", cls.__dict__.get("__init__"))
    for name in [m for m in sys.modules if m.startswith(LIBRARIES)]:
        module = sys.modules[name]
        state.update(_entries(module, name))
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == name:
                state.update(_entries(value, f"{name}.{attr}"))
    from deepspeed.accelerator import get_accelerator

    state["deepspeed accelerator attributes"] = ("value", tuple(sorted(vars(get_accelerator()))))
    from accelerate.state import AcceleratorState, GradientState, PartialState

    for singleton in (AcceleratorState, GradientState, PartialState):
        state[f"{singleton.__name__}._shared_state"] = ("value", tuple(sorted(singleton._shared_state)))
    settings = {
        "environment": tuple(sorted(os.environ.items())),
        "torch threads": torch.get_num_threads(),
        "torch default dtype": str(torch.get_default_dtype()),
        "torch grad mode": torch.is_grad_enabled(),
        "torch deterministic": torch.are_deterministic_algorithms_enabled(),
        "torch matmul precision": torch.get_float32_matmul_precision(),
        "torch cpu autocast": torch.is_autocast_enabled("cpu"),
        "torch anomaly mode": torch.is_anomaly_enabled(),
        "process group": torch.distributed.is_initialized(),
        "working folder": os.getcwd(),
        "sys.path": tuple(sys.path),
        "signal handlers": tuple(
            str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP)
        ),
        "threads": tuple(sorted(t.name for t in threading.enumerate())),
        "child processes": tuple(sorted(p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == os.getpid())),
        "open files and sockets": tuple(sorted(_open_files().items())),
    }
    state.update({key: ("value", value) for key, value in settings.items()})
    return state


def leftovers(before: dict, after: dict) -> list[str]:
    """What differs, by name; the ledger's own wrappers of torch.distributed's collectives (one
    per process, deferring to the original through ``__wrapped__``) are not leftovers."""
    found = []
    for key, (kind, old) in before.items():
        if key in EXPECTED or key not in after:  # a class made during the run is no state of before
            continue
        new = after[key][1]
        if kind == "object":
            if new is not old and getattr(new, "__wrapped__", None) is not old:
                found.append(f"{key}: {old!r} -> {new!r}")
        elif new != old and not (old != old and new != new):  # NaN: torch.nan
            found.append(f"{key}: {old!r} -> {new!r}")
    return found


def _losses(config, root) -> list[float]:
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.profiler import ProfilerConfig

    losses: list[float] = []
    calls = [0]

    def callback() -> bool:  # benchopt's: after each iteration, the row of the one before
        if calls[0]:
            losses.append(run.metrics()["train_loss"])
        calls[0] += 1
        return calls[0] <= STEPS

    run = PolicyTrainRun(
        config.train, dataset_root=root, chunk_size=config.dataset.chunk_size, profiler=ProfilerConfig(mode="custom")
    )
    with run:
        run.loop(callback)
    return losses


@pytest.mark.slow
def test_every_backend_in_turn_leaves_the_process_as_it_found_it(tmp_path):
    import deepspeed  # noqa: F401  what importing them sets once is no run's leftover
    import setuptools  # noqa: F401  (DeepSpeed's op load imports it: it extends sys.path)
    import torch._dynamo  # noqa: F401
    import torch.nn.functional as F

    from scopebench.policy.settings import load_run_config

    overrides = [("find_unused_params", False), ("nproc_per_node", 2), ("dataset.cache_dir", str(tmp_path))]
    root = load_run_config(TINY, overrides).dataset.materialize()
    golden = json.loads((GOLDEN / "losses_fp32.json").read_text())
    tolerance = TOLERANCE["fp32"][1]
    linear = F.linear
    gc.collect()
    before = process_state()
    assert set(TRAINED) == {"ddp", "zero2", "zero3", "fsdp2", "hsdp"}
    for backend in TRAINED:
        config = load_run_config(TINY, [*overrides, ("backend", backend)])
        losses = _losses(config, root)
        gc.collect()  # the run is dropped: what is left is the process's
        assert F.linear is linear, f"after {backend}: torch.nn.functional.linear is {F.linear!r}"
        left = leftovers(before, process_state())
        assert not left, f"{backend} left behind:\n" + "\n".join(left)
        expected = golden[backend][:STEPS]
        assert len(losses) == STEPS and all(math.isclose(a, b, rel_tol=tolerance) for a, b in zip(losses, expected)), (
            backend,
            losses,
            expected,
        )
