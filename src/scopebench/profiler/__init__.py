"""One profiler interface, four backends (docs/design.md, "Profiler contract").

:Examples:
    >>> from scopebench.profiler import create_profiler
    >>> prof = create_profiler("custom", "cpu", "doc", warmup=1)
    >>> calls = iter([True, True, False])
    >>> for i in prof.iterate(lambda: next(calls)):
    ...     with prof.track_step("work"):
    ...         pass
    >>> sorted(k for k in prof.get_current_metrics() if k.startswith("work"))
    ['work_max_gpu_mb', 'work_time_sec']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.profiler.base import Profiler, reduce_across_ranks
from scopebench.profiler.config import MODES, PROFILER_DEFAULTS, ProfilerConfig

__all__ = [
    "MODES",
    "PROFILER_DEFAULTS",
    "Profiler",
    "ProfilerConfig",
    "create_profiler",
    "profiler_from_config",
    "reduce_across_ranks",
]


def profiler_from_config(
    config: ProfilerConfig, device: Any = "cpu", name: str = "run", output_dir: str | Path = "outputs"
) -> Profiler:
    """The backend ``config.mode`` names, built from an already validated config."""
    if config.mode == "null":
        from scopebench.profiler.backends import NullProfiler as cls
    elif config.mode == "custom":
        from scopebench.profiler.backends import CustomProfiler as cls
    elif config.mode == "torch":
        from scopebench.profiler.torch_backend import TorchProfiler as cls
    else:
        from scopebench.profiler.nvidia import NvidiaProfiler as cls
    return cls(config, device=device, name=name, output_dir=output_dir)


def create_profiler(
    mode: str | None,
    device: Any = "cpu",
    name: str = "run",
    warmup: int = ProfilerConfig.warmup,
    active: int = ProfilerConfig.active,
    save_file: bool = ProfilerConfig.save_file,
    per_step: bool = ProfilerConfig.per_step,
    repeat: int = ProfilerConfig.repeat,
    trace_dir: str | Path | None = ProfilerConfig.trace_dir,
    memory: bool = ProfilerConfig.memory,
    *,
    output_dir: str | Path = "outputs",
) -> Profiler:
    """Build a profiler; every argument is validated before anything runs.

    The defaults are :class:`ProfilerConfig`'s (their one source, as the solvers' ``profiler_*``
    parameters in :data:`PROFILER_DEFAULTS`).

    Args:
        mode: ``None``/``"null"``, ``"custom"``, ``"torch"`` or ``"nvidia"``.
        device: Device the solver computes on (synchronised around regions on CUDA).
        name: Stem of this run's file names.
        warmup: Iterations run before recording.
        active: Iterations recorded after warm-up (0: all remaining).
        save_file: Write per-rank CSV files to ``output_dir``.
        per_step: torch backend: a profiler cycle per iteration (else one scheduled cycle).
        repeat: torch scheduled mode: number of cycles (0: forever).
        trace_dir: torch scheduled mode: directory of the gzipped Chrome traces (one folder
            per run and cycle, :data:`scopebench.profiler.files.TRACE_FILE`).
        memory: Memory by category per region (:mod:`scopebench.profiler.memory`), once told
            the model and optimizer (:meth:`Profiler.track_memory`).
        output_dir: Directory of the per-rank CSV files (a benchmark's ``outputs/``).
    """
    config = ProfilerConfig(
        mode=mode,
        warmup=warmup,
        active=active,
        save_file=save_file,
        per_step=per_step,
        repeat=repeat,
        trace_dir=trace_dir,
        memory=memory,
    )
    return profiler_from_config(config, device=device, name=name, output_dir=output_dir)
