"""One reconstruction run on every rank: :class:`PnPRun`, and the entry point of spawned ranks.

The benchopt solvers (``PnP``, ``Denoiser``), the spawned workers (:func:`run_worker`) and
the scripts (:func:`reconstruct`) all drive the same object::

    with PnPRun(spec, config, task="pnp", nproc=2) as run:  # ranks, engine, profiler, barrier
        run.loop(callback)                                   # rank 0's callback decides
    x, metrics = run.x, run.metrics()

Rank 0 passes benchopt's callback; every other rank follows its continue/stop decision,
which ``profiler.iterate`` broadcasts. Spawned ranks rebuild the problem and the engine
from the plain parameters of :meth:`PnPRun.worker_kwargs`. Set-up (worker start-up, the
problem, the denoiser, ``torch.compile``) ends with a barrier and is reported once as
``setup_time_sec``, never inside an iteration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.harness.run import RankRun
from scopebench.imaging.inference.engine import TASKS, PnPEngine, ReconstructionConfig, build_engine
from scopebench.validate import choice, integer

__all__ = ["WORKER_TARGET", "PnPRun", "reconstruct", "run_worker", "throughput_metrics"]

#: ``module:function`` that spawned ranks run.
WORKER_TARGET = "scopebench.imaging.inference.run:run_worker"


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


class PnPRun(RankRun):
    """A PnP reconstruction (or repeated denoiser passes) on one rank of one or many.

    Args:
        spec: The problem's plain parameters (``{"kind": ..., **params}``).
        config: :class:`ReconstructionConfig` or its keyword arguments.
        task: ``pnp`` (regions ``gradient``, ``denoise``) or ``denoise`` (one denoiser
            pass per iteration, cost counted at set-up).
        **run: ``nproc``, ``profiler``, ``output_dir``, ``name``, ``group_timeout_sec``,
            ``worker`` of :class:`~scopebench.harness.run.RankRun` (the device comes from
            ``config.device``).
    """

    worker_target = WORKER_TARGET

    def __init__(
        self, spec: dict[str, Any], config: ReconstructionConfig | dict[str, Any], *, task: str = "pnp", **run: Any
    ) -> None:
        if not isinstance(config, ReconstructionConfig):
            config = ReconstructionConfig(**config)
        run.pop("device", None)  # a worker's kwargs repeat it; the config is the source
        super().__init__(device=config.device, **run)
        self.spec = dict(spec)
        self.config = config
        self.task = choice("task", task, TASKS)
        self.engine: PnPEngine | None = None

    def worker_kwargs(self) -> dict[str, Any]:
        return {**super().worker_kwargs(), "spec": self.spec, "config": self.config.to_kwargs(), "task": self.task}

    def build(self) -> None:
        self.engine = build_engine(self.spec, self.config, self.task, device=self.device)

    def step(self, profiler: Any) -> None:
        self.engine.iteration(profiler)

    def teardown(self) -> None:
        if self.engine is not None:
            self.engine.close()

    @property
    def x(self) -> Any:
        """The current estimate (``None`` before the engine exists)."""
        return self.engine.x if self.engine is not None else None

    def metrics(self) -> dict[str, Any]:
        """Set-up facts, ``setup_time_sec``, the last iteration's metrics and the achieved throughput."""
        static = self.engine.static_metrics() if self.engine is not None else {}
        measured = super().metrics()
        return {**static, **measured, **throughput_metrics(static, measured)}


def run_worker(**kwargs: Any) -> None:
    """Body of a spawned rank: the same run as rank 0, following its decisions."""
    with PnPRun(**kwargs) as run:
        run.loop(None)


def reconstruct(
    spec: dict[str, Any],
    config: dict[str, Any],
    *,
    num_iterations: int,
    nproc: int = 1,
    task: str = "pnp",
    profiler: dict[str, Any] | None = None,
    name: str = "reconstruct",
    output_dir: str | Path = "outputs",
    group_timeout_sec: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Run ``num_iterations`` on ``nproc`` local processes without benchopt (scripts and tests).

    Returns:
        ``(x, metrics)``: rank 0's final estimate (on CPU) and :meth:`PnPRun.metrics`.
    """
    integer("num_iterations", num_iterations, low=1)
    run = PnPRun(
        spec,
        config,
        task=task,
        nproc=nproc,
        profiler=profiler,
        name=name,
        output_dir=output_dir,
        group_timeout_sec=group_timeout_sec,
    )
    calls = [0]

    def until_done() -> bool:
        calls[0] += 1
        return calls[0] <= num_iterations

    with run:
        run.loop(until_done)
    return run.x.detach().cpu(), run.metrics()
