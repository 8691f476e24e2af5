"""Plug-and-play proximal gradient on one or many ranks, built from plain parameters.

One iteration (the regions the profiler sees)::

    gradient:  z = x - gamma * A^T (A x - y)        # grad of f(x) = ||A x - y||^2 / 2
    denoise:   x = D_sigma(z)

With ``distribute_physics`` the operators are split across ranks
(``deepinv.distributed``: each rank applies its own ``A_i`` and one all-reduce sums
``A_i^T (A_i x - y_i)``); with ``distribute_denoiser`` the signal is cut into
``patch_size`` tiles (halo ``overlap``) that the ranks denoise in turn before an
all-reduce reassembles them. Tiling with one process (``patch_size`` without
``distribute_denoiser``) uses the same tiles locally, so one and many processes compute
the same thing.

The module knows nothing about benchopt or profiling: :meth:`PnPEngine.step` takes any
object with a ``track_step(name)`` context manager.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from scopebench.imaging.denoisers import DenoiserConfig, build_denoiser
from scopebench.imaging.problems import Problem

__all__ = ["INIT_METHODS", "COMPILE_MODES", "TASKS", "as_flag", "ReconstructionConfig", "PnPEngine", "resolve_device"]

INIT_METHODS = ("zeros", "adjoint", "pseudo_inverse")
COMPILE_MODES = ("none", "denoiser", "physics", "both")
#: ``pnp``: gradient + denoise iterations; ``denoise``: one denoiser pass per iteration.
TASKS = ("pnp", "denoise")
#: Seed of the power iteration, so every rank and every run gets the same step size.
_NORM_SEED = 1234


def as_flag(key: str, value: Any) -> bool:
    """A boolean parameter; ``"true"``/``"false"`` strings (benchopt's ``S[k=true]``) accepted.

    :Examples:
        >>> as_flag("distribute_physics", "True"), as_flag("distribute_physics", False)
        (True, False)
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{key} must be true or false, got {value!r}")


def _positive(key: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{key} must be a positive number{' or null' if allow_none else ''}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ReconstructionConfig:
    """Everything about a reconstruction except the problem and the process layout.

    Plain values only, so the config travels to spawned ranks as JSON
    (:meth:`to_kwargs`).
    """

    denoiser: str = "tv"
    """Denoiser name, see :mod:`scopebench.imaging.denoisers`."""
    denoiser_sigma: float = 0.05
    """Denoiser strength ``sigma`` in ``D_sigma``."""
    denoiser_weights: str | None = None
    """Local state-dict file of a learned denoiser."""
    pretrained: str = "auto"
    """``auto`` (weights file required for learned denoisers) or ``none`` (random)."""
    step_size: float | None = None
    """Gradient step ``gamma``; ``None`` = ``1 / ||A^T A||`` from a power iteration."""
    step_size_scale: float = 1.0
    """Factor applied to the step size (``gamma = scale * step``)."""
    init_method: str = "adjoint"
    """Initial estimate: ``zeros``, ``adjoint`` (``A^T y``) or ``pseudo_inverse``."""
    distribute_physics: bool = False
    """Split the operators across ranks."""
    distribute_denoiser: bool = False
    """Split the denoiser's tiles across ranks (needs ``patch_size``)."""
    patch_size: int | None = None
    """Tile side in pixels/voxels; ``None`` denoises the whole signal at once."""
    overlap: int = 8
    """Halo added around each tile (receptive field), in pixels/voxels."""
    max_batch_size: int | None = None
    """Tiles denoised per batch on a rank; ``None`` = all at once."""
    compile: str = "none"
    """``torch.compile`` the ``denoiser``, the ``physics`` gradient, ``both`` or ``none``."""
    device: str = "auto"
    """``auto`` (CUDA when available, one GPU per local rank), ``cpu`` or ``cuda``."""

    def __post_init__(self) -> None:
        self.denoiser_config()  # validates the four denoiser fields
        _positive("step_size", self.step_size, allow_none=True)
        if self.step_size is not None:
            object.__setattr__(self, "step_size", float(self.step_size))
        _positive("step_size_scale", self.step_size_scale)
        if self.init_method not in INIT_METHODS:
            raise ValueError(f"init_method must be one of {list(INIT_METHODS)}, got {self.init_method!r}")
        for key in ("distribute_physics", "distribute_denoiser"):
            object.__setattr__(self, key, as_flag(key, getattr(self, key)))
        for key, low in (("patch_size", 4), ("max_batch_size", 1)):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{key} must be an integer >= {low} or null, got {value!r}")
        if isinstance(self.overlap, bool) or not isinstance(self.overlap, int) or self.overlap < 0:
            raise ValueError(f"overlap must be a non-negative integer, got {self.overlap!r}")
        mode = "none" if self.compile is None else self.compile
        if mode not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {list(COMPILE_MODES)}, got {self.compile!r}")
        object.__setattr__(self, "compile", mode)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available on this machine")

    def denoiser_config(self) -> DenoiserConfig:
        return DenoiserConfig(
            name=self.denoiser, sigma=self.denoiser_sigma, weights=self.denoiser_weights, pretrained=self.pretrained
        )

    def to_kwargs(self) -> dict[str, Any]:
        """Plain JSON-serialisable fields (inverse: ``ReconstructionConfig(**kwargs)``)."""
        return dataclasses.asdict(self)


def resolve_device(setting: str, local_rank: int = 0) -> torch.device:
    """``cuda:<local_rank mod visible GPUs>`` for ``auto``/``cuda`` when CUDA exists, else CPU."""
    if setting != "cpu" and torch.cuda.is_available():
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    return torch.device("cpu")


class PnPEngine:
    """One rank's share of a PnP reconstruction (or of repeated denoiser passes).

    Build order matters: the denoiser's weights and the step size are computed before
    entering ``DistributedContext`` (which reseeds each rank differently), so every rank
    holds the same weights and step.

    Args:
        problem: The problem, rebuilt on this rank from plain parameters.
        config: The reconstruction settings.
        local_rank: Rank on this node (selects the GPU).
    """

    def __init__(
        self,
        problem: Problem,
        config: ReconstructionConfig,
        local_rank: int = 0,
        task: str = "pnp",
        count_cost: bool = False,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {task!r}")
        if task == "denoise" and config.distribute_physics:
            raise ValueError("distribute_physics has no meaning for denoiser-only runs (task='denoise')")
        self.config = config
        self.task = task
        self.device = resolve_device(config.device, local_rank)
        self.problem = problem.to(self.device)
        self.sigma = config.denoiser_sigma
        base = build_denoiser(config.denoiser_config(), problem.channels, problem.spatial_dims).to(self.device)
        self.base_denoiser = base
        if task == "pnp":
            self.gamma = config.step_size_scale * (config.step_size or 1.0 / self.lipschitz())
            self.x0 = self.initial_estimate()
        else:
            self.gamma = None
            self.x0 = self.problem.noisy_image().to(self.device)
        self.ctx = self._enter_context()
        self._build_operators(base)
        self.cost: dict[str, int | None] = {}
        if count_cost:
            self._count_denoiser_cost()
        self.compile_time_sec: float | None = None
        if config.compile != "none":
            self._compile()
        self.x = self.x0.clone()

    # -- set-up ---------------------------------------------------------------------
    def lipschitz(self) -> float:
        """``||A^T A||_2`` of the full (undistributed) operator, by a seeded power iteration."""
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(_NORM_SEED)
            x = torch.zeros_like(self.problem.x_true)
            value = float(self.problem.physics.compute_sqnorm(x, max_iter=200, tol=1e-5, verbose=False))
        if not value > 0:
            raise ValueError(f"the operator's norm estimate is {value}; cannot derive a step size")
        return value

    def initial_estimate(self) -> torch.Tensor:
        """``x_0`` from ``init_method`` (computed identically on every rank)."""
        physics, y = self.problem.physics, self.problem.y
        with torch.no_grad():
            if self.config.init_method == "zeros":
                x0 = torch.zeros_like(self.problem.x_true)
            elif self.config.init_method == "adjoint":
                x0 = physics.A_adjoint(y)
            else:
                x0 = physics.A_dagger(y)
        return x0.reshape(self.problem.x_true.shape).contiguous()

    def _enter_context(self):
        import torch.distributed as dist
        from deepinv.distributed import DistributedContext

        grouped = dist.is_available() and dist.is_initialized()
        ctx = DistributedContext(device_mode="cpu" if self.device.type == "cpu" else "gpu")
        self._entered = grouped
        if grouped:
            # Reuses the group DistSession created (and leaves its teardown to it).
            ctx.__enter__()
        ctx.device = self.device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        return ctx

    def _build_operators(self, base: torch.nn.Module) -> None:
        import deepinv as dinv
        from deepinv.distributed import distribute

        cfg = self.config
        if cfg.distribute_physics:
            self.physics = distribute(list(self.problem.operators), self.ctx, type_object="linear_physics")
            self.fidelity = distribute(dinv.optim.L2(), self.ctx)
        else:
            self.physics = self.problem.physics
            self.fidelity = dinv.optim.L2()
        if cfg.patch_size is None:
            self.denoiser = base
            self.num_patches = 1
        else:
            # Without distribute_denoiser every rank tiles the whole signal itself: a
            # context that was never entered has world size 1 and no group.
            tile_ctx = self.ctx if cfg.distribute_denoiser else _local_context(self.device)
            dims = tuple(range(-self.problem.spatial_dims, 0))
            self.denoiser = distribute(
                base,
                tile_ctx,
                type_object="denoiser",
                patch_size=cfg.patch_size,
                overlap=cfg.overlap,
                tiling_dims=dims,
                max_batch_size=cfg.max_batch_size,
            )
            self.num_patches = None  # known after the first call (deepinv builds tiles lazily)
        self._grad = self._gradient_fn
        self._denoise = self._denoise_fn

    def _gradient_fn(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.gamma * self.fidelity.grad(x, self.problem.y, self.physics)

    def _denoise_fn(self, z: torch.Tensor) -> torch.Tensor:
        return self.denoiser(z, self.sigma)

    def _compile(self) -> None:
        mode = self.config.compile
        if mode in ("denoiser", "both"):
            compiled = torch.compile(self.base_denoiser)
            if self.config.patch_size is None:
                self.denoiser = compiled
            else:
                self.denoiser.processor = compiled
        if mode in ("physics", "both"):
            self._grad = torch.compile(self._gradient_fn)
        # The first call compiles: time it here, once, so iterations are steady state.
        start = time.perf_counter()
        with torch.no_grad():
            self._denoise(self._grad(self.x0) if self.task == "pnp" else self.x0)
        self._sync()
        self.compile_time_sec = time.perf_counter() - start
        self._reset_denoiser_state()

    def _count_denoiser_cost(self) -> None:
        # Counted eagerly (before any torch.compile) on every rank, then summed: the
        # total work of one pass over the whole signal, halos of the tiles included.
        from scopebench.dist import gather_objects
        from scopebench.imaging.cost import count_cost

        local = count_cost(lambda: self._denoise_fn(self.x0))
        per_rank = gather_objects(local)
        flops = [c["flops"] for c in per_rank]
        self.cost = {
            "flops": None if any(f is None for f in flops) else sum(flops),
            "bytes": sum(c["bytes"] for c in per_rank),
        }
        self._reset_denoiser_state()

    def _reset_denoiser_state(self) -> None:
        # TV keeps its primal/dual variables between calls (warm restart); a set-up call
        # must not leak into the first timed iteration.
        if hasattr(self.base_denoiser, "restart"):
            self.base_denoiser.restart = True

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Leave the ``DistributedContext`` (it never destroys a group it did not create)."""
        if getattr(self, "_entered", False):
            self._entered = False
            self.ctx.__exit__(None, None, None)

    # -- iterations -----------------------------------------------------------------
    @torch.no_grad()
    def step(self, profiler: Any) -> torch.Tensor:
        """One PnP iteration on ``self.x`` with regions ``gradient`` and ``denoise``."""
        with profiler.track_step("gradient"):
            z = self._grad(self.x)
        with profiler.track_step("denoise"):
            self.x = self._denoise(z)
        return self.x

    @torch.no_grad()
    def denoise_once(self, noisy: torch.Tensor, profiler: Any) -> torch.Tensor:
        """One denoiser pass over ``noisy`` (region ``denoise``), stored in ``self.x``."""
        with profiler.track_step("denoise"):
            self.x = self._denoise(noisy)
        return self.x

    def static_metrics(self) -> dict[str, Any]:
        """Set-up facts repeated on every row (``None`` values are left out)."""
        tiles = getattr(self.denoiser, "num_patches", self.num_patches)
        out = {
            "step_size": float(self.gamma) if self.gamma is not None else None,
            "world_size": int(self.ctx.world_size if self.ctx.use_dist else 1),
            "num_patches": int(tiles) if tiles is not None else None,
            "compile_time_sec": self.compile_time_sec,
            "flops_per_iter": self.cost.get("flops"),
            "bytes_per_iter": self.cost.get("bytes"),
        }
        return {k: v for k, v in out.items() if v is not None}


def _local_context(device: torch.device):
    """A ``DistributedContext`` that is never entered: world size 1, no collectives."""
    from deepinv.distributed import DistributedContext

    ctx = DistributedContext(device_mode="cpu" if device.type == "cpu" else "gpu")
    ctx.device = device
    return ctx
