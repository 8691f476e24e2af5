"""One ``sample_actions`` benchmark: model, observation, compilation, warm-up, profiler.

:class:`InferenceRun` is the one lifecycle of ``Pi05Inference``, used alike by the
benchopt solver, ``scopebench bench-inference``, ``scopebench decompose-latency`` and
``perf/policy_speed.py``. One iteration is one call at batch 1, in four regions
(``preprocess`` on the host, ``prefill``, ``denoise``, ``postprocess``). With a
``compile_mode``, ``torch.compile`` wraps the model's prefill and denoise (never the host
preprocessing); the ``n_warmup`` calls of ``start`` pay for compilation outside the
measured iterations, and the first call's excess over a steady call is reported as
``compile_time_sec``, with ``first_call_ratio`` = first call / median later warm-up call
(below 5, a warning says compilation may not have happened).

The observation is built from the dataset's first frame (the objective scores against
that frame's recorded actions): its camera images, cycled to ``num_cameras``; its task
prompt, repeated to ``prompt_words`` words (then bounded by the model's
``prompt_max_length`` tokens); its state.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from scopebench.distributed.device import resolve_device
from scopebench.policy.lifecycle import RunLifecycle
from scopebench.policy.settings import InferenceSettings
from scopebench.policy.steps import InferenceStep, policy_for_dataset

__all__ = ["COMPILE_RATIO_WARNING", "InferenceRun", "fit_latency", "make_observation"]

#: Below this first-call / steady-call ratio, compilation probably did not happen.
COMPILE_RATIO_WARNING = 5.0
_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def make_observation(sample: Mapping, num_cameras: int, prompt_words: int) -> dict:
    """A batch-1 observation from one dataset sample (see the module docstring).

    :Examples:

    >>> sample = {"camera0": torch.zeros(3, 4, 4), "state": torch.zeros(2), "prompt": "pick it"}
    >>> obs = make_observation(sample, num_cameras=2, prompt_words=5)
    >>> sorted(obs), obs["prompt"], tuple(obs["camera1"].shape)
    (['camera0', 'camera1', 'prompt', 'state'], ['pick it pick it pick'], (1, 3, 4, 4))
    """
    cams = sorted(k for k in sample if k.startswith("camera"))
    words = str(sample.get("prompt", "")).split() or ["go"]
    obs = {f"camera{i}": sample[cams[i % len(cams)]][None] for i in range(num_cameras)}
    obs["state"] = sample["state"][None]
    obs["prompt"] = [" ".join(words[i % len(words)] for i in range(prompt_words))]
    return obs


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


class InferenceRun(RunLifecycle):
    """Set-up, loop and teardown of one inference benchmark (a single process).

    Args:
        settings: Validated settings.
        dataset_root: Folder of the robot dataset (its first frame is the observation).
        chunk_size: The dataset's chunk size, used when ``settings.chunk_size`` is None.
        profiler_params: The ``profiler_*`` values (default: custom backend).
        output_dir: Folder of the profiler's files.
        name: Stem of the run's files.
        keep_rows: Keep every recorded call's raw metrics in ``profiler.rows`` (the tools
            report every sample); otherwise only when ``profiler_save_file`` writes them.
    """

    def __init__(
        self,
        settings: InferenceSettings,
        *,
        dataset_root: str | Path,
        chunk_size: int,
        profiler_params: dict[str, Any] | None = None,
        output_dir: str | Path = "outputs",
        name: str = "pi05_inference",
        keep_rows: bool = False,
    ) -> None:
        from scopebench.profiler import ProfilerConfig

        super().__init__()
        self.settings = settings
        self.dataset_root = str(dataset_root)
        self.chunk_size = settings.chunk_size or chunk_size
        if settings.n_action_steps is not None and settings.n_action_steps > self.chunk_size:
            raise ValueError(
                f"n_action_steps must be at most chunk_size={self.chunk_size}, got {settings.n_action_steps}"
            )
        self.profiler_config = ProfilerConfig.from_params(**dict(profiler_params or {}))
        self.output_dir = Path(output_dir)
        self.profiler_config.check_outputs(self.output_dir)
        self.name = name
        self.keep_rows = keep_rows
        inference_memory_check(settings)
        self.device = resolve_device(settings.device)
        self.model = None
        self.step: InferenceStep | None = None
        self.profiler = None
        self.setup_time_sec: float | None = None
        #: Seconds of each warm-up call, by ``num_steps``.
        self.warmup_sec: dict[int, list[float]] = {}
        self.actions: torch.Tensor | None = None
        self._untimed = None

    def start(self, warmup_num_steps: Sequence[int] | None = None) -> InferenceRun:
        """Build the model and the observation, compile, warm up; ``warmup_num_steps`` are
        the ``num_steps`` values the run will call with (default: ``settings.num_steps``)."""
        return super().start(warmup_num_steps)

    def _start(self, warmup_num_steps: Sequence[int] | None = None) -> None:
        from scopebench.policy.dataset import RobotDataset
        from scopebench.policy.runner import PolicyRunner
        from scopebench.profiler import profiler_from_config

        s = self.settings
        begin = time.perf_counter()
        self.warmup_sec = {}
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dataset = RobotDataset(self.dataset_root, chunk_size=self.chunk_size)
        torch.manual_seed(s.seed)
        overrides = dict(attention_implementation=s.attention_implementation, dtype=_DTYPES[s.precision])
        if s.num_cameras is not None:
            overrides["num_cameras"] = s.num_cameras
        self.model = policy_for_dataset(s.preset, dataset, **overrides).to(self.device).eval()
        cameras = self.model.config.num_cameras
        runner = PolicyRunner(self.model, stats=dataset.stats)
        prefill, denoise = self.model.prefill, self.model.denoise
        if s.compile_mode != "none":
            mode = None if s.compile_mode == "default" else s.compile_mode
            prefill, denoise = torch.compile(prefill, mode=mode), torch.compile(denoise, mode=mode)
        self.step = InferenceStep(
            runner,
            make_observation(dataset[0], cameras, s.prompt_words),
            num_steps=s.num_steps,
            n_action_steps=s.n_action_steps,
            prefill=prefill,
            denoise=denoise,
            compiled=s.compile_mode != "none",
        )
        for n in warmup_num_steps or [s.num_steps]:
            self.warmup_sec[n] = [self.timed_call(n) for _ in range(s.n_warmup)]
        self._check_compilation()
        self.profiler = self._stack.enter_context(
            profiler_from_config(self.profiler_config, device=self.device, name=self.name, output_dir=self.output_dir)
        )
        self.profiler.keep_rows |= self.keep_rows
        self.setup_time_sec = time.perf_counter() - begin

    @property
    def rank(self) -> int:
        """Always 0: an inference run is one process, which drives its own loop."""
        return 0

    def timed_call(self, num_steps: int | None = None) -> float:
        """Seconds of one unprofiled call (synchronised on CUDA), as the warm-up times it."""
        from scopebench.profiler import create_profiler
        from scopebench.profiler.device import DeviceOps

        if self._untimed is None:
            self._untimed = (create_profiler(None), DeviceOps(self.device))
        null, ops = self._untimed
        ops.synchronize()
        start = time.perf_counter()
        self.actions = self.step(null, num_steps)
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

    def loop(self, callback: Callable[[], bool] | None = None, schedule: Sequence[int] | None = None) -> None:
        """One call per iteration until ``callback`` returns False; iteration ``i`` uses
        ``num_steps = schedule[i % len(schedule)]`` (default: ``settings.num_steps``)."""
        if self.step is None:
            raise RuntimeError("InferenceRun.start() must run before loop()")
        for i in self.profiler.iterate(callback):
            n = schedule[i % len(schedule)] if schedule else None
            self.actions = self.step(self.profiler, n)

    def current_metrics(self) -> dict[str, Any]:
        """The last call's profiler metrics, plus the constant set-up and compile columns."""
        metrics = self.profiler.get_current_metrics() if self.profiler is not None else {}
        return {**metrics, "setup_time_sec": self.setup_time_sec, **self.compile_metrics()}
