"""The benchopt-free half of benchmark_training's ``UnrolledPnP`` solver.

``class Solver(UnrolledSolverMixin, BaseSolver)`` declares its parameter grid and gets
``check_cell`` (can a cell run: the one check ``skip`` and ``scopebench check-config``
call), ``skip`` (several ranks without ``distribute_model`` are declined with the reason),
``set_objective`` (every value validated before any work; builds the
:class:`~scopebench.imaging.training.run.TrainingRun`), ``pre_run_hook`` (ranks and model,
untimed), ``run`` (the profiled loop, torn down on any exit; then the weights are saved)
and ``get_result``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.cluster import cell_layout
from scopebench.harness.solver import ProfiledSolverMixin
from scopebench.imaging.training.data import TrainingDataSpec
from scopebench.imaging.training.run import TrainingRun, check_world_size
from scopebench.imaging.training.trainer import SOLVER_PARAMS, configs_from_params

__all__ = ["UnrolledSolverMixin"]


class UnrolledSolverMixin(ProfiledSolverMixin):
    """Check, skip, validate, start, loop and report; the solver file sets ``output_dir``."""

    output_dir: str | Path = "outputs"

    @classmethod
    def check_cell(cls, params: dict[str, Any], spec: dict[str, Any], launcher_world_size: int | None) -> str | None:
        """The architecture and training configs of the cell, and its ranks: several
        processes without ``distribute_model`` raise (the extra ranks would repeat rank 0's work)."""
        super().check_cell(params, spec, launcher_world_size)
        data = TrainingDataSpec(**{key: value for key, value in spec.items() if key != "kind"})
        _, train = configs_from_params(data, **{key: params[key] for key in SOLVER_PARAMS})
        layout = cell_layout(
            params.get("nproc_per_node", 1),
            params.get("slurm_nodes", 1),
            params.get("slurm_ntasks_per_node"),
            launcher_world_size,
        )
        check_world_size(launcher_world_size or layout.world_size, train.distribute_model)
        return None

    def get_next(self, stop_val: int) -> int:
        return stop_val + 1

    def skip(self, data: Any, data_params: dict[str, Any]) -> tuple[bool, str | None]:
        self.validate_profiler()
        configs_from_params(data.spec, **{key: getattr(self, key) for key in SOLVER_PARAMS})  # bad values raise
        try:
            return self.decline({"kind": "training", **data.spec.to_dict()})
        except ValueError as err:  # what is left is the ranks: declined, with the reason
            return True, str(err)

    def set_objective(self, data: Any, data_params: dict[str, Any]) -> None:
        profiler = self.validate_profiler()
        unrolled, train = configs_from_params(data.spec, **{key: getattr(self, key) for key in SOLVER_PARAMS})
        self.training = TrainingRun(
            data_params=data_params,
            unrolled=unrolled,
            train=train,
            data=data,
            nproc=self.nproc_per_node,
            profiler=profiler,
            output_dir=self.output_dir,
            group_timeout_sec=self.group_timeout_sec,
        )

    def pre_run_hook(self, stop_val: Any) -> None:
        self.start_run(self.training)  # spawns workers and builds the model: not timed
        self.weights_path = None

    def run(self, callback: Any) -> None:
        self.finish_run(self.training, callback)
        if self.save_weights:
            self.weights_path = self.training.save_weights()

    def get_result(self) -> dict[str, Any]:
        trainer = self.training.trainer
        loss = None if trainer.last_loss is None else trainer.last_loss.item()
        grad_norm = None if trainer.last_grad_norm is None else trainer.last_grad_norm.item()
        return dict(
            model=trainer.reconstructor(),
            train_loss=loss,
            step=trainer.step_count,
            batch_size=self.batch_size,
            grad_norm=grad_norm,
            **self.training.metrics(),
        )
