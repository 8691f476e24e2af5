"""The benchopt-free half of the validation benchmark's solver ``Detect``.

``class Solver(DetectSolverMixin, BaseSolver)`` (``benchmark_validation/solvers/detect.py``): the
lifecycle and the skip rule are :class:`~scopebench.harness.solver.ProfiledSolverMixin`'s, the
backends' checks :class:`~scopebench.policy.run.solver.TrainSolverMixin`'s; this mixin adds the
run object (:class:`~scopebench.validation.run.DetectRun` of the dataset's fault), the cells a
fault cannot run on, and ``get_result`` (the run's :class:`~scopebench.validation.score.RunRecord`
and its metrics, which the objective scores).
"""

from __future__ import annotations

from typing import Any

from scopebench.policy.run.solver import TrainSolverMixin

__all__ = ["DETECT_PARAMETERS", "DetectSolverMixin"]

#: The run settings ``Detect`` varies, with their defaults (the rest are the policy's own:
#: :class:`~scopebench.policy.settings.TrainSettings`); and the cell's SLURM job.
DETECT_PARAMETERS: dict[str, list[Any]] = {
    "backend": ["ddp"],
    "nproc_per_node": [2],
    "batch_size": [4],
    "accelerate_config": [None],
    "group_timeout_sec": [None],
    "device": ["auto"],
    "interleave": [True],
    "slurm_gres": [None],
    "slurm_nodes": [1],
    "slurm_ntasks_per_node": [None],
}


class DetectSolverMixin(TrainSolverMixin):
    """``Detect``: the suite's findings on a run of the dataset's fault."""

    task = "train"

    def cell_spec(self, spec, seed) -> dict[str, Any]:
        """The dataset's parameters, as ``scopebench check-config`` gives them too."""
        import dataclasses

        return {"kind": "injected", "seed": seed, **dataclasses.asdict(spec)}

    @classmethod
    def check_cell(cls, params: dict[str, Any], spec: dict[str, Any], launcher_world_size: int | None) -> str | None:
        """The backend's checks (:meth:`TrainSolverMixin.check_cell`: ZeRO on one rank, HSDP's
        mesh), then what the fault needs: a faulty rank that exists, and ``profiler_memory``
        exactly for ``memory_growth`` (its rule reads the memory columns) and ``none`` (its cost
        would be scored as the other faults' overhead)."""
        from scopebench.policy.run.solver import _policy_world_size
        from scopebench.validation.faults import FaultSpec
        from scopebench.validation.run import FAULT_POLICY

        reason = super().check_cell({**params, "policy": FAULT_POLICY}, spec, launcher_world_size)
        if reason or "fault" not in spec:
            return reason
        fault = FaultSpec(**{k: spec[k] for k in FaultSpec.__dataclass_fields__ if k in spec})
        world = _policy_world_size(params, launcher_world_size)
        if fault.fault in ("late_rank", "nonfinite") and fault.rank >= world:
            return f"{fault.fault} on rank {fault.rank} needs at least {fault.rank + 1} ranks, this cell has {world}"
        if fault.fault in ("late_rank", "comm_heavy") and world < 2:
            return f"{fault.fault} needs several ranks (a rank to wait for, a collective to cost), this cell has 1"
        memory = bool(params.get("profiler_memory", False))
        if fault.fault == "memory_growth" and not memory:
            return "memory_growth is found by memory-creep, which reads profiler_memory's columns: set profiler_memory"
        if memory and fault.fault not in ("memory_growth", "none"):
            return (
                f"profiler_memory is for memory_growth and none only (its cost would count as {fault.fault}'s overhead)"
            )
        return None

    def make_run(self, spec, seed) -> Any:
        from scopebench.policy.settings import TrainSettings
        from scopebench.validation.run import FAULT_POLICY, DetectRun

        self.spec = spec
        interleave = bool(self.interleave)
        settings = TrainSettings(
            policy=FAULT_POLICY,
            policy_args=spec.policy_args(steps_per_iteration=2 if interleave else 1),
            backend=self.backend,
            nproc_per_node=self.nproc_per_node,
            batch_size=self.batch_size,
            accelerate_config=self.accelerate_config,
            group_timeout_sec=self.group_timeout_sec,
            device=self.device,
            find_unused_params=False,
            seed=seed,
        )
        run = DetectRun(
            settings,
            interleave=interleave,
            hogs=int(spec.size) if spec.fault == "contention" else 0,
            profiler=self.profiler_config,
            output_dir=self.output_dir,
            name="validation",
        )
        run.record.params = {key: getattr(self, key) for key in self.parameters if not key.startswith("slurm_")}
        return run

    def run(self, callback: Any) -> None:
        """The profiled loop, stopped (on every rank) after the iteration whose loss was not
        finite: the stop is the ``nonfinite`` fault's finding, scored, not a failure."""
        run = self.run_object
        if callback is None:
            self.finish_run(run, callback)
            return

        def until_nonfinite() -> bool:
            return bool(callback()) and run.work.nonfinite is None

        self.finish_run(run, until_nonfinite)

    def get_result(self) -> dict[str, Any]:
        run = self.run_object
        stopped = run.stopped_at
        if stopped is not None:
            run.record.stopped_at, run.record.stopped_rank = stopped
        return dict(record=run.record, **run.metrics())
