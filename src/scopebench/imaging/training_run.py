"""One training run on every rank: process group, deepinv context, trainer, loop.

:class:`TrainingRun` is used identically by rank 0 (the benchopt solver) and by locally
spawned ranks (:func:`run_worker`, started by :class:`scopebench.dist.DistSession`):
``start`` joins or creates the process group (torchrun / SLURM / local spawn), builds the
:class:`~scopebench.imaging.train.UnrolledTrainer` from plain parameters (the same weights
on every rank, built before deepinv's ``DistributedContext`` is entered) and, with
``distribute_model``, tiles the denoiser over the ranks; ``loop`` runs
``for _ in profiler.iterate(callback): trainer.step(profiler)`` (rank 0's callback decides
for every rank); ``close`` tears down what ``start`` created, also on error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from scopebench.imaging.train import TrainConfig, UnrolledTrainer
from scopebench.imaging.training_data import TrainingData, build_training_data
from scopebench.imaging.unrolled import DenoiserSpec, UnrolledConfig

__all__ = ["WEIGHTS_FILE", "WORKER", "TrainingRun", "resolve_device", "run_worker", "unrolled_config_from_dict"]

#: Weight file of a run, in the benchmark's ``outputs/`` folder.
WEIGHTS_FILE = "{run_name}_denoiser.safetensors"
#: Entry point of spawned ranks (``scopebench.dist.worker`` imports and calls it).
WORKER = "scopebench.imaging.training_run:run_worker"


def unrolled_config_from_dict(params: dict[str, Any]) -> UnrolledConfig:
    """Inverse of ``dataclasses.asdict(UnrolledConfig)`` (worker keyword arguments)."""
    params = dict(params)
    params["denoiser"] = DenoiserSpec(**params["denoiser"])
    return UnrolledConfig(**params)


def resolve_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto``: this rank's GPU (``cuda:<local_rank>``) when CUDA is available, else the CPU."""
    if device == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class TrainingRun:
    """Process group, deepinv context, trainer and loop of one run, the same on every rank.

    ``start`` (benchopt's ``pre_run_hook``: not timed) spawns the local workers when needed,
    builds the trainer and distributes it; ``loop`` trains until rank 0's callback says
    stop; ``close`` (in ``finally``) tears down what ``start`` created.

    Args:
        data_params: Plain parameters of :func:`build_training_data`.
        unrolled: Architecture.
        train: Optimisation and distribution settings.
        nproc: Processes wanted without a launcher (this one is rank 0); under torchrun or
            SLURM the launcher's world is used.
        device: ``auto`` (this rank's GPU if any, else CPU), ``cpu`` or ``cuda``.
        profiler_params: The ``profiler_*`` values, for the spawned ranks' profilers.
        output_dir: The benchmark's ``outputs/`` folder.
        name: Stem of the run's files.
        timeout_sec: Bound on worker start-up and on every collective.
    """

    def __init__(
        self,
        *,
        data_params: dict[str, Any],
        unrolled: UnrolledConfig,
        train: TrainConfig,
        nproc: int = 1,
        device: str = "auto",
        profiler_params: dict[str, Any] | None = None,
        output_dir: str | Path = "outputs",
        name: str = "unrolled_pnp",
        timeout_sec: float = 300.0,
    ) -> None:
        from scopebench.dist import get_dist_info

        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise ValueError(f"nproc_per_node must be a positive integer, got {nproc!r}")
        launcher = get_dist_info()
        world = launcher.world_size if launcher.is_distributed else nproc
        if world > 1 and not train.distribute_model:
            raise ValueError(
                f"{world} processes need distribute_model=true (the ranks share the work by tiling the denoiser)"
            )
        self.data_params = dict(data_params)
        self.unrolled = unrolled
        self.train = train
        self.nproc = 1 if launcher.is_distributed else nproc
        self.device_name = device
        self.device = resolve_device(device, 0)  # refined by start(), which knows the local rank
        self.profiler_params = dict(profiler_params or {})
        self.output_dir = Path(output_dir)
        self.name = name
        self.timeout_sec = timeout_sec
        self.trainer: UnrolledTrainer | None = None
        self.session = None
        self._stack = contextlib.ExitStack()
        self._threads: int | None = None

    def worker_kwargs(self) -> dict[str, Any]:
        """JSON-serialisable keyword arguments of :func:`run_worker` for the other ranks."""
        return {
            "data_params": self.data_params,
            "unrolled": dataclasses.asdict(self.unrolled),
            "train": dataclasses.asdict(self.train),
            "device": self.device_name,
            "profiler_params": self.profiler_params,
            "output_dir": str(self.output_dir),
            "name": self.name,
            "timeout_sec": self.timeout_sec,
        }

    def start(self, data: TrainingData | None = None) -> None:
        """Join or create the process group, build the trainer, distribute the model."""
        from scopebench.dist import DistSession

        device = resolve_device(self.device_name, 0)
        self.session = DistSession(
            self.nproc,
            worker=WORKER,
            worker_kwargs=self.worker_kwargs(),
            device=str(device),
            timeout_sec=self.timeout_sec,
        )
        try:
            info = self.session.start()
            self.device = resolve_device(self.device_name, info.local_rank)
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            elif info.source == "spawn":
                # Spawned CPU ranks share this machine's cores: without a split each rank
                # would start one thread per core and they would fight over them.
                self._threads = torch.get_num_threads()
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world_size))
            data = data if data is not None else build_training_data(**self.data_params)
            self.trainer = UnrolledTrainer(data, self.unrolled, self.train, device=self.device)
            if self.train.distribute_model:
                from deepinv.distributed import DistributedContext

                mode = "gpu" if self.device.type == "cuda" else "cpu"
                ctx = self._stack.enter_context(DistributedContext(device_mode=mode, cleanup=False))
                ctx.device = self.device  # spawned ranks have no LOCAL_RANK for deepinv to read
                self.trainer.distribute(ctx)
        except BaseException:
            self.close(failed=True)
            raise

    def loop(self, profiler: Any, callback: Callable[[], bool] | None = None) -> None:
        """Train one step per iteration until rank 0's ``callback`` returns False."""
        if self.trainer is None:
            raise RuntimeError("TrainingRun.start() must run before loop()")
        for _ in profiler.iterate(callback):
            self.trainer.step(profiler)

    def save_weights(self) -> Path | None:
        """Rank 0 writes ``<output_dir>/<name>_<run id>_denoiser.safetensors``; others return ``None``."""
        from scopebench.dist import writes_reports
        from scopebench.profiler.files import new_run_id

        if self.trainer is None or not writes_reports():
            return None
        stem = f"{self.name}_{new_run_id()}"
        return self.trainer.save_weights(self.output_dir / WEIGHTS_FILE.format(run_name=stem))

    def close(self, failed: bool = False) -> None:
        """Leave deepinv's context and destroy the process group this run created."""
        self._stack.close()
        session, self.session = self.session, None
        try:
            if session is not None:
                session.close(failed=failed)
        finally:
            if self._threads is not None:
                torch.set_num_threads(self._threads)
                self._threads = None


def run_worker(
    *,
    data_params: dict[str, Any],
    unrolled: dict[str, Any],
    train: dict[str, Any],
    device: str = "auto",
    profiler_params: dict[str, Any] | None = None,
    output_dir: str = "outputs",
    name: str = "unrolled_pnp",
    timeout_sec: float = 300.0,
) -> None:
    """Rank > 0 of a locally spawned run: the same loop as rank 0, without a callback."""
    from scopebench.profiler import ProfilerConfig, profiler_from_config

    run = TrainingRun(
        data_params=data_params,
        unrolled=unrolled_config_from_dict(unrolled),
        train=TrainConfig(**train),
        device=device,
        profiler_params=profiler_params,
        output_dir=output_dir,
        name=name,
        timeout_sec=timeout_sec,
    )
    run.start()
    failed = True
    try:
        config = ProfilerConfig.from_params(**(profiler_params or {}))
        with profiler_from_config(config, device=run.device, name=name, output_dir=output_dir) as profiler:
            run.loop(profiler, None)
        failed = False
    finally:
        run.close(failed=failed)
