"""accelerate config files: which backend they select, and the DeepSpeed settings they hold.

The suite ships one file per training backend (``configs/accelerate/``, a link to this
package's ``accelerate_configs/`` so that an installed package finds them too):

=========  ===========================  ==========================================
backend    file                          what it is
=========  ===========================  ==========================================
``ddp``    ``ddp.yaml``                  DistributedDataParallel (``MULTI_GPU``)
``zero2``  ``deepspeed_zero2.yaml``      DeepSpeed ZeRO-2: optimizer state + gradients sharded
``zero3``  ``deepspeed_zero3.yaml``      DeepSpeed ZeRO-3: parameters sharded too
``fsdp2``  ``fsdp2.yaml``                torch FSDP2 (``fully_shard``): everything sharded
=========  ===========================  ==========================================

The same files are what ``accelerate launch --config_file`` reads, so a run started by
``scopebench train`` and one started by hand get the same backend. :func:`load_accelerate_file`
reads the keys the suite uses and validates them (errors name the file and the key). The
training config is the source of truth for training hyper-parameters: where a file also
sets one (``mixed_precision``, ``gradient_accumulation_steps``, ``gradient_clipping``), the
training config wins and :func:`settings_in_force` says so.

The ``fsdp2`` file is accelerate's FSDP format (``distributed_type: FSDP``, ``fsdp_config``
with ``fsdp_version: 2``), so ``accelerate launch`` accepts it; the suite reads its knobs
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

from scopebench.validate import choice, integer, number, optional, yaml_mapping

__all__ = [
    "BACKEND_FILES",
    "ZERO_STAGES",
    "AccelerateFile",
    "load_accelerate_file",
    "settings_in_force",
    "shipped_accelerate_file",
]

#: Backend -> the shipped accelerate config file of that backend.
BACKEND_FILES = {
    "ddp": "ddp.yaml",
    "zero2": "deepspeed_zero2.yaml",
    "zero3": "deepspeed_zero3.yaml",
    "fsdp2": "fsdp2.yaml",
}
#: DeepSpeed backends -> ZeRO stage.
ZERO_STAGES = {"zero2": 2, "zero3": 3}
#: accelerate's ``distributed_type`` values that mean DDP (or one process).
_DDP_TYPES = ("NO", "MULTI_GPU", "MULTI_CPU")
#: accelerate ``mixed_precision`` -> the training config's ``precision``.
_PRECISION_OF = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}
#: DeepSpeed keys of the file that the suite uses, with accelerate's defaults.
_ZERO_KEYS = {
    "offload_optimizer_device": "none",
    "offload_param_device": "none",
    "zero3_init_flag": False,
    "zero3_save_16bit_model": False,
}


@dataclass(frozen=True, kw_only=True)
class AccelerateFile:
    """What an accelerate config file says, as far as the suite uses it."""

    path: str
    """The file."""
    backend: str
    """``ddp``, ``zero2``, ``zero3`` or ``fsdp2`` (from ``distributed_type``, ``zero_stage``, ``fsdp_version``)."""
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
    """The FSDP2 knobs (:class:`scopebench.train.fsdp.FSDPSettings`) of an ``fsdp2`` file, else None."""
    activation_checkpointing: bool | None = None
    """``fsdp_config.fsdp_activation_checkpointing``, if set (the training config wins)."""

    @property
    def zero_stage(self) -> int | None:
        return ZERO_STAGES.get(self.backend)


def shipped_accelerate_file(backend: str) -> Path:
    """The accelerate config file the suite ships for ``backend``.

    :Examples:

    >>> shipped_accelerate_file("zero2").name
    'deepspeed_zero2.yaml'
    """
    choice("backend", backend, BACKEND_FILES)
    return Path(str(resources.files("scopebench.train") / "accelerate_configs" / BACKEND_FILES[backend]))


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

    kind = choice(key("distributed_type"), raw.get("distributed_type", "NO"), (*_DDP_TYPES, "DEEPSPEED", "FSDP"))
    ds = raw.get("deepspeed_config") or {}
    if not isinstance(ds, dict):
        raise ValueError(f"{key('deepspeed_config')} must be a mapping, got {ds!r}")
    if kind == "DEEPSPEED":
        stage = choice(key("deepspeed_config.zero_stage"), ds.get("zero_stage"), tuple(ZERO_STAGES.values()))
        backend = next(name for name, s in ZERO_STAGES.items() if s == stage)
        if ds.get("deepspeed_config_file"):
            raise ValueError(
                f"{key('deepspeed_config.deepspeed_config_file')}: a separate DeepSpeed JSON is not supported; "
                "put zero_stage, offload devices and zero3 flags in deepspeed_config"
            )
    elif kind == "FSDP":
        backend = "fsdp2"
    else:
        backend = "ddp"
    fsdp, checkpointing = _fsdp_knobs(raw, key) if kind == "FSDP" else (None, None)
    mixed = raw.get("mixed_precision")
    precision = None if mixed is None else _PRECISION_OF[choice(key("mixed_precision"), mixed, _PRECISION_OF)]
    zero = {name: ds.get(name, default) for name, default in _ZERO_KEYS.items()}
    for name in ("offload_optimizer_device", "offload_param_device"):
        choice(key(f"deepspeed_config.{name}"), zero[name], ("none", "cpu", "nvme"))
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
        zero=zero if backend in ZERO_STAGES else {},
        fsdp=fsdp,
        activation_checkpointing=checkpointing,
    )


def _fsdp_knobs(raw: dict[str, Any], key) -> tuple[Any, bool | None]:
    """The :class:`~scopebench.train.fsdp.FSDPSettings` of an FSDP file, and its activation
    checkpointing flag (None when unset)."""
    from scopebench.train.fsdp import FSDPSettings
    from scopebench.validate import flag

    cfg = raw.get("fsdp_config") or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"{key('fsdp_config')} must be a mapping, got {cfg!r}")
    choice(key("fsdp_config.fsdp_version"), cfg.get("fsdp_version", 1), (2,))
    wrap = cfg.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    choice(key("fsdp_config.fsdp_auto_wrap_policy"), wrap, ("TRANSFORMER_BASED_WRAP",))
    state = cfg.get("fsdp_state_dict_type", "SHARDED_STATE_DICT")
    choice(key("fsdp_config.fsdp_state_dict_type"), state, ("SHARDED_STATE_DICT",))
    units = cfg.get("fsdp_transformer_layer_cls_to_wrap")  # None: the policy's shard_modules
    if isinstance(units, str):
        units = [name.strip() for name in units.split(",")]
    if units is not None and (
        not isinstance(units, list) or not units or not all(isinstance(n, str) and n for n in units)
    ):
        raise ValueError(
            f"{key('fsdp_config.fsdp_transformer_layer_cls_to_wrap')} must name module classes "
            f"(comma-separated), got {units!r}"
        )
    knobs = {}
    for name, field_name in (
        ("fsdp_reshard_after_forward", "reshard_after_forward"),
        ("fsdp_offload_params", "offload_params"),
    ):
        if name in cfg:
            knobs[field_name] = flag(key(f"fsdp_config.{name}"), cfg[name])
    checkpointing = cfg.get("fsdp_activation_checkpointing")
    if checkpointing is not None:
        flag(key("fsdp_config.fsdp_activation_checkpointing"), checkpointing)
    return FSDPSettings(units=None if units is None else tuple(units), **knobs), checkpointing


def settings_in_force(file: AccelerateFile, settings: Any) -> list[str]:
    """One line per setting the file and the training config both set, saying which wins.

    ``settings`` is a :class:`scopebench.policy.settings.TrainSettings` (``precision``,
    ``gradient_accumulation_steps``, ``grad_clip``; ``gradient_checkpointing`` for ``fsdp2``).

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
    if file.backend == "fsdp2":
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
