"""Calling a :class:`~scopebench.policy.user.UserPolicy`'s code: the suite's side of the interface.

Every call the suite makes into a policy goes through here, so an exception of the policy's
code is refused in one line naming the policy, the phase and the exception, chained for its
traceback (:func:`attributed`, :func:`policy_sample`, :func:`policy_loss`; the phases are listed
in :mod:`scopebench.policy.user`), and passes as it is when it is not the policy's (out of memory,
a peer rank's failure). Beside those: a model training cannot change (:func:`check_trainable`),
batches moved to the device (:func:`to_device`, :func:`prepare_batch`), the fixed validation
batch and its loss (:func:`fixed_batch`, :func:`validation_loss`), the FLOPs of one sample
(:func:`measure_flops_per_sample`) and the training ``DataLoader`` (:func:`make_policy_loader`).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scopebench.policy.user import PolicyDataError, PolicyError, UserPolicy

__all__ = [
    "attributed",
    "check_trainable",
    "fixed_batch",
    "make_policy_loader",
    "measure_flops_per_sample",
    "policy_loss",
    "policy_sample",
    "prepare_batch",
    "to_device",
    "validation_loss",
]


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

    from scopebench.policy.data.dataset import eval_indices

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
    resumes (:class:`~scopebench.policy.data.dataset.WeightedMixtureSampler` over one dataset), the
    policy's ``collate_fn``, workers kept between epochs, prefetch, pinned memory on CUDA; a last
    incomplete batch is dropped. accelerate's ``prepare`` then hands each rank its share. A
    sample's exception is refused naming the policy and the index (:func:`policy_sample`)."""
    from torch.utils.data import DataLoader, default_collate

    from scopebench.policy.data.dataset import WeightedMixtureSampler

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
