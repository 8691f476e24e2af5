"""Solver behaviour shared by benchmark_inference's ``PnP`` and ``Denoiser`` (no benchopt).

``class Solver(ImagingSolverMixin, BaseSolver)`` gets the parameters, ``skip`` (layouts
and optional packages that cannot run are declined with a reason), ``set_objective``
(invalid values raise ``ValueError`` before anything starts), ``pre_run_hook`` (starts
the ranks and builds the engine, untimed), ``run`` (the profiled loop; ranks are torn
down in ``finally``) and ``get_result``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.imaging.denoisers import denoiser_unavailable
from scopebench.imaging.pnp import ReconstructionConfig
from scopebench.imaging.problems import describe_problem
from scopebench.imaging.topology import Topology, check_topology
from scopebench.profiler import ProfiledSolverMixin

__all__ = ["ImagingSolverMixin", "DENOISER_PARAMETERS", "PNP_PARAMETERS"]

#: Parameters of both solvers (benchopt grids: one list of values per name).
DENOISER_PARAMETERS: dict[str, list[Any]] = {
    **ProfiledSolverMixin.parameters,
    "denoiser": ["tv"],
    "denoiser_sigma": [0.01],
    "denoiser_weights": [None],
    "pretrained": ["auto"],
    "patch_size": [None],
    "overlap": [8],
    "max_batch_size": [None],
    "compile": ["none"],
    "distribute_denoiser": [False],
    "nproc_per_node": [1],
    "slurm_gres": [None],
    "slurm_nodes": [1],
    "slurm_ntasks_per_node": [None],
    "device": ["auto"],
}

#: The PnP solver's parameters: the above plus the gradient step and physics split.
PNP_PARAMETERS: dict[str, list[Any]] = {
    **DENOISER_PARAMETERS,
    "step_size": [None],
    "step_size_scale": [1.0],
    "init_method": ["adjoint"],
    "distribute_physics": [False],
}

_CONFIG_KEYS = (
    "denoiser",
    "denoiser_sigma",
    "denoiser_weights",
    "pretrained",
    "step_size",
    "step_size_scale",
    "init_method",
    "distribute_physics",
    "distribute_denoiser",
    "patch_size",
    "overlap",
    "max_batch_size",
    "compile",
    "device",
)


class ImagingSolverMixin(ProfiledSolverMixin):
    """Benchopt-free half of an imaging solver; the solver file sets ``task``/``output_dir``."""

    task: str = "pnp"
    """``pnp`` (gradient + denoise) or ``denoise`` (one denoiser pass per iteration)."""
    output_dir: str | Path = "outputs"
    """Where per-rank profiler files go (the benchmark's ``outputs/``)."""

    def reconstruction_config(self) -> ReconstructionConfig:
        """The validated config from this solver's parameters (``ValueError`` if invalid)."""
        values = {key: getattr(self, key) for key in _CONFIG_KEYS if hasattr(self, key)}
        return ReconstructionConfig(**values)

    def topology(self) -> Topology:
        return Topology(
            nproc_per_node=self.nproc_per_node,
            slurm_nodes=self.slurm_nodes,
            slurm_ntasks_per_node=self.slurm_ntasks_per_node,
            slurm_gres=self.slurm_gres,
        )

    def skip(self, spec: dict[str, Any], **_: Any) -> tuple[bool, str | None]:
        from scopebench.dist import get_dist_info

        config = self.reconstruction_config()
        self.validate_profiler()
        reason = denoiser_unavailable(config.denoiser)
        if reason:
            return True, reason
        params = dict(spec)
        kind = params.pop("kind")
        shape, num_operators = describe_problem(kind, **params)
        if len(shape) == 5 and config.denoiser in ("median", "bm3d", "wavelet"):
            return True, f"denoiser={config.denoiser!r} only handles 2-D images; {kind} is a volume"
        info = get_dist_info()
        reason = check_topology(
            self.topology(),
            distribute_physics=config.distribute_physics,
            distribute_denoiser=config.distribute_denoiser,
            num_operators=num_operators,
            signal_shape=shape,
            patch_size=config.patch_size,
            overlap=config.overlap,
            launcher_world_size=info.world_size if info.is_distributed else None,
            compile_mode=config.compile,
        )
        return (True, reason) if reason else (False, None)

    def set_objective(self, spec: dict[str, Any]) -> None:
        self.spec = dict(spec)
        self.config = self.reconstruction_config()
        self.validate_profiler()
        self.engine = None
        self.session = None
        self.metrics: dict[str, Any] = {}

    def pre_run_hook(self, stop_val: Any) -> None:
        from scopebench.dist import DistSession
        from scopebench.imaging.pnp import resolve_device
        from scopebench.imaging.runner import WORKER_TARGET, build_engine

        self._close(failed=True)
        self.metrics = {}
        worker_kwargs = {
            "spec": self.spec,
            "config": self.config.to_kwargs(),
            "profiler": {k: (str(v) if isinstance(v, Path) else v) for k, v in self.profiler_kwargs().items()},
            "task": self.task,
            "name": self.name.lower(),
            "output_dir": str(self.output_dir),
        }
        self.session = DistSession(
            self.topology().world_size,
            worker=WORKER_TARGET,
            worker_kwargs=worker_kwargs,
            device=resolve_device(self.config.device).type,
        )
        self.info = self.session.start()
        try:
            self.engine = build_engine(self.spec, self.config.to_kwargs(), self.task)
        except BaseException:
            self._close(failed=True)
            raise

    def run(self, callback: Any) -> None:
        from scopebench.imaging.runner import run_loop

        failed = True
        try:
            prof = self.build_profiler(device=self.engine.device, name=self.name.lower(), output_dir=self.output_dir)
            with prof:
                self._profiler = prof
                run_loop(self.engine, prof, callback if self.info.rank == 0 else None)
            if self.info.rank != 0 and callable(callback):
                # Under Submitit every SLURM task runs benchopt, which keeps task 0's rows
                # but cannot close a run whose callback never logged (AttributeError in
                # _Callback.get_results): log once, after the loop, outside any iteration.
                callback()
            failed = False
        finally:
            self._close(failed=failed)

    def get_result(self) -> dict[str, Any]:
        from scopebench.imaging.runner import throughput_metrics

        prof = getattr(self, "_profiler", None)
        metrics = prof.get_current_metrics() if prof is not None else {}
        static = self.engine.static_metrics() if self.engine is not None else {}
        x = self.engine.x if self.engine is not None else None
        return {"x": x, **static, **metrics, **throughput_metrics(static, metrics)}

    def _close(self, failed: bool) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
        session, self.session = getattr(self, "session", None), None
        if session is not None:
            session.close(failed=failed)
