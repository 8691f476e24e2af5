"""One training step, one dataloader step and one action-chunk inference, in named phases.

The run objects (:mod:`~scopebench.policy.run.train`, :mod:`~scopebench.policy.run.inference`)
call these with a profiler; each phase is a profiler region, named as
:mod:`scopebench.policy.phases` lists them (with what each holds per backend). The model
itself never sees the profiler (docs/style.md rule 3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from scopebench.policy.config import Pi05Config, make_config
from scopebench.policy.dataset import RobotDataset
from scopebench.policy.model import Pi05Policy
from scopebench.policy.runner import PolicyRunner, Preprocessor

__all__ = [
    "GATHERED_KEYS",
    "BatchStream",
    "DataloaderStep",
    "InferenceStep",
    "TrainStep",
    "config_for_dataset",
    "policy_for_dataset",
    "validation_loss",
]

#: Per-rank values of the ``sync_gather`` phase, in the order of the gathered tensor.
GATHERED_KEYS = ("train_loss", "mse_loss", "ce_loss", "max_rss_mb", "max_gpu_mb")


class BatchStream:
    """Endless batches from a dataloader: a new epoch starts when one ends.

    It counts where it is, for checkpoints: :attr:`epoch` (epochs finished) and
    :attr:`position` (batches taken in the current epoch).
    """

    def __init__(self, loader: Iterable) -> None:
        self.loader = loader
        self._iter: Iterator | None = None
        self.epoch = 0
        self.position = 0

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Mapping:
        if self._iter is None:
            self._iter = iter(self.loader)
        try:
            batch = next(self._iter)
        except StopIteration:
            self.epoch, self.position = self.epoch + 1, 0
            self._iter = iter(self.loader)
            batch = next(self._iter)
        self.position += 1
        return batch

    def state(self) -> dict[str, int]:
        """``{"epoch", "position"}``: what :meth:`resume` needs."""
        return {"epoch": self.epoch, "position": self.position}

    def resume(self, epoch: int, position: int, sampler: Any, samples_per_batch: int) -> None:
        """Continue at batch ``position`` of epoch ``epoch``, as if never interrupted.

        Args:
            epoch: Epochs finished when the state was saved.
            position: Batches taken in that epoch.
            sampler: The loader's index sampler (``skip_next``/``set_epoch``).
            samples_per_batch: Indices the sampler yields per batch of this rank (all ranks'
                batches: accelerate hands each rank every ``world_size``-th batch).
        """
        if self._iter is not None:
            raise RuntimeError("resume() must come before the first batch")
        if position >= len(self.loader):  # saved at the end of an epoch: the next one starts
            epoch, position = epoch + 1, 0
        set_epoch = getattr(self.loader, "set_epoch", None) or sampler.set_epoch
        set_epoch(epoch)
        sampler.skip_next(position * samples_per_batch)
        self.epoch, self.position = epoch, position


class TrainStep:
    """One optimizer step of a model prepared by an ``accelerate.Accelerator``.

    Args:
        accelerator: Owns the backward, the clipping and the gathers.
        model: The prepared model (DDP-wrapped with several ranks, DeepSpeed's engine, or the
            model sharded in place by FSDP2's ``fully_shard``).
        optimizer: The prepared optimizer, or None (``no_optim``: gradients are dropped).
        scheduler: The prepared LR scheduler, or None.
        batches: Endless dataloader batches.
        preprocessor: Batch -> model inputs on the device.
        grad_clip: Maximum global gradient norm; 0 disables clipping (DeepSpeed clips
            inside its ``step`` from its own config).
        gather_every: Gather loss terms and peaks every this many steps.
        accumulation: Micro-batches per optimizer step.
        memory: ``() -> (rss_mb, gpu_mb)`` of this rank, read in ``sync_gather``.
    """

    def __init__(
        self,
        *,
        accelerator: Any,
        model: torch.nn.Module,
        optimizer: Any,
        scheduler: Any,
        batches: Iterator,
        preprocessor: Preprocessor,
        grad_clip: float,
        gather_every: int = 1,
        accumulation: int = 1,
        memory: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0),
    ) -> None:
        from accelerate.utils import DistributedType

        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.batches = batches
        self.preprocessor = preprocessor
        self.grad_clip = grad_clip
        self.gather_every = gather_every
        self.accumulation = accumulation
        self.memory = memory
        #: DeepSpeed's engine (the prepared model) under ZeRO, else None.
        self.engine = model if accelerator.distributed_type == DistributedType.DEEPSPEED else None
        #: FSDP2: the model sharded by ``fully_shard`` (gradient sync and clipping are its own).
        self.fsdp = callable(getattr(model, "set_requires_gradient_sync", None))
        #: The global gradient norm before clipping at the last step (a tensor; None without clipping).
        self.grad_norm: torch.Tensor | None = None
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.steps = 0
        #: Every rank's :data:`GATHERED_KEYS` at the last gather (rank order), or None.
        self.gathered: list[dict[str, float]] | None = None

    def __call__(self, prof) -> None:
        acc, engine = self.accelerator, self.engine
        self.model.train()
        losses: list[tuple[torch.Tensor, Mapping[str, torch.Tensor]]] = []
        for micro in range(self.accumulation):
            last = micro == self.accumulation - 1
            with prof.track_step("dataload_wait"):
                obs = self.preprocessor.preprocess(next(self.batches))
            # DDP: all-reduce the gradients on the last micro-batch only (FSDP2: reduce-scatter).
            if self.fsdp:
                self.model.set_requires_gradient_sync(last)
            with contextlib.nullcontext() if (last or engine is not None or self.fsdp) else acc.no_sync(self.model):
                with prof.track_step("forward"):
                    with acc.autocast():
                        loss, terms = self.model(obs)
                with prof.track_step("bwd"):
                    if engine is not None:  # scales by 1/accumulation itself
                        engine.set_gradient_accumulation_boundary(is_boundary=last)
                        engine.backward(loss)
                    else:
                        acc.backward(loss / self.accumulation if self.accumulation > 1 else loss)
            losses.append((loss.detach(), {k: v.detach() for k, v in terms.items()}))
        with prof.track_step("unscale_clip"):
            if engine is None and self.optimizer is not None and self.grad_clip > 0:
                if self.fsdp:  # the norm over every rank's shards, not this rank's
                    from scopebench.train.fsdp import clip_grad_norm

                    self.grad_norm = clip_grad_norm(self.params, self.grad_clip)
                else:
                    self.grad_norm = acc.clip_grad_norm_(self.params, self.grad_clip)
        with prof.track_step("optim_step"):
            if engine is not None:
                engine.step()
            elif self.optimizer is not None:
                self.optimizer.step()
        with prof.track_step("zero_grad_sched"):
            if engine is None:
                (self.optimizer or self.model).zero_grad(set_to_none=True)
            if self.scheduler is not None:
                self.scheduler.step()
        with prof.track_step("sync_gather"):
            if self.steps % self.gather_every == 0:
                self._gather(*_mean_over_micro_batches(losses))
        self.steps += 1

    def _gather(self, loss: torch.Tensor, terms: Mapping[str, torch.Tensor]) -> None:
        nan = torch.tensor(float("nan"), device=loss.device)
        rss, gpu = self.memory()
        values = torch.stack(
            [
                loss.detach().float(),
                terms.get("mse_loss", nan).float(),
                terms.get("ce_loss", nan).float(),
                torch.tensor(rss, device=loss.device),
                torch.tensor(gpu, device=loss.device),
            ]
        )
        rows = self.accelerator.gather(values[None]).tolist()  # (ranks, keys); the host sync
        self.gathered = [dict(zip(GATHERED_KEYS, row)) for row in rows]


def _mean_over_micro_batches(losses):
    """The step's loss and loss terms: their means over its micro-batches."""
    if len(losses) == 1:
        return losses[0]
    loss = torch.stack([loss for loss, _ in losses]).mean()
    terms = {key: torch.stack([t[key] for _, t in losses]).mean() for key in losses[0][1]}
    return loss, terms


class DataloaderStep:
    """One batch of the training dataloader, without a model: ``fetch``, ``decode``, ``h2d``.

    ``h2d`` is the host preprocessing and the copy to the device, exactly what
    ``dataload_wait`` adds to the fetch in :class:`TrainStep`. ``decode`` is the camera-frame
    decoding that ran in this process during the fetch (with 0 workers), taken out of
    ``fetch``'s time; with workers it runs in them and the region is absent.
    :attr:`decode_sec` and :attr:`decoded_frames` add up the decoding of every batch so far,
    wherever it ran (the samples' ``decode_time_sec``), and the camera frames decoded.
    """

    def __init__(self, batches: Iterator, preprocessor: Preprocessor, decoder: str | None = None) -> None:
        self.batches = batches
        self.preprocessor = preprocessor
        #: What decodes the frames (the dataset's ``decoder``: ``pyav``, ``pil``), for the reports.
        self.decoder = decoder
        self.decode_sec = 0.0
        self.decoded_frames = 0
        #: Whether the loader decodes in this process (no workers): then ``decode`` is measured.
        self.decodes_here = getattr(getattr(batches, "loader", None), "num_workers", None) == 0

    def __call__(self, prof) -> None:
        from scopebench.policy.dataset import decode_seconds
        from scopebench.policy.phases import DECODE_PHASE

        before = decode_seconds()
        with prof.track_step("fetch"):
            batch = next(self.batches)
        if self.decodes_here:
            prof.split_region("fetch", DECODE_PHASE, decode_seconds() - before)
        per_sample = batch.pop("decode_time_sec", None)
        if per_sample is not None:
            self.decode_sec += float(per_sample.sum())
            self.decoded_frames += per_sample.numel() * self.preprocessor.config.num_cameras
        with prof.track_step("h2d"):
            self.preprocessor.preprocess(batch)


class InferenceStep:
    """``sample_actions`` on one observation, split into its four phases.

    Args:
        runner: Preprocessing and the model's two stages.
        observation: A dataloader-style batch (actions, if any, are ignored).
        num_steps: Euler steps of the action expert (a call may override it).
        n_action_steps: Actions returned per call (None: the whole chunk).
        prefill: The prefill callable (default ``runner.model.prefill``; compiled by the
            run object when asked).
        denoise: The denoise callable ``(cache, noise, num_steps)``.
        compiled: The callables are ``torch.compile``d: each call starts a new CUDA-graph
            step (``reduce-overhead``), so the previous call's graph outputs may be reused.
    """

    def __init__(
        self,
        runner: PolicyRunner,
        observation: Mapping,
        *,
        num_steps: int,
        n_action_steps: int | None = None,
        prefill: Callable | None = None,
        denoise: Callable | None = None,
        compiled: bool = False,
    ) -> None:
        self.runner = runner
        self.compiled = compiled
        self.batch = {k: v for k, v in observation.items() if k not in ("actions", "action_is_pad")}
        self.num_steps = num_steps
        self.n_action_steps = n_action_steps
        self.prefill = prefill or runner.model.prefill
        self.denoise = denoise or runner.model.denoise

    @torch.inference_mode()
    def __call__(self, prof, num_steps: int | None = None) -> torch.Tensor:
        """One action chunk (B, n_action_steps, action_dim) in dataset units, on the CPU."""
        self.runner.model.eval()
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        with prof.track_step("preprocess"):
            obs = self.runner.preprocess(self.batch)
        with prof.track_step("prefill"):
            cache = self.prefill(obs)
        with prof.track_step("denoise"):
            actions = self.denoise(cache, None, num_steps or self.num_steps)
        with prof.track_step("postprocess"):
            actions = self.runner.postprocess(actions)
            return actions[:, : self.n_action_steps] if self.n_action_steps else actions


def validation_loss(model: Pi05Policy, batch: Mapping, stats: Mapping | None, seed: int = 0) -> float:
    """Training loss on ``batch`` with noise and times fixed by ``seed`` (comparable across steps)."""
    runner = PolicyRunner(model, stats=stats)
    obs = runner.preprocess(batch)
    gen = torch.Generator().manual_seed(seed)
    actions = obs["actions"]
    noise = torch.randn(actions.shape, generator=gen).to(actions.device)
    times = (torch.rand(actions.shape[0], generator=gen) * 0.999 + 0.001).to(actions.device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss, _ = model(obs, noise=noise, time=times)
    model.train(was_training)
    return float(loss)


def config_for_dataset(preset: str, dataset: RobotDataset, **overrides) -> Pi05Config:
    """The config of ``preset`` with cameras, chunk and padded state/action sizes that fit ``dataset``."""
    base = make_config(preset)
    sizes = dict(
        num_cameras=len(dataset.cameras),
        chunk_size=dataset.chunk_size,
        state_dim=max(base.state_dim, dataset.state_dim),
        action_dim=max(base.action_dim, dataset.action_dim),
    )
    return make_config(preset, **{**sizes, **overrides})


def policy_for_dataset(preset: str, dataset: RobotDataset, **overrides) -> Pi05Policy:
    """A randomly initialised policy with :func:`config_for_dataset`'s config."""
    config = config_for_dataset(preset, dataset, **overrides)
    return Pi05Policy(config).to(getattr(torch, config.dtype))
