"""Supervised training of unrolled PnP networks, one optimizer step per iteration.

:class:`UnrolledTrainer` holds the model, its optimizer and the batch order; ``step``
runs one training step in three regions, ``forward`` (unrolled network + MSE),
``backward`` (gradients, synchronised across ranks when the model is distributed) and
``optimizer_step`` (gradient clipping, Adam, then step sizes and noise levels projected
onto positive values). What a run needs around it on every rank (process group, deepinv
context, loop, spawned workers) is :class:`scopebench.imaging.training.run.TrainingRun`.

Validation is not part of a step: the objective scores :meth:`UnrolledTrainer.reconstructor`
inside benchopt's callback (reported as ``callback_time_sec``), on rank 0 only, with the
plain (untiled) network that shares the trained weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scopebench.imaging.common.denoisers import DenoiserSpec
from scopebench.imaging.common.weights import save_denoiser_weights
from scopebench.imaging.training.data import TrainingData
from scopebench.imaging.training.unrolled import UnrolledConfig, build_unrolled, unrolled_parameters
from scopebench.parameters import defaults
from scopebench.validate import check_batch_fits, flag, integer, number, optional

__all__ = [
    "REGIONS",
    "SOLVER_PARAMS",
    "TrainConfig",
    "UnrolledReconstructor",
    "UnrolledTrainer",
    "configs_from_params",
    "evaluate_reconstruction",
    "solver_defaults",
]

REGIONS = ("forward", "backward", "optimizer_step")
_MIN_POSITIVE = 1e-4


class _NoRegions:
    """Stands in for a profiler in a bare loop: regions cost nothing."""

    _null = contextlib.nullcontext()

    def track_step(self, name: str) -> contextlib.nullcontext:
        return self._null


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How the unrolled network is trained and distributed; validated when built."""

    batch_size: int = 4
    """Training pairs per optimizer step (every rank sees the same batch)."""
    learning_rate: float = 1e-2
    """Adam learning rate of the unrolled step sizes and noise levels."""
    model_learning_rate: float = 1e-3
    """Adam learning rate of the denoiser weights."""
    grad_clip: float | None = 1.0
    """Maximum global gradient norm (``clip_grad_norm_``); ``None`` disables clipping."""
    distribute_model: bool = False
    """Tile the denoiser over the ranks with ``deepinv.distributed`` (also on one rank)."""
    patch_size: int = 16
    """Side of a tile (pixels), used with ``distribute_model``."""
    overlap: int = 8
    """Tile margin on each side (pixels): at least the denoiser's receptive-field radius
    for tiles to agree with the whole image away from its borders."""
    max_batch_size: int | None = None
    """Tiles per denoiser call on a rank; ``None``: all of a rank's tiles at once."""
    seed: int = 0
    """Seed of the initial weights and of the batch order (identical on every rank)."""

    def __post_init__(self) -> None:
        def put(key: str, value: Any) -> None:
            object.__setattr__(self, key, value)

        integer("batch_size", self.batch_size, low=1)
        put("learning_rate", number("learning_rate", self.learning_rate, low=0))
        put("model_learning_rate", number("model_learning_rate", self.model_learning_rate, low=0))
        put("grad_clip", optional(number, "grad_clip", self.grad_clip, low=0, low_open=True))
        flag("distribute_model", self.distribute_model)
        integer("patch_size", self.patch_size, low=1)
        integer("overlap", self.overlap, low=0)
        if self.distribute_model and self.overlap >= self.patch_size:
            raise ValueError(
                f"overlap={self.overlap} must be smaller than patch_size={self.patch_size}: "
                "each tile would carry a halo at least as wide as itself"
            )
        optional(integer, "max_batch_size", self.max_batch_size, low=1)
        integer("seed", self.seed, low=0)

    def check_data(self, spec) -> None:
        """Reject settings that cannot run on the training set ``spec`` (``ValueError``)."""
        # Every rank draws the same batch from the whole set (world_size 1), without repeats.
        check_batch_fits(self.batch_size, spec.n_train, dataset="the training set", larger="a larger n_train")
        if self.distribute_model and self.patch_size > spec.image_size:
            raise ValueError(
                f"patch_size={self.patch_size} is larger than the image (image_size={spec.image_size}); "
                f"use patch_size <= {spec.image_size}"
            )


#: Solver parameters that :func:`configs_from_params` turns into the two configs.
SOLVER_PARAMS = (
    "n_unrolled",
    "denoiser",
    "denoiser_channels",
    "checkpoint_batches",
    "batch_size",
    "learning_rate",
    "model_learning_rate",
    "grad_clip",
    "distribute_model",
    "patch_size",
    "overlap",
    "max_batch_size",
)


#: Solver parameters named otherwise in the architecture: (dataclass, field) that validates each.
_RENAMED = {
    "n_unrolled": (UnrolledConfig, "n_unrolled"),
    "denoiser": (DenoiserSpec, "denoiser"),
    "denoiser_channels": (DenoiserSpec, "channels"),
    "checkpoint_batches": (UnrolledConfig, "checkpoint"),
}


def solver_defaults() -> dict[str, list[Any]]:
    """:data:`SOLVER_PARAMS` as a benchopt grid of their defaults, taken from the dataclasses
    that validate them (:class:`UnrolledConfig`, :class:`DenoiserSpec`, :class:`TrainConfig`),
    so the ``UnrolledPnP`` solver and the library cannot drift apart (issue 34).

    :Examples:

    >>> solver_defaults()["denoiser_channels"], solver_defaults()["batch_size"]
    ([16], [4])
    """
    train = defaults(TrainConfig)
    grid = {key: [defaults(cls)[name]] for key, (cls, name) in _RENAMED.items()}
    grid.update((key, [train[key]]) for key in SOLVER_PARAMS if key in train)
    return {key: grid[key] for key in SOLVER_PARAMS}


def configs_from_params(spec: Any, **params: Any) -> tuple[UnrolledConfig, TrainConfig]:
    """Validated architecture and training configs from flat solver parameters.

    Args:
        spec: The :class:`~scopebench.imaging.training.data.TrainingDataSpec` trained on
            (channels, dimension, sizes and seed come from it).
        **params: Exactly the keys of :data:`SOLVER_PARAMS`.

    Raises:
        ValueError: a bad value, or a combination the data cannot run (batch larger than
            the training set, tile larger than the image).
    """
    missing, unknown = set(SOLVER_PARAMS) - set(params), set(params) - set(SOLVER_PARAMS)
    if missing or unknown:
        raise ValueError(
            f"expected parameters {sorted(SOLVER_PARAMS)}; missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    denoiser = DenoiserSpec(
        denoiser=params["denoiser"],
        channels=params["denoiser_channels"],
        in_channels=spec.channels,
        out_channels=spec.channels,
        dim=spec.spatial_dims,
    )
    unrolled = UnrolledConfig(
        n_unrolled=params["n_unrolled"], denoiser=denoiser, checkpoint=params["checkpoint_batches"]
    )
    train = TrainConfig(
        seed=spec.seed,
        **{key: params[key] for key in SOLVER_PARAMS if key in {f.name for f in dataclasses.fields(TrainConfig)}},
    )
    train.check_data(spec)
    return unrolled, train


class UnrolledReconstructor:
    """Inference snapshot of a trained network: the shared denoiser and the step sizes /
    noise levels of the moment, run as deepinv's (non-trainable) PGD under ``no_grad``."""

    def __init__(self, denoiser: torch.nn.Module, stepsize: list[float], sigma: list[float]) -> None:
        self.denoiser = denoiser
        self.stepsize = list(stepsize)
        self.sigma = list(sigma)

    def __call__(self, y: torch.Tensor, physics: Any) -> torch.Tensor:
        import deepinv as dinv

        model = dinv.optim.PGD(
            data_fidelity=dinv.optim.L2(),
            prior=dinv.optim.PnP(self.denoiser),
            stepsize=self.stepsize,
            sigma_denoiser=self.sigma,
            max_iter=len(self.stepsize),
        )
        with torch.no_grad():
            return model(y, physics)


class UnrolledTrainer:
    """One unrolled network, its Adam optimizer (two parameter groups) and its batch order.

    Args:
        data: Training and validation pairs (moved to ``device``).
        unrolled: Architecture.
        train: Optimisation and distribution settings.
        device: Where the model and data live.
    """

    def __init__(self, data: TrainingData, unrolled: UnrolledConfig, train: TrainConfig, device: Any = "cpu") -> None:
        train.check_data(data.spec)
        spec = data.spec
        if (unrolled.denoiser.in_channels, unrolled.denoiser.dim) != (spec.channels, spec.spatial_dims):
            raise ValueError(
                f"denoiser expects {unrolled.denoiser.in_channels} channel(s) in {unrolled.denoiser.dim}-D, "
                f"the data has {spec.channels} channel(s) in {spec.spatial_dims}-D"
            )
        self.device = torch.device(device)
        self.data = data.to(self.device)
        self.unrolled = unrolled
        self.train = train
        # Same weights on every rank, whatever else consumed the global RNG before.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(train.seed)
            self.denoiser = unrolled.denoiser.build(device=self.device)
        wrap = unrolled.checkpoint == "always" and not train.distribute_model
        self.model = build_unrolled(unrolled, self.denoiser, wrap_checkpoint=wrap).to(self.device)
        self.physics = data.physics
        self._measurements: Callable[[torch.Tensor], Any] = lambda y: y
        self.params = list(self.model.parameters())
        groups = [
            {"params": unrolled_parameters(self.model), "lr": train.learning_rate, "name": "unrolled"},
            {"params": list(self.denoiser.parameters()), "lr": train.model_learning_rate, "name": "denoiser"},
        ]
        assert sum(len(g["params"]) for g in groups) == len(self.params), "a trainable parameter has no group"
        self.optimizer = torch.optim.Adam(groups)
        # Step sizes and noise levels only make sense positive: project after each update.
        self._positive = groups[0]["params"]
        self._gen = torch.Generator().manual_seed(train.seed)
        self._order = torch.empty(0, dtype=torch.long)
        self._cursor = 0
        self.step_count = 0
        self.last_loss: torch.Tensor | None = None
        self.last_grad_norm: torch.Tensor | None = None

    # -- distribution ---------------------------------------------------------------
    def distribute(self, ctx) -> None:
        """Tile the denoiser over the ranks of deepinv ``ctx`` (in place); also on one rank.

        Each rank denoises its share of the tiles; gradients of the shared weights, step
        sizes and noise levels are averaged across ranks in the backward pass.
        """
        from deepinv.distributed import distribute
        from deepinv.utils.tensorlist import TensorList

        dims = self.data.spec.spatial_dims
        distribute(
            self.model,
            ctx,
            patch_size=self.train.patch_size,
            overlap=self.train.overlap,
            tiling_dims=tuple(range(-dims, 0)),
            max_batch_size=self.train.max_batch_size,
            checkpoint_batches=self.unrolled.checkpoint,
        )
        self.physics = distribute([self.data.physics], ctx, type_object="linear_physics")
        self._measurements = lambda y: TensorList([y])

    # -- one step -------------------------------------------------------------------
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``batch_size`` pairs of a seeded shuffle (a new one every epoch)."""
        b, n = self.train.batch_size, self.data.x_train.shape[0]
        if self._cursor + b > self._order.numel():
            self._order, self._cursor = torch.randperm(n, generator=self._gen), 0
        idx = self._order[self._cursor : self._cursor + b].to(self.device)
        self._cursor += b
        return self.data.x_train[idx], self.data.y_train[idx]

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Training loss ``mean((f_theta(y) - x)^2)`` of the unrolled network on a batch (with graph)."""
        x_hat = self.model(self._measurements(y), self.physics)
        return torch.nn.functional.mse_loss(x_hat, x)

    def step(self, regions: Any = None) -> torch.Tensor:
        """One optimizer step in regions ``forward``, ``backward``, ``optimizer_step``.

        Args:
            regions: Anything with ``track_step(name)`` (a profiler); ``None``: no regions.

        Returns:
            The step's training loss (MSE of the batch, before the update), detached.
        """
        regions = regions or _NoRegions()
        x, y = self.next_batch()
        with regions.track_step("forward"):
            loss = self.loss(x, y)
        with regions.track_step("backward"):
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with regions.track_step("optimizer_step"):
            if self.train.grad_clip is not None:
                self.last_grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.train.grad_clip)
            self.optimizer.step()
            with torch.no_grad():
                for p in self._positive:
                    p.clamp_(min=_MIN_POSITIVE)
        self.last_loss = loss.detach()
        self.step_count += 1
        return self.last_loss

    # -- results --------------------------------------------------------------------
    def reconstructor(self) -> UnrolledReconstructor:
        """The network as it is now, for evaluation on this rank alone."""
        stepsize = [p.detach().item() for p in self.model.params_algo["stepsize"]]
        sigma = [p.detach().item() for p in self.model.params_algo["g_param"]]
        return UnrolledReconstructor(self.denoiser, stepsize, sigma)

    def save_weights(self, path: str | Path) -> Path:
        """Write the denoiser (and the trained step sizes / noise levels) as safetensors."""
        snapshot = self.reconstructor()
        extra = {
            "unrolled_stepsize": snapshot.stepsize,
            "unrolled_sigma": snapshot.sigma,
            "train_steps": self.step_count,
            "training_data": self.data.spec.to_dict(),
        }
        return save_denoiser_weights(path, self.denoiser, self.unrolled.denoiser, extra=extra)


def evaluate_reconstruction(
    model: Callable, x: torch.Tensor, y: torch.Tensor, physics: Any, chunk: int = 16
) -> dict[str, float | None]:
    """Quality of ``model(y, physics)`` against ``x``: the mean over signals of each one's
    PSNR (dB, peak 1), SSIM and MSE, as :func:`scopebench.imaging.common.metrics.quality_metrics`
    defines them for the whole suite. ``val_ssim`` is ``None`` for volumes (2-D only).
    """
    from scopebench.imaging.common.metrics import quality_metrics

    scores: dict[str, list[float]] = {"psnr": [], "ssim": [], "mse": []}
    with torch.no_grad():
        for start in range(0, x.shape[0], chunk):
            xs, ys = x[start : start + chunk], y[start : start + chunk]
            x_hat = model(ys, physics)
            for i in range(xs.shape[0]):
                for key, value in quality_metrics(x_hat[i : i + 1], xs[i : i + 1]).items():
                    scores[key].append(value)
    return {f"val_{key}": (sum(values) / len(values) if values else None) for key, values in scores.items()}
