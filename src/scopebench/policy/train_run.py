"""One policy training (or dataloader) run on every rank: group, accelerator, work, profiler.

:class:`PolicyTrainRun` is the one lifecycle of ``Pi05Train`` and ``Pi05Dataloader``,
driven alike by the benchopt solvers, the spawned ranks (:func:`run_worker`), the
``profile-step`` / ``profile-dataloader`` / ``find-unused-params`` commands and
``benchmarks/policy_speed.py``, so a number printed by a tool and one in a parquet come
from the same code::

    with PolicyTrainRun(settings, dataset_root=root, profiler_params=...) as run:
        run.loop(callback)               # rank 0's callback decides for every rank
        metrics = run.current_metrics()

``start`` (benchopt's ``pre_run_hook``: not timed) joins or creates the process group
(torchrun / ``accelerate launch`` / SLURM, or ``nproc_per_node - 1`` local workers started
by :class:`scopebench.dist.DistSession`), builds the accelerator, the dataloader and, for
training, the model, AdamW and the LR schedule, sends them through
``accelerator.prepare``, measures the device's peak FLOP/s, and ends with a barrier, so
the first measured iteration holds no start-up; the time it took is ``setup_time_sec``.
Leaving the ``with`` block (or :meth:`close`) finalizes the profiler, releases
accelerate's state and destroys what ``start`` created, also on error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from scopebench.policy.lifecycle import RunLifecycle
from scopebench.policy.settings import TrainSettings
from scopebench.policy.steps import (
    BACKWARD_STEP_PHASES,
    BatchStream,
    DataloaderStep,
    TrainStep,
    config_for_dataset,
    policy_for_dataset,
)
from scopebench.validate import choice

__all__ = [
    "TASKS",
    "WORKER",
    "PolicyTrainRun",
    "audit_parameters",
    "model_overrides",
    "open_training_data",
    "resolve_device",
    "run_worker",
    "training_memory_check",
]

#: What a run does each iteration: a training step, or a dataloader batch alone.
TASKS = ("train", "dataloader")
#: Entry point of spawned ranks (``scopebench.dist.worker`` imports and calls it).
WORKER = "scopebench.policy.train_run:run_worker"
_ADAMW_STATE_BYTES = 8  # two fp32 moments per parameter


def resolve_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto``: this rank's GPU when CUDA is available, else the CPU; ``cuda``: this rank's GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(f"cuda:{local_rank}") if device == "cuda" else torch.device(device)


def training_memory_check(settings: TrainSettings, processes: int = 1) -> None:
    """Refuse a preset whose fp32 weights, gradients and AdamW state exceed the free memory.

    Counted on the meta device (nothing allocated); activations are not counted. Skipped
    with ``check_memory: false``.
    """
    from scopebench.policy import make_policy
    from scopebench.train.memory import check_memory_fits

    if not settings.check_memory:
        return
    with torch.device("meta"):
        params = make_policy(settings.preset).num_params()
    per_param = 4 + 4 + (0 if settings.no_optim else _ADAMW_STATE_BYTES)
    what = f"{params / 1e9:.2f} B parameters x {per_param} bytes: fp32 weights, gradients"
    what += "" if settings.no_optim else " and AdamW state"
    check_memory_fits(
        "preset",
        settings.preset,
        needed_bytes=params * per_param,
        what=what + "; activations not counted",
        device=resolve_device(settings.device),
        override_key="check_memory",
        processes=processes,
    )


def model_overrides(settings: TrainSettings) -> dict[str, Any]:
    """The :class:`~scopebench.policy.config.Pi05Config` fields a training run sets."""
    return dict(
        attention_implementation=settings.attention_implementation,
        gradient_checkpointing=settings.gradient_checkpointing,
        ce_weight=settings.ce_weight,
    )


def open_training_data(settings: TrainSettings, dataset_root: str | Path, chunk_size: int):
    """The dataset and the training dataloader (seeded sampler, workers, prefetch) of a run."""
    from scopebench.policy.dataset import RobotDataset, make_dataloader

    dataset = RobotDataset(dataset_root, chunk_size=chunk_size)
    loader = make_dataloader(
        dataset,
        settings.batch_size,
        seed=settings.seed,
        num_workers=settings.num_workers,
        prefetch_factor=settings.prefetch_factor,
        persistent_workers=settings.num_workers > 0,
    )
    return dataset, loader


def audit_parameters(settings: TrainSettings, *, dataset_root: str | Path, chunk_size: int, include_zero_grad=False):
    """One forward + backward of the run's model on the run's first batch, on one device
    (no DDP): which parameters get no gradient (:func:`scopebench.policy.audit.find_unused_parameters`)."""
    from scopebench.policy.audit import find_unused_parameters
    from scopebench.policy.runner import Preprocessor

    device = resolve_device(settings.device)
    dataset, loader = open_training_data(settings, dataset_root, chunk_size)
    torch.manual_seed(settings.seed)
    model = policy_for_dataset(settings.preset, dataset, **model_overrides(settings)).to(device)
    batch = Preprocessor(model.config, dataset.stats, device).preprocess(next(iter(loader)))
    return find_unused_parameters(model, batch, include_zero_grad=include_zero_grad)


class PolicyTrainRun(RunLifecycle):
    """Set-up, loop and teardown of one training or dataloader run, the same on every rank.

    Args:
        settings: Validated run settings.
        dataset_root: Folder of the (already written) robot dataset.
        chunk_size: Actions per training sample (the policy's chunk size).
        task: ``train`` or ``dataloader`` (no model, no optimizer, no collective).
        profiler_params: The ``profiler_*`` values (default: the custom backend, every iteration).
        output_dir: Folder of the profiler's per-rank files.
        name: Stem of the run's files.
        keep_rows: Keep every recorded iteration's raw metrics on each rank (gathered into
            :attr:`rank_rows` by :meth:`loop`; the tools report every sample). Otherwise only
            when ``profiler_save_file`` writes them.
    """

    def __init__(
        self,
        settings: TrainSettings,
        *,
        dataset_root: str | Path,
        chunk_size: int,
        task: str = "train",
        profiler_params: dict[str, Any] | None = None,
        output_dir: str | Path = "outputs",
        name: str = "pi05_train",
        keep_rows: bool = False,
    ) -> None:
        from scopebench.dist import check_local_nproc, get_dist_info
        from scopebench.profiler import ProfilerConfig

        super().__init__()
        choice("task", task, TASKS)
        self.settings = settings
        self.dataset_root = str(dataset_root)
        self.chunk_size = chunk_size
        self.task = task
        self.profiler_params = dict(profiler_params or {})
        self.profiler_config = ProfilerConfig.from_params(**self.profiler_params)
        self.output_dir = Path(output_dir)
        self.profiler_config.check_outputs(self.output_dir)
        self.name = name
        self.keep_rows = keep_rows
        launcher = get_dist_info()
        device = resolve_device(settings.device)
        nproc = 1 if launcher.is_distributed else check_local_nproc("nproc_per_node", settings.nproc_per_node, device)
        self.nproc = nproc
        if task == "train":
            local = nproc if device.type == "cpu" and not launcher.is_distributed else 1
            training_memory_check(settings, processes=local)
        self.info = None
        self.device = device
        self.accelerator = None
        self.model = None
        self.step = None
        self.profiler = None
        self.setup_time_sec: float | None = None
        self.peak = None
        self.flops_per_sample = 0
        self.rank_rows: list[list[dict[str, Any]]] = []
        #: Per rank, gathered at the end of :meth:`loop`: accelerate's world size and a
        #: checksum of the weights (equal on every rank when DDP keeps them in sync).
        self.rank_checks: list[dict[str, Any]] = []

    # -- lifecycle -------------------------------------------------------------------
    def worker_kwargs(self) -> dict[str, Any]:
        """JSON keyword arguments of :func:`run_worker` for the other ranks."""
        import dataclasses

        return {
            "settings": dataclasses.asdict(self.settings),
            "dataset_root": self.dataset_root,
            "chunk_size": self.chunk_size,
            "task": self.task,
            "profiler_params": self.profiler_params,
            "output_dir": str(self.output_dir),
            "name": self.name,
            "keep_rows": self.keep_rows,
        }

    def _start(self) -> None:
        """Join or create the ranks and build everything; ends with a barrier."""
        from scopebench.dist import DistSession

        start = time.perf_counter()
        session_kwargs = {}
        if self.settings.group_timeout_sec is not None:
            session_kwargs["timeout_sec"] = self.settings.group_timeout_sec
        session = DistSession(
            self.nproc, worker=WORKER, worker_kwargs=self.worker_kwargs(), device=str(self.device), **session_kwargs
        )
        self.info = self._stack.enter_context(session)
        self.device = resolve_device(self.settings.device, self.info.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif self.info.source == "spawn":
            # Spawned CPU ranks share this machine's cores: one thread per core each.
            self._stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.info.world_size))
        self._build()
        self.accelerator.wait_for_everyone()
        self.setup_time_sec = time.perf_counter() - start

    def _build(self) -> None:
        from scopebench.policy.runner import Preprocessor
        from scopebench.profiler import profiler_from_config
        from scopebench.train import AcceleratorSettings, build_accelerator, peak_flops, release_accelerator

        s = self.settings
        self._stack.callback(release_accelerator)
        self.accelerator = acc = build_accelerator(
            AcceleratorSettings(
                precision=s.precision,
                find_unused_params=s.find_unused_params,
                torch_compile=s.torch_compile,
                timeout_sec=s.group_timeout_sec,
            ),
            self.info,
            self.device,
        )
        dataset, loader = open_training_data(s, self.dataset_root, self.chunk_size)
        torch.manual_seed(s.seed)  # the same initial weights on every rank
        overrides = model_overrides(s)
        preprocessor = Preprocessor(config_for_dataset(s.preset, dataset, **overrides), dataset.stats, self.device)
        if self.task == "dataloader":
            self.step = DataloaderStep(BatchStream(acc.prepare(loader)), preprocessor)
        else:
            model = policy_for_dataset(s.preset, dataset, **overrides).to(self.device)
            self._build_training(model, loader, preprocessor)
            self.peak = peak_flops(self.device, s.precision, s.peak_tflops)
        self.profiler = self._stack.enter_context(
            profiler_from_config(self.profiler_config, device=self.device, name=self.name, output_dir=self.output_dir)
        )
        self.profiler.keep_rows |= self.keep_rows

    def _build_training(self, model, loader, preprocessor) -> None:
        from scopebench.profiler.device import DeviceOps, peak_rss_mb
        from scopebench.train import build_adamw, build_scheduler

        s, acc = self.settings, self.accelerator
        self.model = model
        self.flops_per_sample = model.estimate_flops(1, "train")
        optimizer = scheduler = None
        if not s.no_optim:
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = build_adamw(params, lr=s.learning_rate, weight_decay=s.weight_decay, fused=s.fused_adamw)
            scheduler = build_scheduler(optimizer, name=s.scheduler, warmup_steps=s.warmup_steps)
            prepared, optimizer, scheduler, loader = acc.prepare(model, optimizer, scheduler, loader)
        else:
            prepared, loader = acc.prepare(model, loader)
        ops = DeviceOps(self.device)
        peak_gpu = [0.0]

        def memory() -> tuple[float, float]:
            # The custom profiler resets the device's peak at every region; fold in its
            # per-iteration peaks so far (this rank's rows) for the run's peak.
            last = self.profiler.last_local if self.profiler is not None else {}
            peak_gpu[0] = max(peak_gpu[0], last.get("max_gpu_mb", 0.0) or 0.0)
            return peak_rss_mb(), max(peak_gpu[0], ops.max_memory_mb())

        self.step = TrainStep(
            accelerator=acc,
            model=prepared,
            optimizer=optimizer,
            scheduler=scheduler,
            batches=BatchStream(loader),
            preprocessor=preprocessor,
            grad_clip=s.grad_clip,
            gather_every=s.gather_every,
            memory=memory,
        )

    # -- the loop --------------------------------------------------------------------
    def loop(self, callback: Callable[[], bool] | None = None) -> None:
        """One step per iteration until rank 0's ``callback`` returns False, then every
        rank's profiler rows are gathered into :attr:`rank_rows` (a collective)."""
        from scopebench.dist import gather_objects

        if self.step is None:
            raise RuntimeError("PolicyTrainRun.start() must run before loop()")
        for _ in self.profiler.iterate(callback):
            self.step(self.profiler)
        check = {"rank": self.rank, "accelerate_num_processes": self.accelerator.num_processes}
        if self.model is not None:
            with torch.no_grad():
                check["weights_checksum"] = float(sum(p.double().sum() for p in self.model.parameters()))
        gathered = gather_objects((list(self.profiler.rows), check))
        self.rank_rows = [rows for rows, _ in gathered]
        self.rank_checks = [c for _, c in gathered]

    @property
    def world_size(self) -> int:
        return 1 if self.info is None else self.info.world_size

    @property
    def rank(self) -> int:
        return 0 if self.info is None else self.info.rank

    @property
    def unwrapped_model(self):
        """The policy without DDP / compile wrappers (None for the dataloader task)."""
        if self.step is None or self.model is None:
            return None
        return self.accelerator.unwrap_model(self.step.model)

    def constant_metrics(self) -> dict[str, Any]:
        """Columns that do not change between iterations."""
        out: dict[str, Any] = {"setup_time_sec": self.setup_time_sec, "world_size": self.world_size}
        if self.peak is not None:
            out["peak_flops_per_sec"] = (
                None if self.peak.flops_per_sec is None else self.peak.flops_per_sec * self.world_size
            )
            out["peak_flops_source"] = self.peak.source
        return out

    def derived_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Throughput, FLOP/s, MFU and per-rank values derived from one iteration's metrics.

        ``step = total_time_sec - callback_time_sec`` (the step without benchopt's scoring);
        ``samples_per_sec = batch_size x world_size / step`` (:func:`scopebench.stats.samples_per_sec`);
        ``achieved_flops_per_sec = estimate_flops(global batch, "train") / step``;
        ``mfu = achieved / (peak of one device x world_size)``.
        """
        from scopebench.stats import samples_per_sec

        if "total_time_sec" not in metrics:
            return {}
        batch = self.settings.batch_size * self.world_size
        rate = samples_per_sec(batch, metrics)
        step_sec = batch / rate if rate else None
        out: dict[str, Any] = {"samples_per_sec": rate}
        if self.task == "dataloader":
            out["batches_per_sec"] = None if step_sec is None else 1.0 / step_sec
            return out
        out["steps_per_sec"] = None if step_sec is None else 1.0 / step_sec
        regions = [metrics.get(f"{p}_time_sec") for p in BACKWARD_STEP_PHASES]
        if all(r is not None for r in regions):
            out["backward_step_time_sec"] = sum(regions)
        achieved = None if step_sec is None else self.flops_per_sample * batch / step_sec
        out["achieved_flops_per_sec"] = achieved
        peak = self.constant_metrics().get("peak_flops_per_sec")
        out["mfu"] = None if (achieved is None or not peak) else achieved / peak
        gathered = self.step.gathered or []
        for r, row in enumerate(gathered):
            out[f"max_rss_mb_rank{r}"] = row["max_rss_mb"]
            out[f"max_gpu_mb_rank{r}"] = row["max_gpu_mb"]
        if gathered:
            out["max_rss_mb"] = max(metrics.get("max_rss_mb", 0.0), *(row["max_rss_mb"] for row in gathered))
            out["max_gpu_mb"] = max(metrics.get("max_gpu_mb", 0.0), *(row["max_gpu_mb"] for row in gathered))
            for key in ("train_loss", "mse_loss", "ce_loss"):
                values = [row[key] for row in gathered if row[key] == row[key]]  # NaN: term disabled
                if values:
                    out[key] = sum(values) / len(values)
        return out

    def current_metrics(self) -> dict[str, Any]:
        """The last iteration's profiler metrics plus derived and constant columns (rank 0's
        row covers every rank); only the constant columns outside the profiler's window."""
        metrics = self.profiler.get_current_metrics() if self.profiler is not None else {}
        return {**metrics, **self.derived_metrics(metrics), **self.constant_metrics()}


def run_worker(
    *,
    settings: dict[str, Any],
    dataset_root: str,
    chunk_size: int,
    task: str,
    profiler_params: dict[str, Any],
    output_dir: str,
    name: str,
    keep_rows: bool = False,
) -> None:
    """Rank > 0 of a locally spawned run: the same loop as rank 0, without a callback."""
    run = PolicyTrainRun(
        TrainSettings(**settings),
        dataset_root=dataset_root,
        chunk_size=chunk_size,
        task=task,
        profiler_params=profiler_params,
        output_dir=output_dir,
        name=name,
        keep_rows=keep_rows,
    )
    with run:
        run.loop(None)
