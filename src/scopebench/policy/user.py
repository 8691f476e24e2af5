"""Any PyTorch model as a policy: the small interface every policy tool and solver drives.

A policy is a **factory** named by ``module:function`` (or ``path/to/file.py:function``)
that returns a :class:`UserPolicy`; ``pi05`` names the suite's own pi05 re-implementation
(:func:`scopebench.policy.pi05.policy.make_pi05_policy`), the default. The suite calls the factory
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
``sample``, ``postprocess`` and ``reset``, through :func:`~scopebench.policy.calls.attributed`,
which also refuses a stateful ``sample`` that does not return ``(output, new_state)``). The
exception is chained (``__cause__``) for its traceback; the commands print the one line alone.
Those calls are made in :mod:`scopebench.policy.calls`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
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
    "build_policy",
    "check_policy_name",
    "resolve_factory",
]

#: Policy names that need no ``module:function``: the suite's own policies.
BUILTIN_POLICIES = {"pi05": "scopebench.policy.pi05:make_pi05_policy"}


class PolicyError(ValueError):
    """A policy factory or what it returned cannot run; the message's first line names the factory."""


class PolicyDataError(PolicyError):
    """The policy's dataset raised (:func:`~scopebench.policy.calls.policy_sample`), in one line
    naming the policy and the index.

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
    """Whether a call of ``loss`` was seen calling ``model(...)``
    (:func:`~scopebench.policy.calls.policy_loss` checks the first calls, then no more)."""

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
