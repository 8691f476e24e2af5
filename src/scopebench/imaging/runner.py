"""The iteration loop every rank runs, and the entry point of spawned ranks.

Rank 0 (the benchopt process) calls :func:`run_loop` with benchopt's callback; every
other rank calls it with ``None`` and follows rank 0's continue/stop decision, which
``profiler.iterate`` broadcasts. Spawned ranks enter through :func:`run_worker`, which
rebuilds the problem from its plain parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scopebench.imaging.pnp import PnPEngine, ReconstructionConfig
from scopebench.imaging.problems import build_problem

__all__ = [
    "WORKER_TARGET",
    "build_engine",
    "reconstruct",
    "run_loop",
    "run_worker",
    "throughput_metrics",
]

#: ``module:function`` that :class:`scopebench.dist.DistSession` starts on spawned ranks.
WORKER_TARGET = "scopebench.imaging.runner:run_worker"


def build_engine(spec: dict[str, Any], config: dict[str, Any], task: str = "pnp") -> PnPEngine:
    """This rank's engine, from plain parameters only (identical on every rank)."""
    from scopebench.dist import get_dist_info

    spec = dict(spec)
    problem = build_problem(spec.pop("kind"), **spec)
    return PnPEngine(
        problem,
        ReconstructionConfig(**config),
        local_rank=get_dist_info().local_rank,
        task=task,
        count_cost=task == "denoise",
    )


def run_loop(engine: PnPEngine, profiler: Any, callback: Callable[[], bool] | None) -> None:
    """Iterate until rank 0's callback says stop (``engine.x`` holds the estimate)."""
    if engine.task == "pnp":
        for _ in profiler.iterate(callback):
            engine.step(profiler)
    else:
        noisy = engine.x0
        for _ in profiler.iterate(callback):
            engine.denoise_once(noisy, profiler)


def throughput_metrics(static: dict[str, Any], metrics: dict[str, Any]) -> dict[str, float]:
    """``achieved_gflop_per_sec = flops_per_iter / denoise_time_sec / 1e9`` when both are known.

    :Examples:
        >>> throughput_metrics({"flops_per_iter": 2e9}, {"denoise_time_sec": 0.5})
        {'achieved_gflop_per_sec': 4.0}
        >>> throughput_metrics({"flops_per_iter": 2e9}, {})
        {}
    """
    seconds = metrics.get("denoise_time_sec")
    if not seconds or seconds <= 0:
        return {}
    flops, moved = static.get("flops_per_iter"), static.get("bytes_per_iter")
    out = {
        "achieved_gflop_per_sec": flops / seconds / 1e9 if flops else None,
        "achieved_gbyte_per_sec": moved / seconds / 1e9 if moved else None,
    }
    return {key: value for key, value in out.items() if value is not None}


def run_worker(
    *,
    spec: dict[str, Any],
    config: dict[str, Any],
    profiler: dict[str, Any],
    task: str,
    name: str,
    output_dir: str,
) -> None:
    """Body of a spawned rank: rebuild, then run the same loop as rank 0 without callback."""
    from scopebench.profiler import ProfilerConfig, profiler_from_config

    prof_config = ProfilerConfig.from_params(**profiler)
    engine = build_engine(spec, config, task)
    try:
        with profiler_from_config(prof_config, device=engine.device, name=name, output_dir=output_dir) as prof:
            run_loop(engine, prof, None)
    finally:
        engine.close()


def reconstruct(
    spec: dict[str, Any],
    config: dict[str, Any],
    *,
    num_iterations: int,
    nproc: int = 1,
    task: str = "pnp",
    profiler: dict[str, Any] | None = None,
    name: str = "reconstruct",
    output_dir: str = "outputs",
    timeout_sec: float = 300.0,
) -> tuple[Any, dict[str, Any]]:
    """Run ``num_iterations`` on ``nproc`` local processes without benchopt.

    The same path as the benchopt solvers (ranks spawned by
    :class:`scopebench.dist.DistSession`, engine rebuilt from plain parameters on each
    rank, the profiled loop), for scripts and tests.

    Returns:
        ``(x, metrics)``: rank 0's final estimate (on CPU) and the profiler metrics of the
        last iteration merged with the engine's set-up metrics.
    """
    from scopebench.dist import DistSession
    from scopebench.imaging.pnp import resolve_device
    from scopebench.profiler import ProfilerConfig, profiler_from_config

    if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or num_iterations < 1:
        raise ValueError(f"num_iterations must be a positive integer, got {num_iterations!r}")
    prof_kwargs = dict(profiler or {})
    prof_config = ProfilerConfig.from_params(**prof_kwargs)
    ReconstructionConfig(**config)  # fail here, before any process starts
    session = DistSession(
        nproc,
        worker=WORKER_TARGET,
        worker_kwargs=dict(spec=spec, config=config, profiler=prof_kwargs, task=task, name=name, output_dir=output_dir),
        device=resolve_device(config.get("device", "auto")).type,
        timeout_sec=timeout_sec,
    )
    failed = True
    session.start()
    try:
        engine = build_engine(spec, config, task)
        remaining = [num_iterations]

        def callback() -> bool:
            remaining[0] -= 1
            return remaining[0] >= 0

        try:
            with profiler_from_config(prof_config, device=engine.device, name=name, output_dir=output_dir) as prof:
                run_loop(engine, prof, callback)
                metrics = prof.get_current_metrics()
        finally:
            engine.close()
        static = engine.static_metrics()
        failed = False
    finally:
        session.close(failed=failed)
    return engine.x.detach().cpu(), {**static, **metrics, **throughput_metrics(static, metrics)}
