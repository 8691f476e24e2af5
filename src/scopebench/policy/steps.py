"""One training step and one action-chunk inference, in named phases.

The solvers of the policy benchmark (repository root) call these with a profiler; the
phase names follow the upstream ``profile_step`` breakdown: ``dataload_wait``,
``forward``, ``bwd``, ``unscale_clip``, ``optim_step``, ``zero_grad_sched`` for training
and ``preprocess``, ``prefill``, ``denoise``, ``postprocess`` for inference. The model
itself never sees the profiler (STYLE.md rule 3).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from scopebench.policy.data import SyntheticRobotConfig, write_synthetic_dataset
from scopebench.policy.dataset import RobotDataset, make_dataloader
from scopebench.policy.model import Pi05Policy
from scopebench.policy.runner import PolicyRunner

__all__ = [
    "cached_synthetic_dataset",
    "fixed_eval_batch",
    "policy_for_dataset",
    "InferenceStep",
    "TrainStep",
    "validation_loss",
]

TRAIN_PHASES = ("dataload_wait", "forward", "bwd", "unscale_clip", "optim_step", "zero_grad_sched")
INFERENCE_PHASES = ("preprocess", "prefill", "denoise", "postprocess")


def cached_synthetic_dataset(cache_dir: str | Path, config: SyntheticRobotConfig) -> Path:
    """Write the synthetic dataset once per config under ``cache_dir`` and reuse it.

    The folder is written beside its final name and renamed, so an interrupted write
    never leaves a dataset that looks complete.
    """
    key = hashlib.sha1(json.dumps(vars(config), sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) / f"synthetic_robot_{key}"
    if (root / "meta" / "info.json").is_file():
        return root
    tmp = root.with_name(f".{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write_synthetic_dataset(tmp, config)
        try:
            os.replace(tmp, root)
        except OSError:  # another process finished first: keep its copy
            if not (root / "meta" / "info.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def fixed_eval_batch(dataset: RobotDataset, batch_size: int) -> dict:
    """The first ``batch_size`` frames, evenly spread over the dataset (deterministic)."""
    from scopebench.policy.dataset import collate_robot_batch

    if not 1 <= batch_size <= len(dataset):
        raise ValueError(f"eval batch size must be in [1, {len(dataset)}], got {batch_size}")
    step = len(dataset) // batch_size
    return collate_robot_batch([dataset[i * step] for i in range(batch_size)])


class TrainStep:
    """AdamW training of the policy on a dataloader, one call = one optimizer step.

    Args:
        model: the policy (its parameters' device is used).
        dataset: training data.
        batch_size: samples per step.
        learning_rate: AdamW learning rate.
        grad_clip: max global gradient norm (``clip_grad_norm_``); 0 disables clipping.
        num_workers: dataloader worker processes.
        seed: sampler seed.
    """

    def __init__(
        self,
        model: Pi05Policy,
        dataset: RobotDataset,
        *,
        batch_size: int,
        learning_rate: float,
        grad_clip: float = 1.0,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        if learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        if grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0, got {grad_clip}")
        self.model = model
        self.runner = PolicyRunner(model, stats=dataset.stats)
        self.grad_clip = grad_clip
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=learning_rate)
        self.loader = make_dataloader(
            dataset, batch_size, seed=seed, num_workers=num_workers, persistent_workers=num_workers > 0
        )
        self._iter = iter(self.loader)
        self.last_loss: float | None = None
        self.batch_size = batch_size

    def _next_batch(self) -> Mapping:
        try:
            return next(self._iter)
        except StopIteration:  # a new epoch
            self._iter = iter(self.loader)
            return next(self._iter)

    def __call__(self, prof) -> float:
        """One step; each phase is a profiler region. Returns the loss."""
        self.model.train()
        with prof.track_step("dataload_wait"):
            batch = self._next_batch()
        with prof.track_step("forward"):
            loss, _ = self.model(self.runner.preprocess(batch))
        with prof.track_step("bwd"):
            loss.backward()
        with prof.track_step("unscale_clip"):
            if self.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        with prof.track_step("optim_step"):
            self.optimizer.step()
        with prof.track_step("zero_grad_sched"):
            self.optimizer.zero_grad(set_to_none=True)
        self.last_loss = float(loss.detach())
        return self.last_loss


class InferenceStep:
    """``sample_actions`` on one fixed batch, split into its four phases.

    Args:
        model: the policy.
        batch: a dataloader batch (observations; actions are ignored).
        num_steps: Euler steps of the action expert.
        stats: dataset statistics for (un)normalisation.
    """

    def __init__(self, model: Pi05Policy, batch: Mapping, *, num_steps: int, stats: Mapping | None = None) -> None:
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
        self.runner = PolicyRunner(model, stats=stats)
        self.batch = {k: v for k, v in batch.items() if k not in ("actions", "action_is_pad")}
        self.num_steps = num_steps
        self.model = model

    @torch.inference_mode()
    def __call__(self, prof) -> torch.Tensor:
        """One action chunk per batch element (B, chunk, action_dim), dataset units."""
        self.model.eval()
        with prof.track_step("preprocess"):
            obs = self.runner.preprocess(self.batch)
        with prof.track_step("prefill"):
            cache = self.runner.prefill(obs)
        with prof.track_step("denoise"):
            actions = self.runner.denoise(cache, num_steps=self.num_steps)
        with prof.track_step("postprocess"):
            return self.runner.postprocess(actions, action_dim=self.action_dim)

    @property
    def action_dim(self) -> int | None:
        stats = self.runner.stats.get("action")
        return None if stats is None else stats[0].numel()


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


def policy_for_dataset(preset: str, dataset: RobotDataset, **overrides):
    """A policy of ``preset`` whose cameras, chunk and padded state/action sizes fit ``dataset``."""
    from scopebench.policy import make_config, make_policy

    base = make_config(preset)
    sizes = dict(
        num_cameras=len(dataset.cameras),
        chunk_size=dataset.chunk_size,
        state_dim=max(base.state_dim, dataset.state_dim),
        action_dim=max(base.action_dim, dataset.action_dim),
    )
    return make_policy(preset, **{**sizes, **overrides})
