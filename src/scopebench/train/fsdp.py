"""FSDP2's mechanics: torch's ``fully_shard`` applied by the suite itself, the same code on CPU and CUDA.

The ``fsdp2`` and ``hsdp`` backends (:mod:`scopebench.train.backends.fsdp2`, ``hsdp``) use
these functions. accelerate applies its FSDP plugin only on CUDA (without it the run is
``MULTI_CPU`` and the parameters stay plain), so those backends do not go through accelerate's plugin:
:func:`shard_model` calls ``torch.distributed.fsdp.fully_shard`` on the model the way
torchtitan does, on gloo ranks here and on NCCL ranks on GPUs. accelerate still provides the
process-group view, the data sharding, the gathers and the RNG/scheduler checkpoint files.

What is sharded: the policy's ``shard_modules`` (for pi05, :data:`DEFAULT_UNITS`: every
joint decoder layer (its prefix block and its action-expert block together, since one
attention joins them), every vision-tower block, the vision patch embedding), or the module
classes ``fsdp_transformer_layer_cls_to_wrap`` of the accelerate file names, or by default
each child of the model with parameters of its own; then the root module for everything
left, so that no module mixes plain tensors and ``DTensor``\\ s. Each unit's parameters are all-gathered just before its forward
(``forward``), freed after it when ``reshard_after_forward`` is set, gathered again in the
backward and their gradients reduce-scattered (``bwd``); AdamW then steps the local shards
(``optim_step``), and clipping uses the total norm over every rank's shards
(:func:`clip_grad_norm`).

Mixed precision: with ``precision: bf16`` on CUDA, parameters are gathered and gradients
reduced in bf16 over fp32 sharded master weights and fp32 AdamW state
(``MixedPrecisionPolicy``); on CPU, where gloo reduces fp32, parameters stay fp32 and the
forward runs under the same bf16 autocast as ``ddp``. ``offload_params`` moves the shards
and the optimizer state to host memory (``CPUOffloadPolicy``; on a CPU run they are there
already and it changes nothing).

Checkpoints (:func:`save_sharded`, :func:`load_sharded`) are ``torch.distributed.checkpoint``
folders written by every rank; :func:`consolidated_model_state` reads one on a single process,
without a process group, for ``convert-checkpoint``. DCP keeps its index (``.metadata``) as a
pickle, and DCP's planner loads a folder's non-tensor items with ``torch.load(weights_only=False)``:
both loaders here read through :mod:`scopebench.train.data_only` (its ``DataOnlyReader`` for the
metadata, :func:`~scopebench.train.data_only.data_only_loading` around the load), so a
checkpoint stays data, not code, whoever calls them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scopebench.train.data_only import checked_reader, data_only_loading

__all__ = [
    "DEFAULT_UNITS",
    "MODEL_DIR",
    "OPTIMIZER_DIR",
    "FSDPSettings",
    "clip_grad_norm",
    "consolidated_model_state",
    "join_single_rank_group",
    "load_sharded",
    "local_fraction",
    "save_sharded",
    "shard_model",
]

#: Module classes sharded as their own unit by default (then the root).
DEFAULT_UNITS = ("JointLayer", "VisionBlock", "Conv2d")
#: The DCP folders of a checkpoint: the model's shards, the optimizer state's shards.
MODEL_DIR = "fsdp_model"
OPTIMIZER_DIR = "fsdp_optimizer"


@dataclass(frozen=True, kw_only=True)
class FSDPSettings:
    """The FSDP2 knobs of the accelerate file (``fsdp_config``)."""

    units: tuple[str, ...] | None = None
    """Class names of the modules sharded as one unit each (``fsdp_transformer_layer_cls_to_wrap``);
    None: the policy's ``shard_modules`` (pi05: :data:`DEFAULT_UNITS`)."""
    reshard_after_forward: bool = True
    """Free each unit's gathered parameters after its forward (gathered again in the backward)."""
    offload_params: bool = False
    """Keep parameter shards, gradients and AdamW state in host memory (``fsdp_offload_params``)."""


def _units(model: torch.nn.Module, names: tuple[str, ...]) -> list[tuple[str, torch.nn.Module]]:
    """The modules of ``model`` whose class is in ``names`` and that hold parameters, deepest first."""
    found = [
        (fqn, module)
        for fqn, module in model.named_modules()
        if fqn and type(module).__name__ in names and any(True for _ in module.parameters())
    ]
    return sorted(found, key=lambda item: -item[0].count("."))


def _default_units(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Each child of ``model`` that holds parameters and shares none with another child (a tied
    embedding stays in the root, with both its users)."""
    children = [(name, child, {id(p) for p in child.parameters()}) for name, child in model.named_children()]
    units = []
    for name, child, own in children:
        shared = any(own & other for n, _, other in children if n != name)
        if own and not shared:
            units.append((name, child))
    return units


def _given_units(model: torch.nn.Module, modules) -> list[tuple[str, torch.nn.Module]]:
    """``modules`` (submodules of ``model``) with their names, deepest first."""
    names = {id(m): fqn for fqn, m in model.named_modules() if fqn}
    found = [(names[id(m)], m) for m in modules if id(m) in names and any(True for _ in m.parameters())]
    return sorted(found, key=lambda item: -item[0].count("."))


def join_single_rank_group(device: torch.device) -> bool:
    """Create a one-rank process group when none exists (``fully_shard`` needs one, even alone);
    returns whether it did (the caller destroys it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


def shard_model(
    model: torch.nn.Module,
    settings: FSDPSettings,
    *,
    device: torch.device,
    precision: str,
    compile_units: bool = False,
    modules=None,
    mesh=None,
) -> list[str]:
    """``fully_shard`` every unit of ``model`` then the root, in place; returns the units' names.

    The units: the modules whose class ``settings.units`` names; else ``modules`` (a policy's
    ``shard_modules``); else each child of ``model`` with parameters of its own.

    Must come before the optimizer is built (it replaces the parameters by ``DTensor`` shards).
    With ``compile_units`` each unit's ``forward`` is compiled on its own (inductor), as
    torchtitan compiles per block: FSDP2's gather / reshard hooks stay eager around it, and
    the parameter names (checkpoint keys) do not change. ``mesh``: the device mesh (None: every
    rank on one dimension; a 2-D ``(replicate, shard)`` mesh shards within its second dimension
    and replicates across its first: HSDP).

    Raises:
        ValueError: no module of ``model`` has one of the unit classes (naming them).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if settings.units is not None:
        units = _units(model, settings.units)
    else:
        units = _given_units(model, modules) if modules is not None else _default_units(model)
    if not units and settings.units is not None:
        present = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(
            f"fsdp_transformer_layer_cls_to_wrap {','.join(settings.units)} names no module of the model; "
            f"its classes are {', '.join(present)}"
        )
    cuda = torch.device(device).type == "cuda"
    mixed = MixedPrecisionPolicy()
    if cuda and precision == "bf16":
        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    offload = CPUOffloadPolicy() if (settings.offload_params and cuda) else OffloadPolicy()
    options = dict(mp_policy=mixed, offload_policy=offload)
    if mesh is not None:
        options["mesh"] = mesh
    # A joint layer returns its prefix (k, v) for the inference cache as views; nothing
    # modifies them in place, which is what FSDP2's warning about view outputs is about.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPJointLayer\) returned a view tensor")
    for _, module in units:
        if compile_units:
            module.forward = torch.compile(module.forward)
        fully_shard(module, reshard_after_forward=settings.reshard_after_forward, **options)
    # The root's parameters are gathered for the whole forward anyway: keeping them spares
    # the backward a second gather (torchtitan does the same).
    fully_shard(model, reshard_after_forward=False, **options)
    return [fqn for fqn, _ in units]


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradients of ``params`` to a total norm of ``max_norm``; returns that norm before
    clipping, over every rank's shards (a plain tensor, no host sync)."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def local_fraction(module: torch.nn.Module) -> float:
    """Elements this rank holds of ``module``'s parameters over their full size."""
    from torch.distributed.tensor import DTensor

    local = full = 0
    for p in module.parameters():
        full += p.numel()
        local += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return local / full if full else 1.0


def _state(model: torch.nn.Module, optimizer: Any) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, optimizer if optimizer is not None else [])


def save_sharded(model: torch.nn.Module, optimizer: Any, folder: str | Path) -> None:
    """Every rank: write its shards of the model (``MODEL_DIR``) and the AdamW state (``OPTIMIZER_DIR``)."""
    import torch.distributed.checkpoint as dcp

    model_state, optim_state = _state(model, optimizer)
    dcp.save(model_state, checkpoint_id=str(Path(folder) / MODEL_DIR))
    if optimizer is not None:
        dcp.save(optim_state, checkpoint_id=str(Path(folder) / OPTIMIZER_DIR))


def load_sharded(model: torch.nn.Module, optimizer: Any, folder: str | Path) -> None:
    """Every rank: read its shards back into the sharded ``model`` and ``optimizer``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model_state, optim_state = _state(model, optimizer)
    # DCP's planner unpickles the non-tensor items (lr, step...) with weights_only=False
    with data_only_loading(f"a non-tensor item of {Path(folder) / MODEL_DIR}"):
        dcp.load(model_state, storage_reader=checked_reader(Path(folder) / MODEL_DIR))
    if optimizer is not None:
        with data_only_loading(f"a non-tensor item of {Path(folder) / OPTIMIZER_DIR}"):
            dcp.load(optim_state, storage_reader=checked_reader(Path(folder) / OPTIMIZER_DIR))
    set_state_dict(
        model,
        optimizer if optimizer is not None else [],
        model_state_dict=model_state,
        optim_state_dict=optim_state if optimizer is not None else {},
    )


def consolidated_model_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """The full fp32 weights of a checkpoint's ``MODEL_DIR``, on one process (no group)."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    # The private loader, as torch's own ``format_utils.dcp_to_torch_save``: the public
    # ``dcp.load`` fills a copy of an empty state dict, which this planner needs to grow.
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    # the planner loads non-tensor items with weights_only=False
    with data_only_loading(f"a non-tensor item of {Path(folder) / MODEL_DIR}"):
        _load_state_dict(
            state,
            storage_reader=checked_reader(Path(folder) / MODEL_DIR),
            planner=_EmptyStateDictLoadPlanner(),
            no_dist=True,
        )
    return {key: value for key, value in state.items() if isinstance(value, torch.Tensor)}
