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

from scopebench.distributed.device import check_device, resolve_device
from scopebench.imaging.common.denoisers import DenoiserConfig, build_denoiser
from scopebench.imaging.inference.problems import Problem, build_problem
from scopebench.validate import choice, flag, integer, number, optional

__all__ = [
    "COMPILE_MODES",
    "INIT_METHODS",
    "PNP_ONLY",
    "TASKS",
    "PnPEngine",
    "ReconstructionConfig",
    "as_flag",
    "build_engine",
    "run_loop",
]

INIT_METHODS = ("zeros", "adjoint", "pseudo_inverse")
COMPILE_MODES = ("none", "denoiser", "physics", "both")
#: ``pnp``: gradient + denoise iterations; ``denoise``: one denoiser pass per iteration.
TASKS = ("pnp", "denoise")
#: Fields of :class:`ReconstructionConfig` that only the ``pnp`` task reads (the gradient
#: step, the start, the operators' split): the ``Denoiser`` solver has no such parameters.
PNP_ONLY = ("step_size", "step_size_scale", "init_method", "distribute_physics")
#: Seed of the power iteration, so every rank and every run gets the same step size.
_NORM_SEED = 1234


def as_flag(key: str, value: Any) -> bool:
    """A boolean parameter; ``"true"``/``"false"`` strings (benchopt's ``S[k=true]``) accepted.

    :Examples:
        >>> as_flag("distribute_physics", "True"), as_flag("distribute_physics", False)
        (True, False)
    """
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return flag(key, value)


@dataclass(frozen=True, kw_only=True)
class ReconstructionConfig:
    """Everything about a reconstruction except the problem and the process layout.

    Plain values only, so the config travels to spawned ranks as JSON
    (:meth:`to_kwargs`).
    """

    # The four denoiser defaults are DenoiserConfig's (one source; the solvers' grids come
    # from this class through scopebench.parameters).
    denoiser: str = DenoiserConfig.name
    """Denoiser name, see :mod:`scopebench.imaging.common.denoisers`."""
    denoiser_sigma: float = DenoiserConfig.sigma
    """Denoiser strength ``sigma`` in ``D_sigma`` (:attr:`DenoiserConfig.sigma`: 0.01)."""
    denoiser_weights: str | None = DenoiserConfig.weights
    """Local state-dict file of a learned denoiser."""
    pretrained: str = DenoiserConfig.pretrained
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
        def put(key: str, value: Any) -> None:
            object.__setattr__(self, key, value)

        # the four denoiser fields, validated once (the weights file read once): the engine's too
        denoiser = DenoiserConfig(
            name=self.denoiser, sigma=self.denoiser_sigma, weights=self.denoiser_weights, pretrained=self.pretrained
        )
        put("_denoiser", denoiser)
        put("step_size", optional(number, "step_size", self.step_size, low=0, low_open=True))
        put("step_size_scale", number("step_size_scale", self.step_size_scale, low=0, low_open=True))
        choice("init_method", self.init_method, INIT_METHODS)
        for key in ("distribute_physics", "distribute_denoiser"):
            put(key, as_flag(key, getattr(self, key)))
        optional(integer, "patch_size", self.patch_size, low=4)
        optional(integer, "max_batch_size", self.max_batch_size, low=1)
        integer("overlap", self.overlap, low=0)
        if self.patch_size is not None and self.overlap >= self.patch_size:
            raise ValueError(
                f"overlap={self.overlap} must be smaller than patch_size={self.patch_size}: "
                "each tile would carry a halo at least as wide as itself"
            )
        put("compile", choice("compile", "none" if self.compile is None else self.compile, COMPILE_MODES))
        check_device("device", self.device)

    def denoiser_config(self) -> DenoiserConfig:
        """The validated :class:`DenoiserConfig` of the four denoiser fields (built once, with this config)."""
        return self._denoiser

    def to_kwargs(self) -> dict[str, Any]:
        """Plain JSON-serialisable fields (inverse: ``ReconstructionConfig(**kwargs)``)."""
        return dataclasses.asdict(self)


class PnPEngine:
    """One rank's share of a PnP reconstruction (or of repeated denoiser passes).

    Build order matters: the denoiser's weights and the step size are computed before
    entering ``DistributedContext`` (which reseeds each rank differently), so every rank
    holds the same weights and step.

    Args:
        problem: The problem, rebuilt on this rank from plain parameters.
        config: The reconstruction settings.
        device: Where this rank computes; ``None``: from ``config.device`` (rank 0's GPU).
        task: ``pnp`` or ``denoise`` (:data:`TASKS`).
        count_cost: Count one denoiser pass's FLOPs and bytes at set-up.
    """

    def __init__(
        self,
        problem: Problem,
        config: ReconstructionConfig,
        device: torch.device | None = None,
        task: str = "pnp",
        count_cost: bool = False,
    ) -> None:
        choice("task", task, TASKS)
        if task == "denoise" and config.distribute_physics:
            raise ValueError("distribute_physics has no meaning for denoiser-only runs (task='denoise')")
        self.config = config
        self.task = task
        self.device = device if device is not None else resolve_device(config.device)
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
        from scopebench.distributed import gather_objects
        from scopebench.imaging.inference.cost import count_cost

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
    def iteration(self, profiler: Any) -> torch.Tensor:
        """One iteration of the engine's task: :meth:`step` or :meth:`denoise_once` of ``x0``."""
        return self.step(profiler) if self.task == "pnp" else self.denoise_once(self.x0, profiler)

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


def build_engine(
    spec: dict[str, Any], config: ReconstructionConfig, task: str = "pnp", device: torch.device | None = None
) -> PnPEngine:
    """An engine from the problem's plain parameters and a validated config (identical on every
    rank: a spawned rank rebuilds the config from :meth:`ReconstructionConfig.to_kwargs` once, at
    its edge); counts cost for ``denoise``."""
    spec = dict(spec)
    problem = build_problem(spec.pop("kind"), **spec)
    return PnPEngine(problem, config, device=device, task=task, count_cost=task == "denoise")


def run_loop(engine: PnPEngine, profiler: Any, callback: Any = None) -> None:
    """``engine.iteration`` until ``callback`` says stop (a bare loop, for scripts; runs use ``PnPRun``)."""
    for _ in profiler.iterate(callback):
        engine.iteration(profiler)
