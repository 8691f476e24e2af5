"""Policies with a known delay inside backward, for the ledger's tests (``--policy path:factory``).

``stalled``: rank ``rank``'s backward busy-waits ``delay_ms`` before any gradient reaches the
framework's reduction (the first node of the backward graph), every step: the late rank the
ledger must name. ``hooked``: every rank runs ``hooks`` per-parameter gradient hooks that each
busy-wait ``hook_ms``: host overhead the ledger must count as work, not communication.
``work_ms``: every rank's forward also busy-waits this long, a step long enough that a busy
machine's scheduling noise (a few ms) stays a small share of it.
A busy-wait, not a sleep: the rank's thread is working, as a slow rank's is.
"""

import time
from pathlib import Path

import torch

from scopebench.policy import UserPolicy


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _Stall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds, out):
        ctx.seconds, ctx.out = seconds, out
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        begin = time.perf_counter()
        _spin(ctx.seconds)
        if ctx.out is not None:
            ctx.out.write(f"{time.perf_counter() - begin}\n")
        return grad, None, None


class _Tick(torch.autograd.Function):
    """Counts backward passes (its backward runs first: it is applied to the output)."""

    @staticmethod
    def forward(ctx, x, counter):
        ctx.counter = counter
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.counter[0] += 1
        return grad, None


class _Model(torch.nn.Module):
    def __init__(self, width, layers, seconds, work=0.0, out=None):
        super().__init__()
        self.out = out
        self.work = work
        # a Sequential (a module with a forward): FSDP2 shards it as a unit
        self.layers = torch.nn.Sequential(
            *(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(layers))
        )
        self.seconds = seconds
        #: Backward passes so far (``hooked``'s alternation).
        self.backwards = [0]

    def forward(self, x):
        _spin(self.work)
        x = self.layers(x)
        x = _Tick.apply(x, self.backwards)
        return _Stall.apply(x, self.seconds, self.out) if self.seconds > 0 else x


def _rank():
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _policy(model, width, size=64):
    data = torch.utils.data.TensorDataset(torch.randn(size, width))
    return UserPolicy(
        model=model,
        loss=lambda m, batch: m(batch[0]).pow(2).mean(),
        dataset=data,
        sample=lambda m, observation, num_steps: m(observation),
        observation=lambda batch_size: torch.randn(batch_size, width),
    )


def stalled(
    rank: int = 1, delay_ms: float = 200.0, width: int = 32, layers: int = 4, work_ms: float = 0.0, log: str = ""
) -> UserPolicy:
    """Rank ``rank``'s backward stalls ``delay_ms`` (every step) before its gradients exist.
    ``log``: a folder where the stalled rank appends each stall's real duration to
    ``rank<r>.txt`` (a busy-wait that loses the CPU on a loaded machine ends late)."""
    seconds = delay_ms / 1e3 if _rank() == rank else 0.0
    out = open(Path(log) / f"rank{_rank()}.txt", "a", buffering=1) if log and seconds else None  # noqa: SIM115
    return _policy(_Model(width, layers, seconds, work_ms / 1e3, out), width)


def hooked(
    hooks: int = 20,
    hook_ms: float = 1.0,
    width: int = 32,
    work_ms: float = 0.0,
    alternate: bool = False,
    log: str = "",
) -> UserPolicy:
    """``hooks`` parameters each with a gradient hook that busy-waits ``hook_ms``, on every rank;
    ``alternate``: only in odd-numbered backward passes (the 1st, 3rd...), so that one run holds
    steps with and without, side by side under the same load. ``log``: a folder where each rank
    appends, per hook call, ``<backward pass> <seconds the hook took>`` to ``rank<r>.txt``: on a
    busy machine a 1 ms busy-wait that loses the CPU ends when it gets it back, so the hooks' real
    time is this, not ``hooks x hook_ms``."""
    model = _Model(width, hooks // 2, 0.0, work_ms / 1e3)
    params = [p for p in model.parameters()][:hooks]
    out = open(Path(log) / f"rank{_rank()}.txt", "a", buffering=1) if log else None  # noqa: SIM115

    def hook(grad):
        begin = time.perf_counter()
        if not alternate or model.backwards[0] % 2 == 1:
            _spin(hook_ms / 1e3)
        if out is not None:
            out.write(f"{model.backwards[0]} {time.perf_counter() - begin}\n")
        return grad

    for p in params:
        p.register_hook(hook)
    return _policy(model, width)
