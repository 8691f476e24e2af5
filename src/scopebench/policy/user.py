"""Any PyTorch model as a policy: the small interface every policy tool and solver drives.

A policy is a **factory** named by ``module:function`` (or ``path/to/file.py:function``)
that returns a :class:`UserPolicy`; ``pi05`` names the suite's own pi05 re-implementation
(:func:`scopebench.policy.pi05.make_pi05_policy`), the default. The suite calls the factory
once per rank, after seeding torch with the run's ``seed`` (so every rank starts from the
same weights), with the run's ``policy_args`` as keyword arguments::

    scopebench profile-step --config configs/policy/tiny.yml --policy mypkg.policies:make_policy \\
        --policy-arg hidden=64

    def make_policy(hidden: int = 32) -> UserPolicy:
        model = MyNet(hidden)
        return UserPolicy(model=model, loss=lambda m, batch: F.mse_loss(m(batch[0]), batch[1]),
                          dataset=MyDataset())

The suite owns everything around the model: the ``DataLoader`` over ``dataset`` (seeded
sampler, the ranks' shares, workers, pinning, prefetch: the settings it measures), the copy
of each batch to the device (``dataload_wait``), the backend (DDP, DeepSpeed ZeRO-2/3,
FSDP2), AdamW, clipping, the phases, FLOPs and MFU. A batch may be a tensor, or dicts,
lists and tuples of tensors (other leaves, such as strings, stay as they are).

Errors a factory can make are refused in one line naming it (:class:`PolicyError`, a
``ValueError``): the module or function not found, the factory raising (its traceback below
that line), a return value that is not a :class:`UserPolicy`, a dataset of length 0, a model
without a trainable parameter (training), and (at the first step, or before training when
FLOPs are counted) a loss that is not a scalar tensor with a gradient or a logged term that
is not a number. So is an exception raised by the policy's code while it runs, naming the
policy, the phase and the exception: ``policy mypkg:make: forward raised RuntimeError: shape
mismatch ...`` (phases ``forward``: the model's forward, called by the loss; ``loss``: the
rest of ``loss(model, batch)``; ``dataset[i]``: the dataset's ``__getitem__``, also in a
DataLoader worker; and in the inference tools ``observation``, ``preprocess``, ``prefill``,
``sample``, ``postprocess`` and ``reset``, through :func:`attributed`, which also refuses a
stateful ``sample`` that does not return ``(output, new_state)``). The exception is chained
(``__cause__``) for its traceback; the commands print the one line alone.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import numbers
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "BUILTIN_POLICIES",
    "PolicyDataError",
    "PolicyError",
    "UserPolicy",
    "attributed",
    "build_policy",
    "check_trainable",
    "check_policy_name",
    "fixed_batch",
    "make_policy_loader",
    "measure_flops_per_sample",
    "policy_loss",
    "policy_sample",
    "prepare_batch",
    "resolve_factory",
    "to_device",
    "validation_loss",
]

#: Policy names that need no ``module:function``: the suite's own policies.
BUILTIN_POLICIES = {"pi05": "scopebench.policy.pi05:make_pi05_policy"}


class PolicyError(ValueError):
    """A policy factory or what it returned cannot run; the message's first line names the factory."""


class PolicyDataError(PolicyError):
    """The policy's dataset raised (:func:`policy_sample`), in one line naming the policy and the index.

    Raised in a DataLoader worker, torch re-raises it in the training process as
    ``PolicyDataError("Caught PolicyDataError in DataLoader worker process 0.\\nOriginal
    Traceback ...")``; the one line is then taken back from the traceback's last line, and
    the worker's traceback kept in :attr:`worker_traceback`.
    """

    def __init__(self, message: str) -> None:
        self.worker_traceback = None
        head, _, rest = message.partition("\n")
        if head.startswith(f"Caught {type(self).__name__} ") and rest.startswith("Original Traceback"):
            self.worker_traceback = rest
            message = rest.rstrip().rpartition("\n")[2].partition(f"{type(self).__name__}: ")[2] or head
        super().__init__(message)


@dataclass(kw_only=True, eq=False)
class UserPolicy:
    """What a policy factory returns: a model, its loss, its data, and optionally how to sample.

    Only ``model``, ``loss`` and ``dataset`` are required (``profile-step``,
    ``find-unused-params``, ``profile-dataloader``, ``train``, ``Pi05Train``); ``bench-inference``
    and ``decompose-latency`` also need ``sample`` and ``observation``.
    """

    model: nn.Module
    """The module to train. The suite moves it to the device and wraps it (DDP, DeepSpeed, FSDP2)."""
    loss: Callable[[nn.Module, Any], Any]
    """``loss(model, batch)``: a scalar tensor, or ``(scalar, {name: float or 0-d tensor})`` for the
    logged terms (the same names at every step; they become columns). It must call ``model(...)``
    (the wrapped model's forward: DDP and DeepSpeed hook the gradients there)."""
    dataset: Any
    """A map-style ``torch.utils.data.Dataset`` (``__len__`` and ``__getitem__``) of samples."""
    collate_fn: Callable[[list], Any] | None = None
    """Samples -> batch (None: torch's ``default_collate``)."""
    preprocess: Callable[[Any, torch.device], Any] | None = None
    """``preprocess(batch, device)``: a host batch -> model inputs on ``device``, timed in
    ``dataload_wait`` (training) and ``preprocess`` (inference). None: every tensor is moved."""
    sample: Callable[[nn.Module, Any, int], Any] | None = None
    """``sample(model, observation, num_steps)``: one inference call (``num_steps``: denoising
    steps, generated tokens...), timed as ``denoise``; with ``prefill``, it receives what
    ``prefill`` returned instead of the observation."""
    observation: Callable[[int], Any] | None = None
    """``observation(batch_size)``: a host observation for ``sample`` (inference tools)."""
    prefill: Callable[[nn.Module, Any], Any] | None = None
    """``prefill(model, observation)``: the once-per-call part of inference (a KV cache), timed
    as ``prefill``; None: no such phase."""
    postprocess: Callable[[Any], Any] | None = None
    """``postprocess(output)``: the output of ``sample`` -> the result on the host, timed as
    ``postprocess``. None: every tensor is moved to the CPU."""
    flops_per_sample: float | None = None
    """Forward + backward FLOPs of one training sample, for MFU; None: counted once on one sample
    with torch's ``FlopCounterMode`` before training."""
    reset: Callable[[nn.Module], Any] | None = None
    """``reset(model)``: the start of an episode; returns the policy's initial state (anything:
    a recurrent hidden state, a history of past observations, fast weights). With it the policy
    is **stateful**: ``sample(model, inputs, num_steps, state)`` takes the state as a fourth
    argument and returns ``(output, new_state)``, which the suite hands to the next call of the
    episode. The inference tools call it before an episode's first call (``bench-inference
    --episode-length``: every that many calls), untimed and reported apart. None: stateless."""
    shard_modules: Sequence[nn.Module] | None = None
    """Submodules of ``model`` that FSDP2 shards as one unit each (then the root); None: each
    child of ``model`` that holds parameters (a child sharing a parameter with another stays in
    the root). An accelerate file's ``fsdp_transformer_layer_cls_to_wrap`` wins over both."""
    factory: str = dataclasses.field(default="", init=False, repr=False)
    """The factory that built it (set by :func:`build_policy`), named by every error of its code."""
    forward_checked: bool = dataclasses.field(default=False, init=False, repr=False)
    """Whether a call of ``loss`` was seen calling ``model(...)`` (:func:`policy_loss` checks the
    first calls, then no more)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise PolicyError(f"UserPolicy.model must be a torch.nn.Module, got {type(self.model).__name__}")
        for name in ("loss", "collate_fn", "preprocess", "sample", "observation", "prefill", "postprocess", "reset"):
            value = getattr(self, name)
            if (value is not None or name == "loss") and not callable(value):
                raise PolicyError(f"UserPolicy.{name} must be callable, got {type(value).__name__}")
        if not (hasattr(self.dataset, "__getitem__") and hasattr(self.dataset, "__len__")):
            raise PolicyError(
                f"UserPolicy.dataset must be a map-style Dataset (__len__ and __getitem__), "
                f"got {type(self.dataset).__name__}"
            )
        if len(self.dataset) == 0:
            raise PolicyError("UserPolicy.dataset has length 0: a policy needs at least one sample")
        flops = self.flops_per_sample
        if flops is not None and (isinstance(flops, bool) or not isinstance(flops, (int, float)) or flops <= 0):
            raise PolicyError(f"UserPolicy.flops_per_sample must be a number > 0 or None, got {flops!r}")
        if self.shard_modules is not None:
            inside = {id(m) for m in self.model.modules()}
            if any(not isinstance(m, nn.Module) or id(m) not in inside for m in self.shard_modules):
                raise PolicyError("UserPolicy.shard_modules must list submodules of UserPolicy.model")

    @property
    def stateful(self) -> bool:
        """Whether ``sample`` carries a state from one call to the next (``reset`` is given)."""
        return self.reset is not None

    def require(self, *names: str, tool: str) -> None:
        """Refuse a tool that needs attributes this policy does not have, naming the first one missing."""
        for name in names:
            if getattr(self, name) is None:
                raise PolicyError(f"{tool} needs UserPolicy.{name}, which this policy does not define")


# -- naming and building --------------------------------------------------------------------


def check_policy_name(key: str, value: Any) -> str:
    """A policy name's form: a built-in name or ``module:function`` (nothing is imported).

    :Examples:

    >>> check_policy_name("policy", "mypkg.policies:make_policy")
    'mypkg.policies:make_policy'
    >>> check_policy_name("policy", "mypkg")
    Traceback (most recent call last):
    ...
    ValueError: policy must be pi05 or a factory module:function (or path/to/file.py:function), got 'mypkg'
    """
    if isinstance(value, str) and (value in BUILTIN_POLICIES or _split(value) is not None):
        return value
    builtin = ", ".join(BUILTIN_POLICIES)
    raise ValueError(
        f"{key} must be {builtin} or a factory module:function (or path/to/file.py:function), got {value!r}"
    )


def _split(name: str) -> tuple[str, str] | None:
    module, sep, function = name.rpartition(":")
    if not sep or not module or not function.isidentifier():
        return None
    return module, function


def _load_module(name: str, module: str):
    if module.endswith(".py") or "/" in module:
        path = Path(module).expanduser().resolve()
        if not path.is_file():
            raise PolicyError(f"policy {name}: no file {path}")
        key = f"scopebench_user_policy_{abs(hash(str(path)))}"
        if key in sys.modules:
            return sys.modules[key]
        spec = importlib.util.spec_from_file_location(key, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod  # DataLoader workers and pickles find it
        try:
            spec.loader.exec_module(mod)
        except Exception as err:
            del sys.modules[key]
            raise _raised(f"policy {name}: importing {path} raised", err) from None
        return mod
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and (module == err.name or module.startswith(err.name + ".")):
            raise PolicyError(f"policy {name}: no module named {err.name!r} (is it on PYTHONPATH?)") from None
        raise _raised(f"policy {name}: importing {module} raised", err) from None
    except Exception as err:
        raise _raised(f"policy {name}: importing {module} raised", err) from None


def _raised(line: str, err: BaseException) -> PolicyError:
    """One line, then the traceback of ``err``."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip()
    return PolicyError(f"{line} {type(err).__name__}: {err}\n{text}")


def resolve_factory(name: str) -> Callable[..., Any]:
    """The factory function ``name`` names (imports its module).

    Raises:
        PolicyError: the module (or file) or the function does not exist, or is not callable.
    """
    check_policy_name("policy", name)
    module, function = _split(BUILTIN_POLICIES.get(name, name))
    mod = _load_module(name, module)
    factory = getattr(mod, function, None)
    if factory is None:
        found = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_"))
        raise PolicyError(f"policy {name}: module {module} has no function {function!r} (it has {found})")
    if not callable(factory):
        raise PolicyError(f"policy {name}: {module}.{function} is a {type(factory).__name__}, not a function")
    return factory


def build_policy(name: str, args: Mapping[str, Any] | None = None, *, seed: int | None = None) -> UserPolicy:
    """Call the factory ``name`` with ``args`` (after ``torch.manual_seed(seed)``); its :class:`UserPolicy`.

    Raises:
        PolicyError: in one line naming the factory: not found, raised (traceback below), or
            returned something other than a :class:`UserPolicy` (or an invalid one).
    """
    factory = resolve_factory(name)
    if seed is not None:
        torch.manual_seed(seed)
    try:
        policy = factory(**dict(args or {}))
    except PolicyError as err:  # UserPolicy's own checks: already one line
        raise PolicyError(f"policy {name}: {err}") from None
    except Exception as err:
        raise _raised(f"policy factory {name} raised", err) from None
    if not isinstance(policy, UserPolicy):
        raise PolicyError(f"policy factory {name} returned {type(policy).__name__}, not a scopebench.policy.UserPolicy")
    policy.factory = name
    return policy


def check_trainable(policy: UserPolicy, name: str = "") -> None:
    """Refuse a model that training cannot change: no parameter, or every one frozen
    (torch's optimizer said "optimizer got an empty parameter list").

    Raises:
        PolicyError: in one line naming the policy.
    """
    params = list(policy.model.parameters())
    if any(p.requires_grad for p in params):
        return
    what = "no parameter" if not params else f"{len(params)} parameter tensor(s), all frozen (requires_grad=False)"
    raise PolicyError(
        f"{_who(policy, name)}model {type(policy.model).__name__} has {what}: training needs at least one "
        "trainable parameter"
    )


# -- errors of the policy's own code ---------------------------------------------------------


def _who(policy: UserPolicy, name: str = "") -> str:
    # a stand-in with the dataset alone (tests, scripts) has no factory to name
    name = name or getattr(policy, "factory", "")
    return f"policy {name}: " if name else ""


def _one_line(who: str, phase: str, err: BaseException, kind: type[PolicyError] = PolicyError) -> PolicyError:
    """``policy <name>: <phase> raised <Type>: <first line of its message>`` (one line)."""
    text = str(err).strip()
    first = text.partition("\n")[0] + (" ..." if "\n" in text else "")
    return kind(f"{who}{phase} raised {type(err).__name__}" + (f": {first}" if first else ""))


def _passes(err: BaseException) -> bool:
    """Whether an exception of the policy's code passes as it is: already one line (ours), out
    of memory (``find-max-batch`` catches it), or a peer rank's failure (the launcher names it):
    a ``DistError``, or an error raised inside ``torch.distributed`` itself (gloo raises its
    timeouts as a plain ``RuntimeError`` from the collective's ``wait``, for example inside
    FSDP2's all-gather before the forward)."""
    import torch.distributed as dist

    not_the_policy = (PolicyError, torch.OutOfMemoryError, MemoryError, getattr(dist, "DistError", PolicyError))
    return isinstance(err, not_the_policy) or _raised_in_collective(err)


def _raised_in_collective(err: BaseException) -> bool:
    """Whether ``err`` was raised by a frame of ``torch/distributed/distributed_c10d.py``, or by
    the ledger's wrapper of a collective or ``Work.wait`` called from one."""
    tb, files = err.__traceback__, []
    while tb is not None:
        files.append(Path(tb.tb_frame.f_code.co_filename).parts[-3:])
        tb = tb.tb_next
    while files and files[-1] == ("scopebench", "profiler", "collectives.py"):
        files.pop()
    return bool(files) and files[-1] == ("torch", "distributed", "distributed_c10d.py")


def _loss_phase(err: BaseException, model: nn.Module) -> str:
    """``forward`` when ``err`` went through ``model``'s ``__call__`` (the loss called the model,
    wrapped or not, and its forward raised), else ``loss``."""
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in ("_call_impl", "_wrapped_call_impl") and frame.f_locals.get("self") is model:
            return "forward"
        tb = tb.tb_next
    return "loss"


def _bypass(who: str, what: str) -> str:
    """The line for a loss that does not go through ``model(...)`` (docs/policies.md's contract)."""
    return (
        f"{who}loss(model, batch) {what}: it must call model(...), the model it is given, whose forward calls "
        "the rest (a submodule or method such as model.lm(...) bypasses the wrapper's forward, where DDP, "
        "DeepSpeed and FSDP2 do their work, and a wrapper has no such attribute)"
    )


def _wrapper_lacks(err: BaseException, policy: UserPolicy, model: nn.Module) -> str | None:
    """The attribute the loss asked of a wrapper (DDP, DeepSpeed's engine) that the policy's own
    model has (``model.lm``: ``AttributeError: 'DistributedDataParallel' object has no attribute
    'lm'``), else None."""
    if not isinstance(err, AttributeError) or model is policy.model:
        return None
    found = re.search(r"object has no attribute '(\w+)'", str(err))
    if found is None or not hasattr(policy.model, found.group(1)) or hasattr(model, found.group(1)):
        return None
    return found.group(1)


def attributed(policy: UserPolicy, phase: str, fn: Callable[..., Any], *, pair: bool = False) -> Callable[..., Any]:
    """``fn`` (the policy's ``phase``, or a compiled wrapper of it) whose exception is refused in one
    line naming the policy and the phase, as training's are (``policy mypkg:make: sample raised
    RuntimeError: ...``, chained); with ``pair``, a result other than ``(output, new_state)`` too.

    :Examples:

    >>> step = attributed(UserPolicy(model=nn.Linear(1, 1), loss=len, dataset=[0]), "sample",
    ...                   lambda x: torch.zeros(2, 3), pair=True)
    >>> step(0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    scopebench.policy.user.PolicyError: sample returned a Tensor of shape (2, 3); a stateful policy ...
    """
    who = _who(policy)

    def call(*args: Any) -> Any:
        try:
            out = fn(*args)
        except Exception as err:
            if _passes(err):
                raise
            raise _one_line(who, phase, err) from err
        if pair and not (isinstance(out, (tuple, list)) and len(out) == 2):
            got = f"a Tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            got += f" of {len(out)} items" if isinstance(out, (tuple, list)) else ""
            raise PolicyError(
                f"{who}{phase} returned {got}; a stateful policy (UserPolicy.reset) returns a pair (output, new_state)"
            )
        return out

    return call


def policy_sample(policy: UserPolicy, index: int, name: str = "") -> Any:
    """``policy.dataset[index]``; an exception it raises becomes one line naming the policy and
    the index (:class:`PolicyDataError`, the exception chained)."""
    return _sample(policy.dataset, index, _who(policy, name))


def _sample(dataset: Any, index: int, who: str) -> Any:
    try:
        return dataset[index]
    except Exception as err:
        if _passes(err):
            raise
        raise _one_line(who, f"dataset[{index}]", err, PolicyDataError) from err


class _AttributedDataset(torch.utils.data.Dataset):
    """The policy's dataset as its DataLoader sees it: each sample through :func:`policy_sample`
    (it holds the dataset and the policy's name only: workers started by ``spawn`` pickle it)."""

    def __init__(self, dataset: Any, who: str) -> None:
        self.dataset, self.who = dataset, who

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return _sample(self.dataset, index, self.who)


# -- running it ---------------------------------------------------------------------------


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Every tensor of ``batch`` (a tensor, or dicts / lists / tuples of them) on ``device``.

    :Examples:

    >>> out = to_device({"x": torch.zeros(2), "pair": (torch.ones(1), "text")}, torch.device("cpu"))
    >>> out["pair"][1], out["x"].device.type
    ('text', 'cpu')
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device, non_blocking) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch


def policy_loss(policy: UserPolicy, model: nn.Module, batch: Any, name: str = "") -> tuple[torch.Tensor, dict]:
    """``policy.loss(model, batch)`` as ``(loss, terms)``, refused unless the loss is a scalar
    tensor with a gradient and every term a number or a 0-d tensor (the checks read attributes
    only: no device sync). An exception of the loss or the model's forward is refused in one
    line naming the policy, the phase and the exception (chained).

    The contract that ``loss`` calls ``model(...)`` (the wrapper's forward, where DDP, DeepSpeed
    and FSDP2 work) is checked on one rank as on several: until a call is seen calling it, a
    forward pre-hook on ``policy.model`` watches each call, and a call that never reaches it
    (``model.lm(...)``) is refused naming the contract, as is the ``AttributeError`` of a
    wrapper that lacks the attribute."""
    seen: list[bool] = []
    hook = None
    if not getattr(policy, "forward_checked", True):  # until a call is seen calling model(...): a hook on its forward
        hook = policy.model.register_forward_pre_hook(lambda module, args: seen.append(True))
    try:
        out = policy.loss(model, batch)
    except Exception as err:
        if _passes(err):
            raise
        if (attr := _wrapper_lacks(err, policy, model)) is not None:
            raise PolicyError(_bypass(_who(policy, name), f"called model.{attr}(...)")) from err
        raise _one_line(_who(policy, name), _loss_phase(err, model), err) from err
    finally:
        if hook is not None:
            hook.remove()
    if hook is not None:
        if not seen:
            raise PolicyError(_bypass(_who(policy, name), "never called model(...)"))
        policy.forward_checked = True
    terms: Mapping = {}
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
        out, terms = out
    who = _who(policy, name)
    if not isinstance(out, torch.Tensor):
        raise PolicyError(
            f"{who}loss(model, batch) returned {type(out).__name__}; expected a scalar tensor or (scalar, {{name: float}})"
        )
    if out.ndim != 0:
        raise PolicyError(f"{who}loss(model, batch) returned a tensor of shape {tuple(out.shape)}; expected a scalar")
    if torch.is_grad_enabled() and not out.requires_grad:
        raise PolicyError(
            f"{who}loss(model, batch) returned a tensor without grad (requires_grad=False): it does not depend on "
            "the model's trainable parameters (detached, computed under no_grad, or every parameter frozen)"
        )
    bad = [k for k in terms if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise PolicyError(f"{who}loss term names must be identifiers (they become columns), got {bad}")
    for key, value in terms.items():
        scalar = isinstance(value, torch.Tensor) and value.ndim == 0
        if not scalar and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            from scopebench.validate import quote

            shown = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else quote(value)
            raise PolicyError(
                f"{who}loss term {key!r} is {shown} ({type(value).__name__}); expected a float or a 0-d tensor"
            )
    return out, dict(terms)


def fixed_batch(policy: UserPolicy, batch_size: int) -> Any:
    """``batch_size`` samples evenly spread over the policy's dataset, always the same ones, collated."""
    from torch.utils.data import default_collate

    from scopebench.policy.dataset import eval_indices

    samples = [policy_sample(policy, i) for i in eval_indices(len(policy.dataset), batch_size)]
    return (policy.collate_fn or default_collate)(samples)


def prepare_batch(policy: UserPolicy, batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """A host batch as model inputs on ``device``: the policy's ``preprocess``, else :func:`to_device`."""
    if policy.preprocess is not None:
        return policy.preprocess(batch, device)
    return to_device(batch, device, non_blocking)


def validation_loss(policy: UserPolicy, model: nn.Module, batch: Any, seed: int = 0) -> float:
    """The loss on ``batch`` in eval mode without gradients, with torch's RNG seeded by ``seed``
    (noise and times of a flow-matching loss are then the same at every call), which the
    caller's RNG does not see."""
    device = next(model.parameters()).device
    devices = [device] if device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            loss, _ = policy_loss(policy, model, prepare_batch(policy, batch, device))
    finally:
        model.train(was_training)
    return float(loss)


def measure_flops_per_sample(policy: UserPolicy, device: torch.device, name: str = "") -> int:
    """Forward + backward FLOPs of one sample (``FlopCounterMode`` on a batch of the dataset's first
    sample), which also checks the loss before training. The model's gradients, buffers (batch-norm
    statistics) and torch's RNG are left as they were."""
    from torch.utils.data import default_collate
    from torch.utils.flop_counter import FlopCounterMode

    model = policy.model
    batch = prepare_batch(policy, (policy.collate_fn or default_collate)([policy_sample(policy, 0, name)]), device)
    buffers = {key: b.detach().clone() for key, b in model.named_buffers()}
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        counter = FlopCounterMode(display=False)
        with counter:
            loss, _ = policy_loss(policy, model, batch, name)
            loss.backward()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for key, b in model.named_buffers():
            b.copy_(buffers[key])
    return int(counter.get_total_flops())


def make_policy_loader(
    policy: UserPolicy,
    batch_size: int,
    *,
    seed: int = 0,
    num_workers: int = 0,
    prefetch_factor: int = 2,
    drop_last: bool = True,
):
    """The training ``DataLoader`` of a policy's dataset: a seeded sampler whose position a checkpoint
    resumes (:class:`~scopebench.policy.dataset.WeightedMixtureSampler` over one dataset), the
    policy's ``collate_fn``, workers kept between epochs, prefetch, pinned memory on CUDA; a last
    incomplete batch is dropped. accelerate's ``prepare`` then hands each rank its share. A
    sample's exception is refused naming the policy and the index (:func:`policy_sample`)."""
    from torch.utils.data import DataLoader, default_collate

    from scopebench.policy.dataset import WeightedMixtureSampler

    return DataLoader(
        _AttributedDataset(policy.dataset, _who(policy)),
        batch_size=batch_size,
        sampler=WeightedMixtureSampler([len(policy.dataset)], seed=seed),
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        persistent_workers=num_workers > 0,
        pin_memory=torch.cuda.is_available(),
        collate_fn=policy.collate_fn or default_collate,
        drop_last=drop_last,
        # Worker seeds come from this generator, not from the global RNG, so starting an
        # epoch does not move the training step's noise (a resumed run stays exact).
        generator=torch.Generator().manual_seed(seed),
    )
