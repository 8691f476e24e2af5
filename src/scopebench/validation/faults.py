"""Faults with a known answer, injected through the suite's own :class:`~scopebench.policy.UserPolicy`.

The validation benchmark (``benchmark_validation/``, docs/validation.md) runs a small policy on
every backend and injects one fault whose ground truth is known, so that the suite's findings
can be scored against it. A fault is described by a :class:`FaultSpec` (the dataset ``injected``'s
parameters) and carried out by :func:`fault_policy`, a policy factory (``--policy
scopebench.validation.faults:fault_policy``) that every rank calls after seeding:

``none``
    nothing: every finding about the step on such a run is a false positive.
``late_rank``
    rank ``rank`` computes ``delay_ms`` in ``phase`` (``forward``, ``bwd``, ``optim_step``,
    ``dataload_wait``), one step in ``every``: the ledger's ``late-rank`` must name it there.
``slow_input``
    every rank's input (``preprocess``, timed in ``dataload_wait``) computes ``delay_ms``,
    one step in ``every``: ``input-bound``.
``contention``
    ``magnitude`` processes that each keep one CPU busy run beside the step
    (:class:`CpuHogs`, started by the run object): ``contended``.
``memory_growth``
    every rank's forward keeps ``magnitude`` MiB alive more, one step in ``every`` (a leak):
    ``memory-creep`` (with ``profiler_memory``).
``nonfinite``
    rank ``rank``'s loss is NaN at step ``step``: the run must stop there, naming it.
``comm_heavy``
    the model carries ``magnitude`` million parameters that cost no compute but whose gradients
    every step reduces: ``communication-bound``.

Every rank's forward and backward compute ``work_ms`` each, so a step lasts long enough that a
busy machine's scheduling noise (a few ms) stays a small share of it. Delays and work are
matrix products repeated until the time is up, not sleeps: a slow rank's thread is working, and
under the torch profiler its operators are compute, not host overhead. ``steps_per_iteration``: policy steps per benchmark iteration
(2 when each profiled step is paired with an unprofiled one, :class:`~scopebench.validation.run.DetectRun`):
"one step in ``every``" and ``step`` then count iterations, and both steps of an iteration get
the same fault.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from scopebench.policy import UserPolicy
from scopebench.validate import choice, integer, number

__all__ = ["FAULTS", "INJECTED_TERM", "PHASES", "RULES", "CpuHogs", "FaultSpec", "fault_policy"]

#: The faults of the dataset ``injected``.
FAULTS = ("none", "late_rank", "slow_input", "contention", "memory_growth", "nonfinite", "comm_heavy")
#: Where a ``late_rank`` delay goes (the policy training step's phases).
PHASES = ("forward", "bwd", "optim_step", "dataload_wait")
#: The finding each fault must produce: the diagnosis rule (docs/diagnosis.md), or ``nonfinite``
#: (the run stops at a non-finite loss, :mod:`scopebench.policy.run.nonfinite`); ``none``: nothing.
RULES = {
    "none": None,
    "late_rank": "late-rank",
    "slow_input": "input-bound",
    "contention": "contended",
    "memory_growth": "memory-creep",
    "nonfinite": "nonfinite",
    "comm_heavy": "communication-bound",
}
#: The loss term the policy logs every step: the seconds this rank spent injecting the fault
#: (its extra work as it really lasted), gathered from every rank like any loss term.
INJECTED_TERM = "fault_injected_sec"
#: A fault's ``magnitude`` when the dataset leaves it ``None``: hog processes, MiB kept per
#: step, million idle parameters.
DEFAULT_MAGNITUDE = {"contention": 2.0, "memory_growth": 4.0, "comm_heavy": 16.0}


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """One injected fault: the dataset ``injected``'s parameters, validated when built."""

    fault: str = "none"
    """One of :data:`FAULTS`."""
    rank: int = 1
    """The faulty rank (``late_rank``, ``nonfinite``)."""
    phase: str = "bwd"
    """Where a ``late_rank`` delay goes, one of :data:`PHASES`."""
    delay_ms: float = 100.0
    """The delay per faulty step (``late_rank``, ``slow_input``), ms."""
    every: int = 1
    """The fault hits one step in ``every`` (1: every step)."""
    magnitude: float | None = None
    """``contention``: processes that keep a CPU busy; ``memory_growth``: MiB kept alive per faulty
    step; ``comm_heavy``: million parameters reduced every step; ``None``: :data:`DEFAULT_MAGNITUDE`."""
    step: int = 3
    """``nonfinite``: the step (iteration, 1-based) whose loss is NaN."""
    work_ms: float = 40.0
    """Each rank's own work in forward and in backward, every step, ms."""

    def __post_init__(self) -> None:
        choice("fault", self.fault, FAULTS)
        integer("rank", self.rank, low=0)
        choice("phase", self.phase, PHASES)
        object.__setattr__(self, "delay_ms", number("delay_ms", self.delay_ms, low=0))
        integer("every", self.every, low=1)
        if self.magnitude is not None:
            object.__setattr__(self, "magnitude", number("magnitude", self.magnitude, low=0))
        integer("step", self.step, low=1)
        object.__setattr__(self, "work_ms", number("work_ms", self.work_ms, low=0))

    @property
    def rule(self) -> str | None:
        """The finding this fault must produce (:data:`RULES`)."""
        return RULES[self.fault]

    @property
    def size(self) -> float:
        """The fault's magnitude, its default when unset (0 for a fault without one)."""
        return self.magnitude if self.magnitude is not None else DEFAULT_MAGNITUDE.get(self.fault, 0.0)

    def policy_args(self, steps_per_iteration: int = 1) -> dict:
        """The keyword arguments of :func:`fault_policy` (a run's ``policy_args``)."""
        return {**dataclasses.asdict(self), "magnitude": self.size, "steps_per_iteration": steps_per_iteration}


_OPERANDS: dict[str, torch.Tensor] = {}


def _spin(seconds: float, device: torch.device | str = "cpu") -> None:
    """Compute for ``seconds`` on ``device``: matrix products (operators, as a slow rank's work is:
    under the torch profiler they count as compute, not host overhead; on CUDA, kernels) until
    the time is up."""
    key = str(device)
    if key not in _OPERANDS:
        _OPERANDS[key] = torch.full((160, 160), 1e-3, device=device)
    a = _OPERANDS[key]
    cuda = a.is_cuda
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(a, a)
        if cuda:  # the time is the device's work, not its queue
            torch.cuda.synchronize(a.device)


class _Fault:
    """When this rank injects: a counter per hook (each hook runs once per policy step)."""

    def __init__(self, spec: FaultSpec, rank: int, steps_per_iteration: int) -> None:
        self.spec, self.rank, self.per = spec, rank, steps_per_iteration
        self.calls: dict[str, int] = {}
        #: The step's :data:`INJECTED_TERM` (a 0-d tensor the loss returns, added to in place until
        #: the step's gather), and what was injected before the loss made it.
        self.term: torch.Tensor | None = None
        self.pending = 0.0

    def inject(self, seconds: float, before_loss: bool = False, device: torch.device | str = "cpu") -> None:
        """Compute ``seconds`` for the fault, counting what it really took (work that loses the
        CPU on a loaded machine ends late) in the step's term; ``before_loss``: the
        step's input, before the loss made the step's term."""
        begin = time.perf_counter()
        _spin(seconds, device)
        took = time.perf_counter() - begin
        if before_loss or self.term is None:
            self.pending += took
        else:
            self.term.add_(took)

    def new_term(self) -> torch.Tensor:
        """The :data:`INJECTED_TERM` of a new step (what was injected in its input first)."""
        self.term, self.pending = torch.tensor(self.pending, dtype=torch.float64), 0.0
        return self.term

    def due(self, hook: str) -> bool:
        """Whether this call of ``hook`` is in a faulty step (counted in iterations)."""
        n = self.calls.get(hook, 0)
        self.calls[hook] = n + 1
        return (n // self.per) % self.spec.every == 0

    def iteration(self, hook: str) -> int:
        """The 1-based iteration of this call of ``hook``."""
        n = self.calls.get(hook, 0)
        self.calls[hook] = n + 1
        return n // self.per + 1

    def delays(self, phase: str) -> bool:
        """Whether this rank's ``phase`` carries the injected delay."""
        spec = self.spec
        if spec.fault == "late_rank":
            return spec.phase == phase and spec.rank == self.rank
        return spec.fault == "slow_input" and phase == "dataload_wait"


class _Backward(torch.autograd.Function):
    """Runs ``work`` first in the backward pass (applied to the output: before any gradient
    reaches the framework's reduction)."""

    @staticmethod
    def forward(ctx, x, work):
        ctx.work = work
        return x.clone()  # not a view: FSDP2 warns of a module that returns one

    @staticmethod
    def backward(ctx, grad):
        ctx.work(grad.device)
        return grad, None


class FaultModel(torch.nn.Module):
    """A small MLP whose forward and backward do the fault's work around the real operators."""

    def __init__(self, fault: _Fault, width: int, layers: int, idle_params: int) -> None:
        super().__init__()
        self.fault = fault
        self.layers = torch.nn.Sequential(
            *(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(layers))
        )
        # comm_heavy: gradients to reduce every step, at the cost of one multiply-add.
        self.idle = torch.nn.Parameter(torch.zeros(idle_params)) if idle_params else None
        #: What memory_growth keeps alive (a leak).
        self.kept: list[torch.Tensor] = []
        #: Process-wide hooks this policy installed (:meth:`close` removes them).
        self.hooks: list = []

    def close(self) -> None:
        """Remove the process-wide hooks and drop what was kept (the run's teardown calls it)."""
        for handle in self.hooks:
            handle.remove()
        self.hooks, self.kept = [], []

    def forward(self, x):  # (B, width)
        fault, spec = self.fault, self.fault.spec
        _spin(spec.work_ms / 1e3, x.device)
        if fault.due("forward") and fault.delays("forward"):
            fault.inject(spec.delay_ms / 1e3, device=x.device)
        if spec.fault == "memory_growth" and fault.due("memory"):
            self.kept.append(torch.ones(int(spec.size * 2**20 / 4), device=x.device))
        x = self.layers(x)
        if self.idle is not None:
            x = x + self.idle[:1].sum() * 0.0  # every idle parameter gets a (zero) gradient
        return _Backward.apply(x, self._backward_work)

    def _backward_work(self, device: torch.device) -> None:
        fault, spec = self.fault, self.fault.spec
        if fault.due("bwd") and fault.delays("bwd"):
            fault.inject(spec.delay_ms / 1e3, device=device)
        _spin(spec.work_ms / 1e3, device)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def fault_policy(
    fault: str = "none",
    rank: int = 1,
    phase: str = "bwd",
    delay_ms: float = 100.0,
    every: int = 1,
    magnitude: float | None = None,
    step: int = 3,
    work_ms: float = 40.0,
    steps_per_iteration: int = 1,
    width: int = 32,
    layers: int = 2,
    samples: int = 64,
) -> UserPolicy:
    """The policy that injects one :class:`FaultSpec` on this rank (a policy factory).

    ``steps_per_iteration``: policy steps per benchmark iteration (see the module docstring);
    ``width``, ``layers``: the MLP; ``samples``: the dataset's size.

    Raises:
        ValueError: a parameter out of range, naming it (:class:`FaultSpec`).
    """
    spec = FaultSpec(
        fault=fault,
        rank=rank,
        phase=phase,
        delay_ms=delay_ms,
        every=every,
        magnitude=magnitude,
        step=step,
        work_ms=work_ms,
    )
    integer("steps_per_iteration", steps_per_iteration, low=1)
    state = _Fault(spec, _rank(), steps_per_iteration)
    idle = int(spec.size * 1e6) if fault == "comm_heavy" else 0
    model = FaultModel(state, width, layers, idle)
    data = torch.utils.data.TensorDataset(torch.randn(samples, width))

    def preprocess(batch, device):  # timed in dataload_wait
        if state.due("dataload_wait") and state.delays("dataload_wait"):
            state.inject(spec.delay_ms / 1e3, before_loss=True)
        return [t.to(device) for t in batch]

    def loss(m, batch):
        term = state.new_term()
        out = m(batch[0]).pow(2).mean()
        if fault == "nonfinite" and state.iteration("loss") == spec.step and state.rank == spec.rank:
            out = out * float("nan")
        return out, {INJECTED_TERM: term}

    if fault == "late_rank" and phase == "optim_step" and state.rank == rank:

        def before_step(optimizer, args, kwargs):
            if state.due("optim_step"):
                params = [p for group in optimizer.param_groups for p in group["params"]]
                state.inject(spec.delay_ms / 1e3, device=params[0].device if params else "cpu")

        # Every optimizer of this process (the suite builds AdamW; DeepSpeed steps it inside its
        # own), until the run closes the model: rank 0 is benchopt's process, which runs other cells.
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        model.hooks.append(register_optimizer_step_pre_hook(before_step))
    # Given, not counted: counting calls the loss once before training, a step the fault would count.
    flops = 6.0 * width * width * layers  # forward + backward of the linear layers, per sample
    return UserPolicy(model=model, loss=loss, dataset=data, preprocess=preprocess, flops_per_sample=flops)


class CpuHogs:
    """``count`` processes that each keep one CPU busy, for as long as the context lasts (the
    ``contention`` fault: other processes' work, which the host sampler must see).

    Each is ``python -c 'while True: pass'`` in a session of its own, ended by its id when the
    context exits (also on error). What they took is measured, not assumed (:meth:`cpu_sec`): on
    a busy machine a hog gets less than its CPU, and the score compares the sampler with what
    the hogs had."""

    def __init__(self, count: float) -> None:
        self.count = integer("magnitude", int(count), low=0) if float(count) == int(count) else None
        if self.count is None:
            raise ValueError(f"magnitude must be a whole number of processes for contention, got {count!r}")
        self.procs: list[subprocess.Popen] = []
        self._own = None

    def __enter__(self) -> CpuHogs:
        from scopebench.host_load import OwnTime

        for _ in range(self.count):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        self._own = OwnTime(pgids=[proc.pid for proc in self.procs])  # each leads its own session
        return self

    def cpu_sec(self) -> float:
        """CPU seconds the hogs have used since they started (0 without hogs)."""
        from scopebench.host_load import CLK_TCK

        return self._own.read() / CLK_TCK if self._own is not None and self.procs else 0.0

    def __exit__(self, *exc) -> None:
        procs, self.procs = self.procs, []
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
