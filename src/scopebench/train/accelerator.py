"""One ``accelerate.Accelerator`` per run, on whatever process group the run joined.

:class:`scopebench.distributed.DistSession` creates (or joins) the process group: torchrun,
``accelerate launch``, SLURM, or our own local spawn. accelerate then has to see that
group, which it does not by itself in two cases:

* without CUDA it treats the processes as independent (world size 1, no DDP) unless it
  is in ``MULTI_CPU`` mode, which it enters only when ``LOCAL_RANK``/``WORLD_SIZE`` are
  set and the group is created with ``InitProcessGroupKwargs(backend="gloo")``;
* our own spawned ranks carry their rank in ``SCOPEBENCH_*`` variables, which accelerate
  does not read.

:func:`build_accelerator` therefore exports the launcher variables accelerate reads,
for the duration of the constructor only, from the :class:`~scopebench.distributed.DistInfo` of
the group that already exists, and restores the environment afterwards (accelerate also
writes ``RANK``... itself in ``MULTI_CPU`` mode, and a later run in the same benchopt
process must not believe it runs under torchrun). accelerate keeps its state in
process-wide singletons; :func:`release_accelerator` clears them so that the next run
starts from scratch.

``backend`` is the run's :class:`~scopebench.train.backends.TrainingBackend` (resolved once,
by the run), whose ``accelerator_kwargs`` build the accelerator (DDP; DeepSpeed's ZeRO stages through
accelerate's DeepSpeed plugin; FSDP2 and HSDP, sharded by the suite itself, seen by accelerate
as a ``MULTI_CPU`` / ``MULTI_GPU`` run); the backend's ``prepare`` then wraps the model.
DeepSpeed reads the launcher variables for the whole run, not only the constructor
(``LOCAL_RANK`` in ``prepare``): :func:`release_accelerator` restores them.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from scopebench.train.backends import DEFAULT_BACKEND, TrainingBackend, get_backend
from scopebench.train.backends.base import PRECISIONS
from scopebench.validate import choice, flag, integer, number, optional

__all__ = [
    "PRECISIONS",
    "AcceleratorSettings",
    "build_accelerator",
    "release_accelerator",
]

_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_USE_FSDP",
    # Set by ``accelerate launch`` with a DeepSpeed file; the plugin refuses an explicit
    # config while it is set, and the explicit config already holds the file's values.
    "ACCELERATE_CONFIG_DS_FIELDS",
)
#: The environment as it was before :func:`build_accelerator` changed it (restored by
#: :func:`release_accelerator`); None when nothing is to restore.
_SAVED_ENV: dict[str, str | None] | None = None


@dataclass(frozen=True, kw_only=True)
class AcceleratorSettings:
    """How the accelerator wraps the model."""

    backend: TrainingBackend = DEFAULT_BACKEND
    """The run's backend (a name of :func:`~scopebench.train.backends.backend_names` given here is
    resolved once; ``ddp``: DistributedDataParallel when there are several ranks). Whether it can
    run on the group's ranks is the run's check (``TrainingBackend.conflict``), made before
    anything is built."""
    precision: str = "fp32"
    """``fp32``, or ``bf16`` autocast over fp32 weights (DeepSpeed: its bf16 mode)."""
    find_unused_params: bool = True
    """DDP's ``find_unused_parameters`` (walks the autograd graph every step when true)."""
    torch_compile: bool = False
    """Compile the prepared model with inductor (accelerate's dynamo plugin)."""
    timeout_sec: float | None = None
    """Collective timeout of a group accelerate creates itself (None: torch's default)."""
    micro_batch_size: int = 1
    """Samples per rank and micro-step (DeepSpeed's ``train_micro_batch_size_per_gpu``)."""
    gradient_accumulation_steps: int = 1
    """Micro-steps per optimizer step (DeepSpeed scales the loss by its inverse)."""
    grad_clip: float = 0.0
    """DeepSpeed's ``gradient_clipping`` (0: none); DDP clips in the training step."""
    zero: dict[str, Any] = field(default_factory=dict)
    """ZeRO knobs of the accelerate file (:func:`scopebench.train.accelerate_file.load_accelerate_file`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", get_backend(self.backend))
        choice("precision", self.precision, PRECISIONS)
        flag("find_unused_params", self.find_unused_params)
        flag("torch_compile", self.torch_compile)
        optional(number, "group_timeout_sec", self.timeout_sec, low=0, low_open=True)
        integer("batch_size", self.micro_batch_size, low=1)
        integer("gradient_accumulation_steps", self.gradient_accumulation_steps, low=1)
        number("grad_clip", self.grad_clip, low=0)


def _export_launcher_environment(info: Any, deepspeed: bool) -> None:
    """torchrun's variables for ``info``'s group, for accelerate and DeepSpeed to read during
    the run; the previous values are kept for :func:`release_accelerator`."""
    import torch

    global _SAVED_ENV
    if _SAVED_ENV is None:
        _SAVED_ENV = {key: os.environ.get(key) for key in _LAUNCHER_VARS}
    if info.world_size > 1:
        os.environ.update(
            RANK=str(info.rank),
            WORLD_SIZE=str(info.world_size),
            LOCAL_RANK=str(info.local_rank),
            MASTER_ADDR=str(info.master_addr),
            MASTER_PORT=str(info.master_port),
        )
        if info.source == "spawn":  # every spawned rank is on this machine
            os.environ["LOCAL_WORLD_SIZE"] = str(info.world_size)
    # accelerate resets the thread count in MULTI_CPU mode unless this is set; the run
    # object has already chosen it.
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    # An explicit ``ddp`` must not pick up a DeepSpeed plugin from a launcher's variables.
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true" if deepspeed else "false"
    # FSDP is applied by the suite (scopebench.train.fsdp), never by accelerate's plugin.
    os.environ["ACCELERATE_USE_FSDP"] = "false"
    os.environ.pop("ACCELERATE_CONFIG_DS_FIELDS", None)


def build_accelerator(settings: AcceleratorSettings, info: Any, device: Any):
    """An ``Accelerator`` for this rank of the group described by ``info``.

    Args:
        settings: Backend, precision, DDP and compile options.
        info: :class:`scopebench.distributed.DistInfo` of the (already initialised) group.
        device: ``torch.device`` this rank computes on; CPU runs use ``cpu=True`` (DDP) or
            DeepSpeed's CPU accelerator (ZeRO).

    Returns:
        The accelerator; its ``num_processes`` equals ``info.world_size``.

    Raises:
        RuntimeError: accelerate sees another world size than the group (a canary for
            the environment handling above).
    """
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    backend = settings.backend
    cpu = torch.device(device).type != "cuda"
    group_kwargs = {"backend": "gloo" if cpu else "nccl"}
    if settings.timeout_sec is not None:
        group_kwargs["timeout"] = datetime.timedelta(seconds=settings.timeout_sec)
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=settings.find_unused_params)]
    if info.world_size > 1:  # with one process a backend would make accelerate ask for a group
        handlers.append(InitProcessGroupKwargs(**group_kwargs))
    release_accelerator()  # a previous run's singletons must not leak into this one
    _export_launcher_environment(info, backend.uses_deepspeed)
    accelerator = Accelerator(
        **backend.accelerator_kwargs(settings, cpu=cpu),
        kwargs_handlers=handlers,
        # One LR-schedule step per optimizer step (accelerate's default steps it once per
        # process, so warmup_steps would count world_size times too fast).
        step_scheduler_with_optimizer=False,
        # The run object places the model and moves each batch itself (the
        # ``dataload_wait``/``h2d`` regions), so accelerate must not do it inside ``next``.
        device_placement=False,
    )
    if backend.uses_deepspeed and cpu:
        _mark_deepspeed_ranges()
    if accelerator.num_processes != info.world_size:
        raise RuntimeError(
            f"accelerate sees {accelerator.num_processes} process(es) but the group has {info.world_size} "
            f"({info.source}); its distributed type is {accelerator.distributed_type}"
        )
    return accelerator


#: The last names of DeepSpeed's instrumented functions that wrap the user's own code: the
#: engine's ``forward`` (the model's) and ``backward`` (the autograd pass, every hook in it), ZeRO-3's
#: optimizer ``step`` (the torch optimizer's, around its own instrumented bookkeeping). Their
#: ranges would count that code as DeepSpeed's.
_DEEPSPEED_WRAPPERS = frozenset(("forward", "backward", "step"))


class _DeepSpeedRanges:
    """DeepSpeed's marks on CPU as ``torch.profiler`` ranges: the ZeRO functions it instruments
    (``instrument_w_nvtx``: its hooks' ``fetch_sub_module``, ``reduce_partition_and_remove_grads``...)
    call its accelerator's ``range_push`` / ``range_pop``, NVTX on CUDA and nothing on CPU.
    While a torch profiler runs, each opens ``record_function("DeepSpeed::<qualname>")``
    (:data:`scopebench.profiler.torch_ranges.DEEPSPEED_RANGE`), which the ledger counts as the
    framework's hooks; otherwise a push costs a check. Per thread, as the marks nest."""

    def __init__(self) -> None:
        import threading

        import torch.autograd.profiler
        from torch.profiler import record_function

        from scopebench.profiler.torch_ranges import DEEPSPEED_RANGE

        self._local = threading.local()
        self._profiler, self._range, self._prefix = torch.autograd.profiler, record_function, DEEPSPEED_RANGE

    def push(self, msg: str, domain: Any = None, category: Any = None) -> None:
        stack = self._local.__dict__.setdefault("stack", [])
        mark = None
        if self._profiler._is_profiler_enabled and msg.rpartition(".")[2] not in _DEEPSPEED_WRAPPERS:
            mark = self._range(self._prefix + msg)
            mark.__enter__()
        stack.append(mark)

    def pop(self, domain: Any = None) -> None:
        stack = self._local.__dict__.get("stack")
        mark = stack.pop() if stack else None
        if mark is not None:
            mark.__exit__(None, None, None)


def _mark_deepspeed_ranges() -> None:
    """Route DeepSpeed's CPU accelerator's marks to :class:`_DeepSpeedRanges` (undone by
    :func:`release_accelerator`)."""
    from deepspeed.accelerator import get_accelerator

    marks = _DeepSpeedRanges()
    ds = get_accelerator()
    ds.range_push, ds.range_pop = marks.push, marks.pop


def release_accelerator(accelerator: Any = None) -> None:
    """Forget accelerate's and DeepSpeed's process-wide state (ZeRO-3's linear and counters
    included) and restore the launcher variables (the group itself belongs to DistSession).

    With the run's ``accelerator``, also destroy its DeepSpeed engine (``free_memory``): the
    engine's gradient hooks live on autograd nodes, so the cycle they close through the model
    passes through C++ where the garbage collector cannot follow, and every ZeRO run's model
    and process groups (two gloo sockets each) outlived the run. The model stays readable.
    """
    from accelerate.state import AcceleratorState, GradientState

    global _SAVED_ENV
    if accelerator is not None:
        accelerator.free_memory()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    # DeepSpeed caches the process groups it made (its clone of the world group...) in
    # module globals; the next run's group is a new one, so the cached ones must go.
    groups = sys.modules.get("deepspeed.utils.groups")
    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:
        release(group=None)
    # accelerate's ZeRO-3 plugin also tells transformers (a weak reference that lives as long as
    # the plugin): models a later run builds must not be partitioned at construction.
    hf_deepspeed = sys.modules.get("transformers.integrations.deepspeed")
    unset = getattr(hf_deepspeed, "unset_hf_deepspeed_config", None)
    if unset is not None:
        unset()
    # ZeRO-3 replaces torch.nn.functional.linear with its memory-efficient version for the rest
    # of the process ("This will persist unless manually reset"): a later run (benchopt's next
    # solver, estimate-memory's fake forward) would save other activations through it.
    partition = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    original = getattr(getattr(partition, "InsertPostInitMethodToModuleSubClasses", None), "linear_bk", None)
    if original is not None:
        import torch.nn.functional as F

        if F.linear is getattr(partition, "zero3_linear_wrap", None):
            F.linear = original
    # ZeRO-3 numbers parameters and modules with process-wide counters (Init.param_id, and a
    # mutable default of DeepSpeedZeRoOffload._register_deepspeed_module) and checks the numbers
    # agree across ranks: in a second run of this process, rank 0 counted on from the first
    # while freshly spawned ranks counted from 0 ("disagreement on list contents").
    init = getattr(partition, "Init", None)
    if init is not None:
        init.param_id = 0
    # The marks of _mark_deepspeed_ranges live on DeepSpeed's accelerator object, process-wide.
    ds_accelerator = getattr(sys.modules.get("deepspeed.accelerator.real_accelerator"), "ds_accelerator", None)
    for name in ("range_push", "range_pop"):
        if name in getattr(ds_accelerator, "__dict__", {}):
            delattr(ds_accelerator, name)
    offload = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
    # Each ZeRO-3 engine pushes its whole model on this module-global stack and never pops it: the
    # model (its parameters hold the run's process group, whose gloo sockets stay open) outlived
    # every run for the rest of the process, one more model per ZeRO-3 run.
    stack = getattr(offload, "FWD_MODULE_STACK", None)
    if isinstance(stack, list):
        stack.clear()
    # ZeRO-3's parameter coordinator memoises __params_to_release with a class-level lru_cache whose
    # keys hold the coordinator itself (and the submodule): every ZeRO-3 run's model stayed reachable.
    coordinators = sys.modules.get("deepspeed.runtime.zero.partitioned_param_coordinator")
    coordinator = getattr(coordinators, "PartitionedParameterCoordinator", None)
    memo = _lru_cache_of(getattr(coordinator, "_PartitionedParameterCoordinator__params_to_release", None))
    if memo is not None:
        memo.cache_clear()
    register = getattr(getattr(offload, "DeepSpeedZeRoOffload", None), "_register_deepspeed_module", None)
    defaults = getattr(register, "__defaults__", None)
    if defaults and isinstance(defaults[0], list) and defaults[0]:
        defaults[0][0] = 0
    _release_dtensor_caches()
    saved, _SAVED_ENV = _SAVED_ENV, None
    for key, value in (saved or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _lru_cache_of(function: Any) -> Any:
    """The ``functools.lru_cache`` wrapper inside ``function`` (itself, behind ``__wrapped__``,
    or in the closure of a decorator that does not set it, as DeepSpeed's ``instrument_w_nvtx``),
    else None.

    :Examples:
        >>> import functools
        >>> def instrument(function):  # a decorator without functools.wraps
        ...     def wrapped(*args):
        ...         return function(*args)
        ...     return wrapped
        >>> cached = functools.lru_cache(maxsize=None)(abs)
        >>> _lru_cache_of(instrument(cached)) is cached, _lru_cache_of(len)
        (True, None)
    """
    todo, seen = [function], set()
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if callable(getattr(current, "cache_clear", None)):
            return current
        todo.append(getattr(current, "__wrapped__", None))
        for cell in getattr(current, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
    return None


def _release_dtensor_caches() -> None:
    """Empty the process-wide caches DTensor (FSDP2, HSDP) keys by the run's device mesh.

    The redistribute planners (a dict keyed by a weak reference to the mesh, whose planners
    hold it strongly), the transforms per tensor spec, the sharding rules of each op (in Python
    and in C++) and the mesh topology (keyed by the mesh, which compares equal to a later run's
    mesh of the same shape: that run was handed the first one's) each kept the run's mesh, and
    through it its process groups and their gloo sockets, for the rest of the process.
    """
    if "torch.distributed.tensor._api" not in sys.modules:  # no DTensor was made
        return
    from torch.distributed.tensor import _collective_utils, _redistribute
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _redistribute.clear_redistribute_planner_cache()
    for cached in (_redistribute._gen_transform_infos, _collective_utils.MeshTopoInfo.build_from_mesh):
        memo = _lru_cache_of(cached)
        if memo is not None:
            memo.cache_clear()
    _clear_sharding_prop_cache()
