"""Training backends: one object per backend, one module each, found by this package.

Every layer that needs to know how a backend differs asks its
:class:`~scopebench.train.backends.base.TrainingBackend` (what it shards, its minimum ranks,
its conflicts, its memory, its accelerator, how it wraps the model, its checkpoints, what
each phase holds). Settings keep the backend's name; a run resolves the object once with
:func:`get_backend` and hands it down. No module outside this package compares backend names.

The backends are :func:`all_backends`, in their :attr:`~TrainingBackend.order` (one module each,
named as the backend); shared DeepSpeed code in :mod:`._deepspeed`, FSDP's mechanics in
:mod:`scopebench.train.fsdp`. Every list of backends a user reads comes from here: the ``backend``
setting's choices, the tools' ``--help`` (``scopebench.commands._policy_options``) and the tables
of docs/distributed.md (:func:`backend_table`, :func:`phase_table`, kept current by
``tests/train/test_backend_lists.py``).

Adding a backend: write ``<name>.py`` here with a module-level ``BACKEND`` (an instance of
:class:`TrainingBackend` or of a subclass overriding what differs), ship its accelerate file
in ``scopebench/train/accelerate_configs/``, and test it. Modules whose name starts with an
underscore are shared code, not backends. Nothing outside this package changes.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

from scopebench.train.backends._deepspeed import ZERO_DEFAULTS
from scopebench.train.backends.base import MODEL_FILE, RNG_FILES, Prepared, TrainingBackend

__all__ = [
    "DEFAULT_BACKEND",
    "MODEL_FILE",
    "RNG_FILES",
    "Prepared",
    "TrainingBackend",
    "ZERO_DEFAULTS",
    "all_backends",
    "backend_names",
    "backend_table",
    "check_launcher",
    "deepspeed_config",
    "find_backend",
    "gather_buffer_bytes",
    "get_backend",
    "model_state_bytes",
    "phase_table",
]

#: The backend of a run that names none (one process: the plain model).
DEFAULT_BACKEND = "ddp"


@functools.cache
def all_backends() -> tuple[TrainingBackend, ...]:
    """Every backend of this package, in their order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        backend = getattr(module, "BACKEND", None)
        if not isinstance(backend, TrainingBackend) or backend.name != info.name:
            raise TypeError(f"{module.__name__} must define BACKEND, a TrainingBackend named {info.name!r}")
        found.append(backend)
    return tuple(sorted(found, key=lambda b: b.order))


def backend_names() -> tuple[str, ...]:
    """The ``backend`` setting's allowed values, in order.

    :Examples:
        >>> backend_names()[0], len(backend_names()) == len(all_backends())
        ('ddp', True)
    """
    return tuple(b.name for b in all_backends())


def backend_table() -> str:
    """The Markdown table of every backend: its setting, what it shards, its fewest ranks and
    its shipped accelerate file (docs/distributed.md, "Training backends")."""
    rows = [
        "| `backend` | what it is | parameters | gradients | optimizer state | fewest ranks | accelerate file |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in all_backends():
        held = ("sharded" if on else "whole" for on in (b.shards_parameters, b.shards_gradients, b.shards_optimizer))
        rows.append(f"| `{b.name}` | {b.title} | {' | '.join(held)} | {b.min_ranks} | `{b.accelerate_file}` |")
    return "\n".join(rows)


def phase_table() -> str:
    """The Markdown table of what each backend-dependent training phase holds under every
    backend (:attr:`TrainingBackend.phase_contents`; a phase a backend leaves out holds the
    default work, written ``-``)."""
    phases = ("forward", "bwd", "unscale_clip", "optim_step", "zero_grad_sched")
    rows = ["| `backend` | " + " | ".join(f"`{p}`" for p in phases) + " |", "|---" * (len(phases) + 1) + "|"]
    for b in all_backends():
        cells = (b.phase_contents.get(p, "-").replace("|", "\\|") for p in phases)
        rows.append(f"| `{b.name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def find_backend(name: Any) -> TrainingBackend | None:
    """The backend named ``name``, else None (a report reading another version's results)."""
    return next((b for b in all_backends() if b.name == name), None)


def get_backend(backend: str | TrainingBackend, key: str = "backend") -> TrainingBackend:
    """The backend named ``backend`` (a backend is returned as it is).

    Raises:
        ValueError: an unknown name, naming ``key``, the value and the backends.
    """
    if isinstance(backend, TrainingBackend):
        return backend
    from scopebench.validate import choice

    choice(key, backend, backend_names())
    return find_backend(backend)


def model_state_bytes(
    num_params: int, *, backend: str | TrainingBackend, world_size: int = 1, optimizer: bool = True,
    precision: str = "fp32", file: Any = None,
) -> dict[str, float]:  # fmt: skip
    """Bytes per rank of ``parameters``, ``gradients`` and ``optimizer_state`` under ``backend``
    (:meth:`TrainingBackend.model_state_bytes`; docs/memory in ``scopebench.train.memory``).

    :Examples:

    >>> model_state_bytes(1000, backend="zero2", world_size=4)
    {'parameters': 4000.0, 'gradients': 1000.0, 'optimizer_state': 3000.0}
    >>> model_state_bytes(1000, backend="zero3", world_size=4, precision="bf16")
    {'parameters': 500.0, 'gradients': 500.0, 'optimizer_state': 3000.0}
    >>> model_state_bytes(1000, backend="fsdp2", world_size=4, optimizer=False)
    {'parameters': 1000.0, 'gradients': 1000.0, 'optimizer_state': 0.0}
    """
    return get_backend(backend).model_state_bytes(
        num_params, world_size=world_size, optimizer=optimizer, precision=precision, file=file
    )


def gather_buffer_bytes(
    model: Any, *, backend: str | TrainingBackend, world_size: int = 1, precision: str = "fp32",
    units: tuple[str, ...] = (), zero: dict[str, Any] | None = None, file: Any = None,
) -> float:  # fmt: skip
    """Bytes per rank of ``backend``'s communication buffers for ``model`` (a module, on the
    meta device is enough; :meth:`TrainingBackend.gather_buffer_bytes`).

    Args:
        units: FSDP's unit classes (``fsdp_transformer_layer_cls_to_wrap``).
        zero: DeepSpeed settings overriding :data:`~scopebench.train.backends._deepspeed.ZERO_DEFAULTS`.

    :Examples:

    >>> import torch
    >>> with torch.device("meta"):
    ...     model = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 10))
    >>> gather_buffer_bytes(model, backend="ddp", world_size=2)  # DDP's buckets: every gradient again
    44440.0
    >>> gather_buffer_bytes(model, backend="zero2", world_size=2) / 1e9  # the 5e8-element bucket
    2.0
    """
    return get_backend(backend).gather_buffer_bytes(
        model, world_size=world_size, precision=precision, units=units, zero=zero, file=file
    )


def deepspeed_config(settings: Any) -> dict[str, Any]:
    """The DeepSpeed config of a ZeRO run (``settings``: an
    :class:`~scopebench.train.accelerator.AcceleratorSettings` of a ZeRO backend).

    :Examples:

    >>> from scopebench.train.accelerator import AcceleratorSettings
    >>> cfg = deepspeed_config(AcceleratorSettings(backend="zero3", micro_batch_size=4, grad_clip=1.0))
    >>> cfg["zero_optimization"]["stage"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_clipping"]
    (3, 4, 1.0)
    """
    backend = get_backend(settings.backend)
    if not backend.uses_deepspeed:
        raise ValueError(f"backend={backend.name} does not run on DeepSpeed: it has no DeepSpeed config")
    return backend.deepspeed_config(settings)


def check_launcher(backend: str | TrainingBackend, environ: Any = None) -> None:
    """Refuse a backend that disagrees with the DeepSpeed config ``accelerate launch`` was given
    (``ACCELERATE_USE_DEEPSPEED``, ``ACCELERATE_DEEPSPEED_ZERO_STAGE``).

    Raises:
        ValueError: naming the launcher's ZeRO stage and ``backend``.
    """
    import os

    env = os.environ if environ is None else environ
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return
    stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
    wanted = next((b for b in all_backends() if b.zero_stage is not None and str(b.zero_stage) == stage), None)
    chosen = get_backend(backend)
    if wanted is not chosen:
        suggestion = wanted.name if wanted else next(b.name for b in all_backends() if b.zero_stage is not None)
        raise ValueError(
            f"accelerate launch started this process with a DeepSpeed ZeRO-{stage or '?'} config, but "
            f"backend={chosen.name}: pass the same file with --accelerate-config, or set backend={suggestion}"
        )
