"""One policy training (or dataloader) run on every rank: group, accelerator, work, profiler.

:class:`PolicyTrainRun` is the one lifecycle of ``Pi05Train`` and ``Pi05Dataloader``,
driven alike by the benchopt solvers, the spawned ranks (:func:`run_worker`), the
``profile-step`` / ``profile-dataloader`` / ``find-unused-params`` commands and
``perf/policy_speed.py``, so a number printed by a tool and one in a parquet come
from the same code. It is a :class:`~scopebench.harness.run.RankRun`, like the imaging
run objects::

    with PolicyTrainRun(settings, dataset_root=root, profiler=ProfilerConfig(...)) as run:
        run.loop(callback)               # rank 0's callback decides for every rank
        metrics = run.metrics()

``start`` (benchopt's ``pre_run_hook``: not timed) joins or creates the process group
(torchrun / ``accelerate launch`` / SLURM, or ``nproc_per_node - 1`` local workers started
by :class:`scopebench.distributed.DistSession`); :meth:`PolicyTrainRun.build` builds the
accelerator, the dataloader and, for training, the model, AdamW and the LR schedule,
sends them through ``accelerator.prepare`` and measures the device's peak FLOP/s; set-up
ends with a barrier, so the first measured iteration holds no start-up, and the time it
took is ``setup_time_sec``. Leaving the ``with`` block (or :meth:`close`) finalizes the
profiler, releases accelerate's state and destroys what ``start`` created, also on error;
a spawned rank of a failed run writes no profiler files, as in every benchmark.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from scopebench.distributed.device import resolve_device
from scopebench.harness.run import RankRun
from scopebench.policy.phases import BACKWARD_STEP_PHASES
from scopebench.policy.run.checks import check_model_states, check_run, model_overrides
from scopebench.policy.run.steps import MEMORY_KEYS, BatchStream, DataloaderStep, TrainStep
from scopebench.policy.settings import TrainSettings
from scopebench.train.accelerate_file import AccelerateFile
from scopebench.train.backends import DEFAULT_BACKEND, TrainingBackend, get_backend
from scopebench.validate import choice

__all__ = [
    "TASKS",
    "WORKER",
    "PolicyTrainRun",
    "audit_parameters",
    "model_overrides",
    "run_worker",
    "run_policy",
]

#: What a run does each iteration: a training step, or a dataloader batch alone.
TASKS = ("train", "dataloader")
#: Entry point of spawned ranks (``scopebench.distributed.worker`` imports and calls it).
WORKER = "scopebench.policy.run.train:run_worker"


def run_policy(settings: Any, *, dataset_root: str | Path, chunk_size: int, task: str = "train"):
    """The :class:`~scopebench.policy.user.UserPolicy` of a run (``settings.policy``), built after
    seeding torch with ``settings.seed``: pi05 with the run's data and model settings
    (:func:`scopebench.policy.pi05.policy.pi05_args`), a user factory with ``settings.policy_args``."""
    from scopebench.policy.pi05.policy import pi05_args
    from scopebench.policy.user import build_policy

    if settings.policy == "pi05":
        args = pi05_args(settings, dataset_root=dataset_root, chunk_size=chunk_size, task=task)
    else:
        args = settings.policy_args
    return build_policy(settings.policy, args, seed=settings.seed)


def audit_parameters(settings: TrainSettings, *, dataset_root: str | Path, chunk_size: int, include_zero_grad=False):
    """One forward + backward of the run's model on the run's first batch, on one device
    (no DDP): which parameters get no gradient (:func:`scopebench.policy.audit.find_unused_parameters`)."""
    from scopebench.policy.audit import find_unused_parameters
    from scopebench.policy.calls import check_trainable, make_policy_loader, policy_loss, prepare_batch

    device = resolve_device(settings.device)
    policy = run_policy(settings, dataset_root=dataset_root, chunk_size=chunk_size)
    check_trainable(policy)
    loader = make_policy_loader(policy, min(settings.batch_size, len(policy.dataset)), seed=settings.seed)
    model = policy.model.to(device)
    batch = prepare_batch(policy, next(iter(loader)), device)
    return find_unused_parameters(
        model,
        batch,
        include_zero_grad=include_zero_grad,
        loss=lambda m, b: policy_loss(policy, m, b, settings.policy)[0],
    )


class PolicyTrainRun(RankRun):
    """Set-up, loop and teardown of one training or dataloader run, the same on every rank.

    Args:
        settings: Validated run settings (``nproc_per_node``, ``device`` and
            ``group_timeout_sec`` are the :class:`~scopebench.harness.run.RankRun`'s).
        dataset_root: Folder of the (already written) robot dataset.
        chunk_size: Actions per training sample (the policy's chunk size).
        task: ``train`` or ``dataloader`` (no model, no optimizer, no collective).
        eval_batch_size: Before each callback every rank computes the held-out validation loss of
            the objective (:func:`scopebench.policy.calls.validation_loss` on the same
            ``eval_batch_size`` samples of the policy's dataset, :func:`~scopebench.policy.calls.fixed_batch`;
            where the backend shards the parameters a forward needs every rank's shard); it becomes :attr:`val_loss`.
        resume_from: A checkpoint (folder, ``checkpoints/`` or output folder with a
            ``last`` pointer) to continue from: weights, optimizer, scheduler, RNG states,
            step count and data position (:mod:`scopebench.train.checkpoint`).
        accelerate_file: The run's accelerate file as a tool resolved it from ``settings``
            (:func:`scopebench.train.accelerate_file.resolve_accelerate_file`: its backend is the
            run's); None: resolved here. Every check, the accelerator, the step and the
            checkpoints are handed its backend.
        **run: ``profiler``, ``output_dir``, ``name``, ``keep_rows``, ``worker`` of
            :class:`~scopebench.harness.run.RankRun`; with ``keep_rows`` every rank's
            recorded rows are also gathered into :attr:`rank_rows` by :meth:`loop`.
    """

    worker_target = WORKER

    def __init__(
        self,
        settings: TrainSettings,
        *,
        dataset_root: str | Path,
        chunk_size: int,
        task: str = "train",
        eval_batch_size: int | None = None,
        resume_from: str | Path | None = None,
        accelerate_file: AccelerateFile | None = None,
        **run: Any,
    ) -> None:
        import warnings

        from scopebench.train.accelerate_file import resolve_accelerate_file
        from scopebench.train.backends import check_launcher
        from scopebench.train.checkpoint import resolve_checkpoint

        choice("task", task, TASKS)
        if task == "train" and accelerate_file is None:
            accelerate_file = resolve_accelerate_file(settings.backend, settings.accelerate_config)
        elif task == "train" and accelerate_file.backend.name != settings.backend:
            raise ValueError(
                f"accelerate_file {accelerate_file.path} selects backend {accelerate_file.backend.name}, but "
                f"backend={settings.backend}: pass the file resolved from these settings"
            )
        #: The run's accelerate file (training only): resolved once, with the run's backend, and
        #: checked against the settings and the layout.
        self.accelerate_file = accelerate_file if task == "train" else None
        #: The run's training backend, resolved once (the dataloader task trains nothing: the default's).
        self.backend: TrainingBackend = accelerate_file.backend if task == "train" else get_backend(DEFAULT_BACKEND)
        settings, warning = self.backend.run_settings(settings)
        if warning:
            warnings.warn(warning, RuntimeWarning, stacklevel=2)
        for key in ("nproc", "device", "group_timeout_sec"):  # a worker's kwargs repeat them; settings are the source
            run.pop(key, None)
        run.setdefault("name", "pi05_train")
        super().__init__(
            nproc=settings.nproc_per_node,
            device=settings.device,
            group_timeout_sec=settings.group_timeout_sec,
            **run,
        )
        self.settings = settings
        check_launcher(self.backend)
        self.eval_batch_size = eval_batch_size
        self.resume_from = None if resume_from is None else str(resolve_checkpoint(resume_from))
        #: The held-out validation loss computed by every rank before each callback (with ``eval_batch_size``).
        self.val_loss: float | None = None
        self.dataset_root = str(dataset_root)
        self.chunk_size = chunk_size
        self.task = task
        #: Processes sharing this machine's memory (local ranks on a CPU).
        self.local_processes = self.nproc if self.device.type == "cpu" and not self.info.is_distributed else 1
        check_run(  # a user policy's model is checked once built (_check_policy)
            settings,
            file=self.accelerate_file,
            world_size=self.world_size,
            nodes=self.info.nodes,
            processes=self.local_processes,
            dataset_root=dataset_root,
            chunk_size=chunk_size,
            measure=self.info.source != "spawn",  # rank 0 measured for its spawned ranks
        )
        #: The run's :class:`~scopebench.policy.user.UserPolicy` (after start).
        self.policy = None
        #: Whether every rank holds only a shard of each parameter (the backend's ``shards_parameters``).
        self.sharded = task == "train" and self.backend.shards_parameters
        self.accelerator = None
        self.model = None
        self._own_group = False
        #: The step of each iteration: :class:`TrainStep` or :class:`DataloaderStep` (after start).
        self.work = None
        self.peak = None
        self.flops_per_sample = 0
        self._eval: Any = None
        self._sampler = None
        self.rank_rows: list[list[dict[str, Any]]] = []
        #: Per rank, gathered at the end of :meth:`loop`: accelerate's world size and a
        #: checksum of the weights (equal on every rank when DDP keeps them in sync).
        self.rank_checks: list[dict[str, Any]] = []

    # -- RankRun hooks ---------------------------------------------------------------
    def worker_kwargs(self) -> dict[str, Any]:
        """JSON keyword arguments of :func:`run_worker` for the other ranks."""
        import dataclasses

        return {
            **super().worker_kwargs(),
            "settings": dataclasses.asdict(self.settings),
            "dataset_root": self.dataset_root,
            "chunk_size": self.chunk_size,
            "task": self.task,
            "eval_batch_size": self.eval_batch_size,
            "resume_from": self.resume_from,
        }

    def build(self) -> None:
        """The accelerator, the data, and for training the model, AdamW and the schedule."""
        import functools

        from scopebench.policy.calls import fixed_batch, make_policy_loader, measure_flops_per_sample, prepare_batch
        from scopebench.train import AcceleratorSettings, build_accelerator, peak_flops

        s = self.settings
        # Before the accelerator: under ZeRO-3 it announces DeepSpeed's config to transformers, whose
        # models would then be built already partitioned (zero.Init), which the policy's checks and
        # FLOP count cannot read; DeepSpeed partitions the built model itself when it is prepared.
        self.policy = policy = run_policy(s, dataset_root=self.dataset_root, chunk_size=self.chunk_size, task=self.task)
        self._check_policy()
        if self.task == "train":
            self._own_group = self.backend.join_group(self.device)
        self.accelerator = acc = build_accelerator(
            AcceleratorSettings(
                backend=self.backend,
                precision=s.precision,
                find_unused_params=s.find_unused_params,
                torch_compile=s.torch_compile,
                timeout_sec=s.group_timeout_sec,
                micro_batch_size=s.batch_size,
                gradient_accumulation_steps=s.gradient_accumulation_steps,
                grad_clip=s.grad_clip,
                zero=self.accelerate_file.zero if self.accelerate_file else {},
            ),
            self.info,
            self.device,
        )
        loader = make_policy_loader(
            policy, s.batch_size, seed=s.seed, num_workers=s.num_workers, prefetch_factor=s.prefetch_factor
        )
        prepare = functools.partial(prepare_batch, policy, device=self.device, non_blocking=self.device.type == "cuda")
        if self.task == "dataloader":
            data = policy.dataset
            self.work = DataloaderStep(
                BatchStream(acc.prepare(loader)),
                prepare,
                decoder=getattr(data, "decoder", None),
                cameras=len(getattr(data, "cameras", ())),
            )
            return
        model = policy.model.to(self.device)
        self.flops_per_sample = policy.flops_per_sample or measure_flops_per_sample(policy, self.device, s.policy)
        self._sampler = loader.sampler
        self._build_training(model, loader, prepare)
        self.peak = peak_flops(self.device, s.precision, s.peak_tflops)
        if self.eval_batch_size is not None:
            self._eval = fixed_batch(policy, self.eval_batch_size)
        if self.resume_from is not None:
            self._resume(self.resume_from)

    def _check_policy(self) -> None:
        """A user policy's dataset against the batch, and its model states against the free memory."""
        from scopebench.policy.calls import check_trainable
        from scopebench.policy.data.dataset import check_batch_fits

        s, policy = self.settings, self.policy
        if s.policy == "pi05":
            return
        if self.task == "train":
            check_trainable(policy)
        check_batch_fits(s.batch_size, len(policy.dataset), self.world_size, f"the dataset of policy {s.policy}")
        if self.task == "train" and s.check_memory:
            params = sum(p.numel() for p in policy.model.parameters())
            check_model_states(
                s,
                "policy",
                s.policy,
                params,
                backend=self.backend,
                world_size=self.world_size,
                device=self.device,
                processes=self.local_processes,
            )

    def step(self, profiler: Any) -> None:
        self.work(profiler)

    def memory_subjects(self) -> dict[str, Any] | None:
        """The prepared model, its optimizer and DeepSpeed's engine (``profiler_memory``)."""
        if self.task != "train":
            return None
        return {"model": self.work.model, "optimizer": self.work.optimizer, "engine": self.work.engine}

    def communication_model(self) -> Any:
        """The prepared model (under DDP, the wrapper the ledger's all-reduce hook goes on)."""
        return self.work.model if self.task == "train" else None

    def teardown(self) -> None:
        from scopebench.train import release_accelerator

        release_accelerator(self.accelerator)  # the model and its wrappers stay readable for get_result
        if self._own_group:
            import torch.distributed as dist

            dist.destroy_process_group()
            self._own_group = False

    def _build_training(self, model, loader, prepare) -> None:
        import functools

        from scopebench.policy.calls import policy_loss
        from scopebench.profiler.device import DeviceOps, peak_rss_mb
        from scopebench.train import build_adamw, build_scheduler

        s, acc = self.settings, self.accelerator
        self.model = model

        def build_optimizer(params):
            optimizer = build_adamw(params, lr=s.learning_rate, weight_decay=s.weight_decay, fused=s.fused_adamw)
            return optimizer, build_scheduler(optimizer, name=s.scheduler, warmup_steps=s.warmup_steps)

        prepared = self.backend.prepare(
            acc,
            model,
            loader,
            build_optimizer=None if s.no_optim else build_optimizer,
            settings=s,
            file=self.accelerate_file,
            device=self.device,
            modules=self.policy.shard_modules,
            world_size=self.world_size,
            nodes=self.info.nodes,
        )
        #: FSDP's units sharded on their own (their names), else empty.
        self.fsdp_units = prepared.units
        ops = DeviceOps(self.device)
        peak_gpu = [0.0]

        def memory() -> tuple[float, float]:
            # The custom profiler resets the device's peak at every region; fold in its
            # per-iteration peaks so far (this rank's rows) for the run's peak.
            last = self.profiler.last_local if self.profiler is not None else {}
            peak_gpu[0] = max(peak_gpu[0], last.get("max_gpu_mb", 0.0) or 0.0)
            return peak_rss_mb(), max(peak_gpu[0], ops.max_memory_mb())

        self.work = TrainStep(
            accelerator=acc,
            backend=self.backend,
            model=prepared.model,
            optimizer=prepared.optimizer,
            scheduler=prepared.scheduler,
            batches=BatchStream(prepared.loader),
            prepare=prepare,
            loss=functools.partial(policy_loss, self.policy, name=s.policy),
            grad_clip=s.grad_clip,
            gather_every=s.gather_every,
            accumulation=s.gradient_accumulation_steps,
            memory=memory,
        )

    # -- checkpoints -----------------------------------------------------------------
    def training_state(self) -> dict[str, Any]:
        """Where the run stands: optimizer steps done and the data position (same on every rank)."""
        return {"step": self.work.steps, **self.work.batches.state()}

    def save_checkpoint(
        self, output_dir: str | Path, files: dict[str, str] | None = None, settings: dict[str, Any] | None = None
    ) -> Path:
        """Every rank: write ``<output_dir>/checkpoints/<step>/`` (a collective; see
        :func:`scopebench.train.checkpoint.save_checkpoint`), plus ``policy_config.json``.

        Args:
            output_dir: The run's output folder.
            files: Extra text files (name -> content) written by rank 0.
            settings: The settings a resume must keep, for the manifest
                (:func:`scopebench.policy.run.trainer.resume_settings`); None: this run's
                training settings alone (no dataset section is known here).
        """
        import dataclasses
        import json

        from scopebench.policy.checkpoint import POLICY_CONFIG_FILE, RESUME_MAY_CHANGE
        from scopebench.train.checkpoint import save_checkpoint

        meta = {
            **self.training_state(),
            "backend": self.backend.name,
            "world_size": self.world_size,
            "global_batch_size": self.global_batch_size,
        }
        if settings is None:
            own = {**dataclasses.asdict(self.settings), "nproc_per_node": self.world_size}
            settings = {key: value for key, value in own.items() if key not in RESUME_MAY_CHANGE}
        extra = {POLICY_CONFIG_FILE: json.dumps(self.policy_record(), indent=2) + "\n", **(files or {})}
        return save_checkpoint(
            self.accelerator,
            output_dir,
            self.work.steps,
            meta=meta,
            files=extra,
            settings=settings,
            backend=self.backend,
            state=(self.work.model, self.work.optimizer),
        )

    def policy_record(self) -> dict[str, Any]:
        """What ``policy_config.json`` holds: pi05's preset and model config, or a user policy's
        factory and arguments (what a resume must rebuild)."""
        import dataclasses

        s = self.settings
        if s.policy != "pi05":
            return {"policy": s.policy, "policy_args": s.policy_args}
        config = self.accelerator.unwrap_model(self.work.model).config
        return {"preset": s.preset, "config": dataclasses.asdict(config)}

    def _resume(self, checkpoint: str) -> None:
        from scopebench.train.checkpoint import load_checkpoint

        meta = load_checkpoint(
            self.accelerator,
            checkpoint,
            world_size=self.world_size,
            backend=self.backend,
            state=(self.work.model, self.work.optimizer),
        )
        from scopebench.train.checkpoint import STEP_FILE

        self.work.steps = meta["step"]
        per_batch = self.settings.batch_size * self.world_size
        taken = meta["step"] * self.settings.gradient_accumulation_steps  # each step takes that many batches
        source = str(Path(checkpoint) / STEP_FILE)
        self.work.batches.resume(meta["epoch"], meta["position"], self._sampler, per_batch, taken=taken, source=source)

    # -- the loop --------------------------------------------------------------------
    def loop(
        self, callback: Callable[[], bool] | None = None, before_callback: Callable[[], None] | None = None
    ) -> None:
        """:meth:`RankRun.loop`, then every rank's profiler rows are gathered into
        :attr:`rank_rows` and its checks into :attr:`rank_checks` (a collective).

        With ``eval_batch_size`` every rank also computes :attr:`val_loss` before each callback,
        after ``before_callback`` (under ZeRO-3 and FSDP2 a forward needs every rank's shards).
        Training: the losses of the steps after the last gather are checked when the loop ends
        (:meth:`TrainStep.check`), so ``work.nonfinite`` covers every step taken.
        """
        from scopebench.distributed import gather_objects

        hooks = [h for h in (self._score_on_every_rank if self._eval else None, before_callback) if h]
        super().loop(callback, before_callback=(lambda: [hook() for hook in hooks]) if hooks else None)
        if self.task == "train":
            self.work.check()
        check = {"rank": self.rank, "accelerate_num_processes": self.accelerator.num_processes}
        if self.model is not None and not self.sharded:  # ZeRO-3, FSDP2: each rank holds a shard
            with torch.no_grad():
                check["weights_checksum"] = float(sum(p.double().sum() for p in self.model.parameters()))
        gathered = gather_objects((list(self.profiler.rows), check))
        self.rank_rows = [rows for rows, _ in gathered]
        self.rank_checks = [c for _, c in gathered]

    def _score_on_every_rank(self) -> None:
        from scopebench.policy.calls import validation_loss

        model = self.accelerator.unwrap_model(self.work.model)
        self.val_loss = validation_loss(self.policy, model, self._eval, self.settings.seed)

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks: batch x ranks x accumulation."""
        return self.settings.batch_size * self.world_size * self.settings.gradient_accumulation_steps

    @property
    def unwrapped_model(self):
        """The policy without DDP / DeepSpeed / compile wrappers; None for the dataloader task
        and under ZeRO-3 and FSDP2, where this rank holds only a shard of each parameter."""
        if self.work is None or self.model is None or self.sharded:
            return None
        return self.accelerator.unwrap_model(self.work.model)

    def constant_metrics(self) -> dict[str, Any]:
        """Columns that do not change between iterations."""
        out: dict[str, Any] = {"world_size": self.world_size}
        if self.peak is not None:
            out["peak_flops_per_sec"] = (
                None if self.peak.flops_per_sec is None else self.peak.flops_per_sec * self.world_size
            )
            out["peak_flops_source"] = self.peak.source
        return out

    def derived_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Throughput, FLOP/s, MFU and per-rank values derived from one iteration's metrics.

        ``step = step_time_sec`` (the slowest rank's step without benchopt's scoring);
        ``samples_per_sec = batch_size x world_size x gradient_accumulation_steps / step`` (:func:`scopebench.stats.samples_per_sec`);
        ``achieved_flops_per_sec = estimate_flops(global batch, "train") / step``;
        ``mfu = achieved / (peak of one device x world_size)``.
        """
        from scopebench.stats import samples_per_sec

        if "total_time_sec" not in metrics:
            return {}
        batch = self.global_batch_size if self.task == "train" else self.settings.batch_size * self.world_size
        rate = samples_per_sec(batch, metrics)
        step_sec = batch / rate if rate else None
        out: dict[str, Any] = {"samples_per_sec": rate}
        if self.task == "dataloader":
            out["batches_per_sec"] = None if step_sec is None else 1.0 / step_sec
            return out
        out["steps_per_sec"] = None if step_sec is None else 1.0 / step_sec
        # wall time of each phase: the custom backend's _time_sec, the torch backend's _cpu_sec
        regions = [metrics.get(f"{p}_time_sec", metrics.get(f"{p}_cpu_sec")) for p in BACKWARD_STEP_PHASES]
        if all(r is not None for r in regions):
            out["backward_step_time_sec"] = sum(regions)
        achieved = None if step_sec is None else self.flops_per_sample * batch / step_sec
        out["achieved_flops_per_sec"] = achieved
        peak = self.constant_metrics().get("peak_flops_per_sec")
        out["mfu"] = None if (achieved is None or not peak) else achieved / peak
        gathered = self.work.gathered or []
        for r, row in enumerate(gathered):
            out[f"max_rss_mb_rank{r}"] = row["max_rss_mb"]
            out[f"max_gpu_mb_rank{r}"] = row["max_gpu_mb"]
        if gathered:
            out["max_rss_mb"] = max(metrics.get("max_rss_mb", 0.0), *(row["max_rss_mb"] for row in gathered))
            out["max_gpu_mb"] = max(metrics.get("max_gpu_mb", 0.0), *(row["max_gpu_mb"] for row in gathered))
            for key in [k for k in gathered[0] if k not in MEMORY_KEYS]:  # train_loss and the loss's terms
                # a term's NaN: absent on that rank; the loss is never absent: a NaN there is the mean's
                values = [row[key] for row in gathered if key == "train_loss" or row[key] == row[key]]
                if values:
                    out[key] = sum(values) / len(values)
        return out

    def metrics(self, row: dict[str, Any] | None = None) -> dict[str, Any]:
        """The metrics now: the last iteration's profiler metrics (or ``row``) and
        ``setup_time_sec`` (:meth:`RankRun.metrics`) plus derived and constant columns (rank 0's
        row covers every rank); only the constant columns outside the profiler's window."""
        metrics = super().metrics(row)
        return {**metrics, **self.derived_metrics(metrics), **self.constant_metrics()}


def run_worker(*, settings: dict[str, Any], **kwargs: Any) -> None:
    """Rank > 0 of a locally spawned run: the same loop as rank 0, without a callback."""
    with PolicyTrainRun(TrainSettings(**settings), **kwargs) as run:
        run.loop(None)
