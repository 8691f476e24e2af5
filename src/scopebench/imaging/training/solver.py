"""The benchopt-free half of benchmark_training's ``UnrolledPnP`` solver.

``class Solver(UnrolledSolverMixin, BaseSolver)`` declares its parameter grid; the lifecycle
and the skip rule are :class:`~scopebench.harness.solver.ProfiledSolverMixin`'s. This mixin
adds ``check_cell`` (can a cell run: the one check ``skip`` and ``scopebench check-config``
call; several ranks without ``distribute_model`` are declined with the reason), the run
object (:class:`~scopebench.imaging.training.run.TrainingRun`: ranks and model, started
untimed by ``pre_run_hook``), ``run`` (the profiled loop, torn down on any exit; then the
weights are saved) and ``get_result``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.cluster import CellLayout
from scopebench.harness.solver import LayoutReason, ProfiledSolverMixin
from scopebench.imaging.training.data import TrainingDataSpec
from scopebench.imaging.training.run import TrainingRun, check_world_size
from scopebench.imaging.training.trainer import SOLVER_PARAMS, configs_from_params

__all__ = ["UnrolledSolverMixin"]


class UnrolledSolverMixin(ProfiledSolverMixin):
    """Check a cell, build its :class:`TrainingRun`, save the weights, report; the solver
    file sets ``output_dir``."""

    output_dir: str | Path = "outputs"
    #: Where :meth:`run` saved the trained denoiser (``None`` with ``save_weights`` off).
    weights_path: Path | None = None

    @classmethod
    def check_cell(cls, params: dict[str, Any], spec: dict[str, Any], launcher_world_size: int | None) -> str | None:
        """The architecture and training configs of the cell (an invalid value raises), and
        its ranks: several processes without ``distribute_model`` (the extra ranks would
        repeat rank 0's work) or counts that disagree are a :class:`LayoutReason`."""
        super().check_cell(params, spec, launcher_world_size)
        data = TrainingDataSpec(**{key: value for key, value in spec.items() if key != "kind"})
        _, train = configs_from_params(data, **{key: params[key] for key in SOLVER_PARAMS})
        try:
            layout = CellLayout.from_params(params).ranks(launcher_world_size)
            check_world_size(launcher_world_size or layout.world_size, train.distribute_model)
        except ValueError as err:  # the ranks, not a value, are wrong: declined (check-config: invalid)
            return LayoutReason(str(err))
        return None

    @property
    def training(self) -> TrainingRun:
        """:attr:`run_object` under its former name; absent (``AttributeError``) until
        ``set_objective`` built it, which the solver tests check after a refusal."""
        if self.run_object is None:
            raise AttributeError("training: set_objective has not built the run")
        return self.run_object

    def cell_spec(self, data: Any, data_params: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "training", **data.spec.to_dict()}

    def make_run(self, data: Any, data_params: dict[str, Any]) -> TrainingRun:
        unrolled, train = configs_from_params(data.spec, **{key: getattr(self, key) for key in SOLVER_PARAMS})
        return TrainingRun(
            data_params=data_params,
            unrolled=unrolled,
            train=train,
            data=data,
            nproc=self.nproc_per_node,
            profiler=self.profiler_config,
            output_dir=self.output_dir,
            group_timeout_sec=self.group_timeout_sec,
        )

    def run(self, callback: Any) -> None:
        self.weights_path = None
        super().run(callback)
        if self.save_weights:
            self.weights_path = self.run_object.save_weights()

    def get_result(self) -> dict[str, Any]:
        trainer = self.run_object.trainer
        loss = None if trainer.last_loss is None else trainer.last_loss.item()
        grad_norm = None if trainer.last_grad_norm is None else trainer.last_grad_norm.item()
        return dict(
            model=trainer.reconstructor(),
            train_loss=loss,
            step=trainer.step_count,
            batch_size=self.batch_size,
            grad_norm=grad_norm,
            **self.run_object.metrics(),
        )
