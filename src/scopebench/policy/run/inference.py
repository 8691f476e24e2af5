"""One inference benchmark: model, observation, compilation, warm-up, profiler.

:class:`InferenceRun` is the one lifecycle of ``Pi05Inference``, used alike by the
benchopt solver, ``scopebench bench-inference``, ``scopebench decompose-latency`` and
``perf/policy_speed.py``, for pi05 and any :class:`~scopebench.policy.user.UserPolicy` with
``sample`` and ``observation``. One iteration is one call at batch 1, in four regions
(``preprocess`` on the host, ``prefill`` (a policy without one has no such region),
``denoise`` (the policy's ``sample``), ``postprocess``). With a ``compile_mode``,
``torch.compile`` wraps the policy's prefill and sample (never the host preprocessing); the ``n_warmup`` calls of ``start``, for each ``num_steps`` of the run's
``schedule`` (compilation happens per ``num_steps``), pay for compilation outside the
measured iterations, and the first call's excess over a steady call is reported as
``compile_time_sec``, with ``first_call_ratio`` = first call / median later warm-up call
(below 5, a warning says compilation may not have happened).

The observation is the policy's ``observation(1)``. pi05 builds it from the dataset's first
frame (the objective scores against that frame's recorded actions):
:func:`scopebench.policy.pi05.make_observation`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from scopebench.distributed.device import resolve_device
from scopebench.harness.run import RankRun
from scopebench.policy.run.steps import InferenceStep
from scopebench.policy.settings import InferenceSettings

__all__ = ["COMPILE_RATIO_WARNING", "InferenceRun", "fit_latency"]

#: Below this first-call / steady-call ratio, compilation probably did not happen.
COMPILE_RATIO_WARNING = 5.0
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def fit_latency(num_steps: Sequence[float], latency: Sequence[float]) -> dict[str, float]:
    """Least-squares fit of ``L(N) = F + N * s``.

    Returns:
        ``fixed_sec`` (F), ``per_step_sec`` (s) and ``r2`` (``1 - SS_res / SS_tot``).

    :Examples:

    >>> fit = fit_latency([1, 2, 4], [3.0, 5.0, 9.0])
    >>> round(fit["fixed_sec"], 6), round(fit["per_step_sec"], 6), round(fit["r2"], 6)
    (1.0, 2.0, 1.0)
    """
    n = len(num_steps)
    if n != len(latency) or n < 2 or len(set(num_steps)) < 2:
        raise ValueError(f"need latencies at two or more distinct num_steps, got {list(num_steps)}")
    mx, my = sum(num_steps) / n, sum(latency) / n
    sxx = sum((x - mx) ** 2 for x in num_steps)
    sxy = sum((x - mx) * (y - my) for x, y in zip(num_steps, latency))
    slope = sxy / sxx
    fixed = my - slope * mx
    ss_res = sum((y - fixed - slope * x) ** 2 for x, y in zip(num_steps, latency))
    ss_tot = sum((y - my) ** 2 for y in latency)
    return {"fixed_sec": fixed, "per_step_sec": slope, "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0}


def inference_memory_check(settings: InferenceSettings) -> None:
    """Refuse a preset whose weights exceed the free memory (``check_memory: false`` skips)."""
    from scopebench.policy import make_policy
    from scopebench.train.memory import check_memory_fits

    if not settings.check_memory:
        return
    with torch.device("meta"):
        params = make_policy(settings.preset).num_params()
    per_param = 2 if settings.precision == "bf16" else 4
    check_memory_fits(
        "preset",
        settings.preset,
        needed_bytes=params * per_param,
        what=f"{params / 1e9:.2f} B parameters x {per_param} bytes of {settings.precision} weights",
        device=resolve_device(settings.device),
        override_key="check_memory",
    )


class InferenceRun(RankRun):
    """Set-up, loop and teardown of one inference benchmark (a single process).

    Args:
        settings: Validated settings (``device`` is the :class:`~scopebench.harness.run.RankRun`'s).
        dataset_root: Folder of the robot dataset (pi05: its first frame is the observation).
        chunk_size: The dataset's chunk size, used when ``settings.chunk_size`` is None.
        tool: How errors name the caller (a policy without ``sample`` is refused naming it).
        schedule: The ``num_steps`` of the calls: iteration ``i`` uses
            ``schedule[i % len(schedule)]``, and every value is warmed up (``n_warmup``
            calls each) before the first measured call. Default: ``[settings.num_steps]``.
        **run: ``profiler``, ``output_dir``, ``name``, ``keep_rows`` of
            :class:`~scopebench.harness.run.RankRun`.
    """

    def __init__(
        self,
        settings: InferenceSettings,
        *,
        dataset_root: str | Path,
        chunk_size: int,
        schedule: Sequence[int] | None = None,
        tool: str = "Pi05Inference",
        **run: Any,
    ) -> None:
        from scopebench.validate import integer

        run.setdefault("name", "pi05_inference")
        super().__init__(nproc=1, device=settings.device, **run)
        self.settings = settings
        self.dataset_root = str(dataset_root)
        self.chunk_size = settings.chunk_size or chunk_size
        if settings.n_action_steps is not None and settings.n_action_steps > self.chunk_size:
            raise ValueError(
                f"n_action_steps must be at most chunk_size={self.chunk_size}, got {settings.n_action_steps}"
            )
        if schedule is not None and (isinstance(schedule, (str, bytes)) or not list(schedule)):
            raise ValueError(f"schedule must be a non-empty list of num_steps, got {schedule!r}")
        self.schedule = [integer("schedule", n, low=1) for n in (schedule or [settings.num_steps])]
        if settings.policy == "pi05":
            inference_memory_check(settings)
        else:
            from scopebench.policy.user import resolve_factory

            resolve_factory(settings.policy)
        self.tool = tool
        self.policy = None
        self.model = None
        #: The call of each iteration (after start).
        self.work: InferenceStep | None = None
        #: Seconds of each warm-up call, by ``num_steps``.
        self.warmup_sec: dict[int, list[float]] = {}
        #: The last call's output (pi05: the action chunk).
        self.actions: Any = None
        self._untimed = None
        self._calls = 0

    def build(self) -> None:
        """Policy, observation, compilation; then ``n_warmup`` calls for each ``num_steps``."""
        import functools

        from scopebench.policy.run.train import run_policy
        from scopebench.policy.user import prepare_batch, to_device

        s = self.settings
        self.warmup_sec, self._calls, self._untimed = {}, 0, None
        self.policy = policy = run_policy(
            s, dataset_root=self.dataset_root, chunk_size=self.chunk_size, task="inference"
        )
        policy.require("sample", "observation", tool=self.tool)
        self.model = model = policy.model.to(self.device, _DTYPES[s.precision]).eval()

        def sample(state: Any, num_steps: int) -> Any:  # closures, which torch.compile traces through
            return policy.sample(model, state, num_steps)

        def prefill(observation: Any) -> Any:
            return policy.prefill(model, observation)

        prefill = None if policy.prefill is None else prefill
        if s.compile_mode != "none":
            mode = None if s.compile_mode == "default" else s.compile_mode
            sample = torch.compile(sample, mode=mode)
            prefill = None if prefill is None else torch.compile(prefill, mode=mode)
        self.work = InferenceStep(
            policy.observation(1),
            prepare=functools.partial(prepare_batch, policy, device=self.device),
            sample=sample,
            num_steps=s.num_steps,
            prefill=prefill,
            postprocess=policy.postprocess or functools.partial(to_device, device=torch.device("cpu")),
            model=model,
            compiled=s.compile_mode != "none",
        )
        for n in dict.fromkeys(self.schedule):
            self.warmup_sec[n] = [self.timed_call(n) for _ in range(s.n_warmup)]
        self._check_compilation()

    def step(self, profiler: Any) -> None:
        """One call, with the schedule's next ``num_steps``."""
        n = self.schedule[self._calls % len(self.schedule)]
        self._calls += 1
        self.actions = self.work(profiler, n)

    def timed_call(self, num_steps: int | None = None) -> float:
        """Seconds of one unprofiled call (synchronised on CUDA), as the warm-up times it."""
        from scopebench.profiler import create_profiler
        from scopebench.profiler.device import DeviceOps

        if self._untimed is None:
            self._untimed = (create_profiler(None), DeviceOps(self.device))
        null, ops = self._untimed
        ops.synchronize()
        start = time.perf_counter()
        self.actions = self.work(null, num_steps)
        ops.synchronize()
        return time.perf_counter() - start

    def compile_metrics(self) -> dict[str, float]:
        """``compile_time_sec`` and ``first_call_ratio`` of the first warm-up series (compile only)."""
        from scopebench.stats import median

        if self.settings.compile_mode == "none" or not self.warmup_sec:
            return {}
        first = next(iter(self.warmup_sec.values()))
        steady = median(first[1:])
        return {"compile_time_sec": max(0.0, first[0] - steady), "first_call_ratio": first[0] / steady}

    def _check_compilation(self) -> None:
        ratio = self.compile_metrics().get("first_call_ratio")
        if ratio is not None and ratio < COMPILE_RATIO_WARNING:
            warnings.warn(
                f"compile_mode={self.settings.compile_mode!r}: the first call took only {ratio:.1f}x a steady call "
                f"(expected >= {COMPILE_RATIO_WARNING:.0f}x): compilation may not have happened",
                stacklevel=3,
            )

    def metrics(self) -> dict[str, Any]:
        """The metrics now: the last call's profiler metrics and ``setup_time_sec``
        (:meth:`RankRun.metrics`), plus the constant compile columns."""
        return {**super().metrics(), **self.compile_metrics()}
