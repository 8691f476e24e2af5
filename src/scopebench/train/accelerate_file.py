"""accelerate config files: which backend they select, and the DeepSpeed settings they hold.

The suite ships one file per training backend (``configs/accelerate/``, a link to this
package's ``accelerate_configs/`` so that an installed package finds them too), named by the
backend (:attr:`~scopebench.train.backends.TrainingBackend.accelerate_file`):

=========  ===========================  ==========================================
backend    file                          what it is
=========  ===========================  ==========================================
``ddp``    ``ddp.yaml``                  DistributedDataParallel (``MULTI_GPU``)
``zero2``  ``deepspeed_zero2.yaml``      DeepSpeed ZeRO-2: optimizer state + gradients sharded
``zero3``  ``deepspeed_zero3.yaml``      DeepSpeed ZeRO-3: parameters sharded too
``fsdp2``  ``fsdp2.yaml``                torch FSDP2 (``fully_shard``): everything sharded
``hsdp``   ``hsdp.yaml``                 FSDP2 on a 2-D mesh: sharded in a node, replicated across
=========  ===========================  ==========================================

Which backend a file selects, and the knobs it reads, each backend says itself
(``selects`` / ``read_file``).

The same files are what ``accelerate launch --config_file`` reads, so a run started by
``scopebench train`` and one started by hand get the same backend. :func:`load_accelerate_file`
reads the keys the suite uses and validates them (errors name the file and the key). The
training config is the source of truth for training hyper-parameters: where a file also
sets one (``mixed_precision``, ``gradient_accumulation_steps``, ``gradient_clipping``), the
training config wins and :func:`settings_in_force` says so.

The ``fsdp2`` and ``hsdp`` files are accelerate's FSDP format (``distributed_type: FSDP``,
``fsdp_config`` with ``fsdp_version: 2``; ``hsdp`` adds ``parallelism_config``), so ``accelerate
launch`` accepts them; the suite reads their knobs
(``fsdp_transformer_layer_cls_to_wrap``, ``fsdp_reshard_after_forward``, ``fsdp_offload_params``)
into :class:`scopebench.train.fsdp.FSDPSettings` and applies ``fully_shard`` itself, on CPU as
on CUDA (accelerate's plugin does nothing without CUDA). ``fsdp_activation_checkpointing`` is
the training config's ``gradient_checkpointing``, which wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from scopebench.train.backends import TrainingBackend, all_backends, get_backend
from scopebench.validate import choice, integer, number, optional, yaml_mapping

__all__ = [
    "BACKEND_FILES",
    "AccelerateFile",
    "load_accelerate_file",
    "resolve_accelerate_file",
    "settings_in_force",
    "shipped_accelerate_file",
]

#: Backend -> the shipped accelerate config file of that backend.
BACKEND_FILES = {b.name: b.accelerate_file for b in all_backends()}
#: accelerate's ``distributed_type`` values the suite runs.
_TYPES = ("NO", "MULTI_GPU", "MULTI_CPU", "DEEPSPEED", "FSDP")
#: accelerate ``mixed_precision`` -> the training config's ``precision``.
_PRECISION_OF = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}


@dataclass(frozen=True, kw_only=True)
class AccelerateFile:
    """What an accelerate config file says, as far as the suite uses it."""

    path: str
    """The file."""
    backend: TrainingBackend
    """The backend it selects (from ``distributed_type``, ``zero_stage``, ``parallelism_config``;
    a name given is resolved once, here)."""
    num_processes: int = 1
    """Processes on all machines (``num_processes``)."""
    precision: str | None = None
    """``mixed_precision`` as a ``precision`` value (``fp32``, ``bf16``, ``fp16``), if set."""
    gradient_accumulation_steps: int | None = None
    """``deepspeed_config.gradient_accumulation_steps``, if set."""
    gradient_clipping: float | None = None
    """``deepspeed_config.gradient_clipping``, if set."""
    zero: dict[str, Any] = field(default_factory=dict)
    """The ZeRO knobs (offload devices, ``zero3_init_flag``, ``zero3_save_16bit_model``)."""
    fsdp: Any = None
    """The FSDP2 knobs (:class:`scopebench.train.fsdp.FSDPSettings`) of an FSDP file, else None."""
    activation_checkpointing: bool | None = None
    """``fsdp_config.fsdp_activation_checkpointing``, if set (the training config wins)."""
    mesh: dict[str, Any] | None = None
    """HSDP's ``parallelism_config`` sizes (replicate, shard: integers or ``auto``), else None."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", get_backend(self.backend))

    @property
    def zero_stage(self) -> int | None:
        return self.backend.zero_stage


def shipped_accelerate_file(backend: str | TrainingBackend) -> Path:
    """The accelerate config file the suite ships for ``backend``.

    :Examples:

    >>> shipped_accelerate_file("zero2").name
    'deepspeed_zero2.yaml'
    """
    name = get_backend(backend).accelerate_file
    return Path(str(resources.files("scopebench.train") / "accelerate_configs" / name))


def resolve_accelerate_file(backend: str | TrainingBackend, path: str | Path | None = None) -> AccelerateFile:
    """The accelerate file of a run (``path``, else the shipped one of ``backend``), checked
    against ``backend`` (the ``accelerate_config`` and ``backend`` settings): the run's backend
    and its file, resolved together once (the file's :attr:`~AccelerateFile.backend` is the
    :class:`~scopebench.train.backends.TrainingBackend` every later step is handed).

    Raises:
        ValueError: the file selects another backend, naming both.
    """
    chosen = get_backend(backend)
    file = load_accelerate_file(path or shipped_accelerate_file(chosen))
    if file.backend != chosen:
        raise ValueError(
            f"accelerate_config {file.path} selects backend {file.backend.name}, but backend={chosen.name}; "
            f"set backend={file.backend.name} or pass a {chosen.name} file"
        )
    return file


def load_accelerate_file(path: str | Path) -> AccelerateFile:
    """Read and check an accelerate config file.

    Raises:
        FileNotFoundError: no such file (named).
        ValueError: not YAML, or a key the suite uses has a value it cannot run (the
            message names the file, the key and the value).
    """
    path = Path(path)
    raw = yaml_mapping(path, "accelerate config")

    def key(name: str) -> str:
        return f"{name} in {path}"

    kind = choice(key("distributed_type"), raw.get("distributed_type", "NO"), _TYPES)
    ds = raw.get("deepspeed_config") or {}
    if not isinstance(ds, dict):
        raise ValueError(f"{key('deepspeed_config')} must be a mapping, got {ds!r}")
    if kind == "DEEPSPEED":
        stages = [b.zero_stage for b in all_backends() if b.zero_stage is not None]
        choice(key("deepspeed_config.zero_stage"), ds.get("zero_stage"), tuple(stages))
    backend = next(b for b in all_backends() if b.selects(kind, raw))
    knobs = backend.read_file(raw, key)
    mixed = raw.get("mixed_precision")
    precision = None if mixed is None else _PRECISION_OF[choice(key("mixed_precision"), mixed, _PRECISION_OF)]
    return AccelerateFile(
        path=str(path),
        backend=backend,
        num_processes=integer(key("num_processes"), raw.get("num_processes", 1), low=1),
        precision=precision,
        gradient_accumulation_steps=optional(
            integer, key("deepspeed_config.gradient_accumulation_steps"), ds.get("gradient_accumulation_steps"), low=1
        ),
        gradient_clipping=optional(
            number, key("deepspeed_config.gradient_clipping"), ds.get("gradient_clipping"), low=0
        ),
        **knobs,
    )


def settings_in_force(file: AccelerateFile, settings: Any) -> list[str]:
    """One line per setting the file and the training config both set, saying which wins.

    ``settings`` is a :class:`scopebench.policy.settings.TrainSettings` (``precision``,
    ``gradient_accumulation_steps``, ``grad_clip``; ``gradient_checkpointing`` for a file with FSDP
    knobs).

    :Examples:

    >>> from types import SimpleNamespace as S
    >>> f = AccelerateFile(path="z.yaml", backend="zero2", precision="bf16", gradient_clipping=1.0)
    >>> settings_in_force(f, S(precision="fp32", gradient_accumulation_steps=1, grad_clip=1.0))[0]
    'precision=fp32 (the training config; z.yaml says mixed_precision=bf16)'
    """
    pairs = [
        ("precision", settings.precision, "mixed_precision", file.precision),
        (
            "gradient_accumulation_steps",
            settings.gradient_accumulation_steps,
            "gradient_accumulation_steps",
            file.gradient_accumulation_steps,
        ),
        ("grad_clip", settings.grad_clip, "gradient_clipping", file.gradient_clipping),
    ]
    if file.fsdp is not None:
        pairs.append(
            (
                "gradient_checkpointing",
                settings.gradient_checkpointing,
                "fsdp_activation_checkpointing",
                file.activation_checkpointing,
            )
        )
    lines = []
    for name, value, file_name, file_value in pairs:
        value, file_value = (str(v).lower() if isinstance(v, bool) else v for v in (value, file_value))
        if file_value is None:
            lines.append(f"{name}={value} (the training config)")
            continue
        shown = {"fp32": "no"}.get(file_value, file_value) if file_name == "mixed_precision" else file_value
        same = "" if file_value == value else f"; {Path(file.path).name} says {file_name}={shown}"
        lines.append(f"{name}={value} (the training config{same})")
    return lines
