"""The benchopt-free half of benchmark_inference's ``PnP`` and ``Denoiser`` solvers.

``class Solver(PnPSolverMixin, BaseSolver)`` declares its parameter grid and ``task``; the
lifecycle and the skip rule are :class:`~scopebench.harness.solver.ProfiledSolverMixin`'s.
This mixin adds ``check_cell`` (can a cell run: the one check ``skip`` and ``scopebench
check-config`` call; layouts and optional packages that cannot run are declined with a
reason, invalid values raise ``ValueError``), the run object
(:class:`~scopebench.imaging.inference.run.PnPRun`, built by ``set_objective``, started
untimed by ``pre_run_hook``) and ``get_result``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.cluster import CellLayout
from scopebench.harness.solver import LayoutReason, MachineReason, ProfiledSolverMixin
from scopebench.imaging.common.denoisers import ONLY_2D, denoiser_unavailable
from scopebench.imaging.inference.engine import ReconstructionConfig
from scopebench.imaging.inference.problems import describe_problem
from scopebench.imaging.inference.run import PnPRun
from scopebench.imaging.inference.topology import check_topology
from scopebench.parameters import defaults

__all__ = ["PnPSolverMixin", "cell_problems"]

#: Solver parameters that make up the :class:`ReconstructionConfig`: its fields.
CONFIG_KEYS = tuple(defaults(ReconstructionConfig))


def cell_problems(
    config: ReconstructionConfig, layout: CellLayout, spec: dict[str, Any], launcher_world_size: int | None
) -> tuple[str | None, str | None, str | None]:
    """Why a (config, layout, problem) cell cannot run: ``(invalid, inapplicable, unavailable)``.

    Each is a reason or ``None``. ``invalid``: the process layout contradicts the problem
    or the distribution flags (:func:`check_topology` without compilation);
    ``inapplicable``: the grid combination does not apply (a 2-D-only denoiser on a
    volume); ``unavailable``: it cannot run on this machine (a missing denoiser package,
    ``compile`` without a C compiler). ``skip`` declines all three; ``scopebench
    check-config`` reports the first as an error (a :class:`LayoutReason`) and the others
    as skips.
    """
    params = dict(spec)
    kind = params.pop("kind")
    shape, num_operators = describe_problem(kind, **params)
    checks = dict(
        distribute_physics=config.distribute_physics,
        distribute_denoiser=config.distribute_denoiser,
        num_operators=num_operators,
        signal_shape=shape,
        patch_size=config.patch_size,
        overlap=config.overlap,
        launcher_world_size=launcher_world_size,
    )
    invalid = check_topology(layout, **checks, compile_mode="none")
    if invalid:
        return invalid, None, None
    if len(shape) == 5 and config.denoiser in ONLY_2D:
        return None, f"denoiser={config.denoiser!r} only handles 2-D images; {kind} is a volume", None
    unavailable = denoiser_unavailable(config.denoiser) or check_topology(layout, **checks, compile_mode=config.compile)
    return None, None, unavailable


def _reconstruction_config(params: dict[str, Any]) -> ReconstructionConfig:
    return ReconstructionConfig(**{key: params[key] for key in CONFIG_KEYS if key in params})


class PnPSolverMixin(ProfiledSolverMixin):
    """Check a cell, build its :class:`PnPRun`, report; the solver file sets ``task`` and ``output_dir``."""

    task: str = "pnp"
    """``pnp`` (gradient + denoise) or ``denoise`` (one denoiser pass per iteration)."""
    output_dir: str | Path = "outputs"

    @classmethod
    def check_cell(cls, params: dict[str, Any], spec: dict[str, Any], launcher_world_size: int | None) -> str | None:
        """:func:`cell_problems`: a layout that contradicts the problem is a :class:`LayoutReason`,
        a grid combination that does not apply a reason, one that cannot run here a
        :class:`MachineReason`; an invalid value raises ``ValueError``."""
        super().check_cell(params, spec, launcher_world_size)
        invalid, inapplicable, unavailable = cell_problems(
            _reconstruction_config(params), CellLayout.from_params(params), spec, launcher_world_size
        )
        if invalid:
            return LayoutReason(invalid)
        return inapplicable or (MachineReason(unavailable) if unavailable else None)

    def reconstruction_config(self) -> ReconstructionConfig:
        """The validated config from this solver's parameters (``ValueError`` if invalid)."""
        return _reconstruction_config(self.cell_params())

    def cell_layout(self) -> CellLayout:
        """The validated ranks and SLURM job of this solver's cell."""
        return CellLayout.from_params(self.cell_params())

    def cell_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        return spec

    def make_run(self, spec: dict[str, Any]) -> PnPRun:
        return PnPRun(
            spec,
            self.reconstruction_config(),
            task=self.task,
            nproc=self.cell_layout().nproc_per_node,  # ranks per node (scopebench.cluster.job_layout)
            profiler=self.profiler_config,
            output_dir=self.output_dir,
            name=self.name.lower(),
            group_timeout_sec=self.group_timeout_sec,
        )

    def get_result(self) -> dict[str, Any]:
        run = self.run_object
        return {"x": run.x, **run.metrics()}
