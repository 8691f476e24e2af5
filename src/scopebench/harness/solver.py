"""Solver-side glue: the eight ``profiler_*`` parameters and the profiler handle, without importing benchopt.

Every solver of the suite mixes in :class:`ProfiledSolverMixin`, drives a run object
(:class:`scopebench.harness.run.RankRun`) started by
:meth:`~ProfiledSolverMixin.start_run` and driven by :meth:`~ProfiledSolverMixin.finish_run`,
reaches its profiler as ``self.profiler`` and returns the run's ``metrics()``; whether a
cell can run is :meth:`~ProfiledSolverMixin.check_cell`, which ``skip`` and
``scopebench check-config`` both call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scopebench.profiler.config import PROFILER_DEFAULTS, ProfilerConfig

__all__ = ["MachineReason", "ProfiledSolverMixin"]


class MachineReason(str):
    """A reason to decline a cell that holds on this machine only (a missing package, no C
    compiler): ``scopebench check-config`` says a compute node may differ."""


class ProfiledSolverMixin:
    """Mix into a benchopt ``BaseSolver`` to get the profiler parameters and builders.

    ``class Solver(ProfiledSolverMixin, BaseSolver)`` with
    ``parameters = {**ProfiledSolverMixin.parameters, ...}``. Call
    :meth:`validate_profiler` in ``set_objective`` so bad values, and output folders the
    run could not write, fail before any work.
    """

    parameters: dict[str, list[Any]] = {key: [value] for key, value in PROFILER_DEFAULTS.items()}
    #: Folder of the per-rank profiler files (a solver sets its benchmark's ``outputs/``).
    output_dir: str | Path | None = None
    #: The profiler of the current run (``None`` before the first).
    profiler: Any = None

    # -- can this cell run: one check for skip and for scopebench check-config ---------
    @classmethod
    def check_cell(
        cls, params: Mapping[str, Any], spec: Mapping[str, Any], launcher_world_size: int | None
    ) -> str | None:
        """Whether one grid cell of this solver can run, without building anything.

        The one home of that decision: the solver's ``skip`` calls it on its own
        parameters, ``scopebench check-config`` (:mod:`scopebench.preflight`) on every
        cell of a config. Subclasses extend it (calling this one for the profiler).

        Args:
            params: The solver's parameters, defaults included.
            spec: The cell's dataset as ``{"kind": <dataset name>, **<its parameters>}``.
            launcher_world_size: The ranks a launcher started (the SLURM tasks of the
                cell's job, torchrun's world), ``None`` for one process that may spawn
                its own ranks.

        Returns:
            ``None`` when the cell runs, else why the solver declines it (a grid
            combination that does not apply; a :class:`MachineReason` when the reason is
            this machine's).

        Raises:
            ValueError: a value is invalid or the parameters contradict each other; the
                message names the key.
        """
        ProfilerConfig.from_params(**{key: params[key] for key in PROFILER_DEFAULTS if key in params})
        return None

    def cell_params(self) -> dict[str, Any]:
        """This solver's parameter values, as :meth:`check_cell` takes them."""
        return {key: getattr(self, key) for key in self.parameters if hasattr(self, key)}

    @staticmethod
    def launcher_world_size() -> int | None:
        """The world size of the launcher this process runs under, ``None`` without one."""
        from scopebench.distributed import get_dist_info

        info = get_dist_info()
        return info.world_size if info.is_distributed else None

    def decline(self, spec: Mapping[str, Any]) -> tuple[bool, str | None]:
        """benchopt's ``skip`` answer from :meth:`check_cell` on this solver's parameters."""
        reason = self.check_cell(self.cell_params(), spec, self.launcher_world_size())
        return (True, str(reason)) if reason else (False, None)

    def profiler_kwargs(self) -> dict[str, Any]:
        """The eight ``profiler_*`` values of this solver, as plain keyword arguments."""
        return {key: getattr(self, key, default) for key, default in PROFILER_DEFAULTS.items()}

    def validate_profiler(self, output_dir: str | Path | None = None) -> ProfilerConfig:
        """Validated :class:`ProfilerConfig` of this solver (``ValueError`` if invalid).

        Also refuses, naming ``profiler_save_file`` / ``profiler_trace_dir`` and the path,
        a folder the run would fail to write at the end (``output_dir``, else
        :attr:`output_dir`). Every solver calls this first in ``set_objective``, so it is
        also where the solver's process gets the allocator settings of
        :func:`scopebench.allocator.keep_freed_memory`.
        """
        from scopebench.allocator import keep_freed_memory

        keep_freed_memory()
        self.profiler_config = ProfilerConfig.from_params(**self.profiler_kwargs())
        self.profiler_config.check_outputs(output_dir if output_dir is not None else self.output_dir)
        return self.profiler_config

    def start_run(self, run: Any) -> Any:
        """Start a run object in ``pre_run_hook`` (ranks, build, set-up barrier: untimed).

        A run left started by an interrupted earlier attempt is closed first. The run's
        profiler becomes ``self.profiler``.
        """
        if run.session is not None:
            run.close(failed=True)
        self.profiler = None
        run.start()
        self.profiler = run.profiler
        return run

    def finish_run(self, run: Any, callback: Callable[[], bool] | None) -> None:
        """The whole ``Solver.run`` of a run object: iterate until told to stop, then tear down.

        Teardown happens on any exit; after a failure it names the rank that caused it.
        """
        with run:
            run.loop(callback)
            self.close_callback(run.info.rank, callback)

    @staticmethod
    def close_callback(rank: int, callback: Callable[[], bool] | None) -> None:
        """On ranks other than 0, call benchopt's ``callback`` once, after the loop.

        Under Submitit every SLURM task runs benchopt's solver code; benchopt keeps task
        0's rows but cannot close a run whose callback never logged (``AttributeError`` in
        ``_Callback.get_results``). Only rank 0 drives the loop with the callback, so the
        others log once here, outside any iteration.
        """
        if rank != 0 and callable(callback):
            callback()
