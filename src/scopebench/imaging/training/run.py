"""One training run on every rank: :class:`TrainingRun`, and the entry point of spawned ranks.

The benchopt solver (``UnrolledPnP``), the spawned workers (:func:`run_worker`) and the
scripts drive the same object::

    with TrainingRun(data_params=..., unrolled=..., train=..., nproc=2) as run:
        run.loop(callback)       # one optimizer step per iteration; rank 0's callback decides
    run.save_weights()           # rank 0 writes the trained denoiser

``start`` joins or creates the ranks (torchrun / SLURM / local spawn), builds the
:class:`~scopebench.imaging.training.trainer.UnrolledTrainer` from plain parameters (the
same weights on every rank, built before deepinv's ``DistributedContext`` is entered)
and, with ``distribute_model``, tiles the denoiser over the ranks; set-up ends with a
barrier and is reported once as ``setup_time_sec``. ``close`` tears down what ``start``
created, also on error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from scopebench.harness.run import RankRun
from scopebench.imaging.common.denoisers import DenoiserSpec
from scopebench.imaging.training.data import TrainingData, build_training_data
from scopebench.imaging.training.trainer import TrainConfig, UnrolledTrainer
from scopebench.imaging.training.unrolled import UnrolledConfig

__all__ = ["WEIGHTS_FILE", "WORKER_TARGET", "TrainingRun", "check_world_size", "run_worker"]

#: Weight file of a run, in the benchmark's ``outputs/`` folder.
WEIGHTS_FILE = "{run_name}_denoiser.safetensors"
#: ``module:function`` that spawned ranks run.
WORKER_TARGET = "scopebench.imaging.training.run:run_worker"


def check_world_size(world_size: int, distribute_model: bool) -> None:
    """Several ranks share the work only by tiling the denoiser (``distribute_model``).

    :Examples:
        >>> check_world_size(2, False)
        Traceback (most recent call last):
        ...
        ValueError: 2 processes need distribute_model=true (the ranks share the work by tiling the denoiser)
    """
    if world_size > 1 and not distribute_model:
        raise ValueError(
            f"{world_size} processes need distribute_model=true (the ranks share the work by tiling the denoiser)"
        )


class TrainingRun(RankRun):
    """Ranks, deepinv context, trainer and loop of one training run, the same on every rank.

    Args:
        data_params: Plain parameters of :func:`build_training_data`.
        unrolled: Architecture (or its ``dataclasses.asdict`` form).
        train: Optimisation and distribution settings (or their ``asdict`` form).
        data: The training set already built from ``data_params`` (rank 0 under benchopt).
        **run: ``nproc``, ``device``, ``profiler``, ``output_dir``, ``name``,
            ``group_timeout_sec``, ``worker`` of :class:`~scopebench.harness.run.RankRun`.
    """

    worker_target = WORKER_TARGET

    def __init__(
        self,
        *,
        data_params: dict[str, Any],
        unrolled: UnrolledConfig | dict[str, Any],
        train: TrainConfig | dict[str, Any],
        data: TrainingData | None = None,
        **run: Any,
    ) -> None:
        run.setdefault("name", "unrolled_pnp")
        super().__init__(**run)
        if isinstance(unrolled, dict):
            unrolled = UnrolledConfig(**{**unrolled, "denoiser": DenoiserSpec(**unrolled["denoiser"])})
        if isinstance(train, dict):
            train = TrainConfig(**train)
        check_world_size(self.world_size, train.distribute_model)
        self.data_params = dict(data_params)
        self.unrolled = unrolled
        self.train = train
        self.data = data
        self.trainer: UnrolledTrainer | None = None

    def worker_kwargs(self) -> dict[str, Any]:
        return {
            **super().worker_kwargs(),
            "data_params": self.data_params,
            "unrolled": dataclasses.asdict(self.unrolled),
            "train": dataclasses.asdict(self.train),
        }

    def build(self) -> None:
        data = self.data if self.data is not None else build_training_data(**self.data_params)
        self.trainer = UnrolledTrainer(data, self.unrolled, self.train, device=self.device)
        if self.train.distribute_model:
            from deepinv.distributed import DistributedContext

            mode = "gpu" if self.device.type == "cuda" else "cpu"
            # Reuses the group DistSession created and leaves its teardown to it (cleanup=False).
            ctx = DistributedContext(device_mode=mode, cleanup=False)
            ctx.__enter__()
            self._context = ctx
            ctx.device = self.device  # spawned ranks have no LOCAL_RANK for deepinv to read
            self.trainer.distribute(ctx)

    def step(self, profiler: Any) -> None:
        self.trainer.step(profiler)

    def teardown(self) -> None:
        ctx, self._context = getattr(self, "_context", None), None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def save_weights(self) -> Path | None:
        """Rank 0 writes ``<output_dir>/<name>_<run id>_denoiser.safetensors``; others return ``None``."""
        from scopebench.distributed import writes_reports
        from scopebench.profiler.files import new_run_id

        if self.trainer is None or not writes_reports():
            return None
        stem = f"{self.name}_{new_run_id()}"
        return self.trainer.save_weights(self.output_dir / WEIGHTS_FILE.format(run_name=stem))


def run_worker(**kwargs: Any) -> None:
    """Body of a spawned rank: the same run as rank 0, following its decisions."""
    with TrainingRun(**kwargs) as run:
        run.loop(None)
