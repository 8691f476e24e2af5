"""Solver-side glue: the seven ``profiler_*`` parameters and the profiler handle, without importing benchopt.

Every solver of the suite mixes in :class:`ProfiledSolverMixin` and reaches its profiler as
``self.profiler``: the policy solvers through :meth:`~ProfiledSolverMixin.run_profiled`,
the imaging solvers through a run object (:class:`scopebench.distributed.run.RankRun`) started by
:meth:`~ProfiledSolverMixin.start_run` and driven by :meth:`~ProfiledSolverMixin.finish_run`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from scopebench.profiler.config import PROFILER_DEFAULTS, ProfilerConfig

__all__ = ["ProfiledSolverMixin"]


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

    def profiler_kwargs(self) -> dict[str, Any]:
        """The seven ``profiler_*`` values of this solver, as plain keyword arguments."""
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

    def build_profiler(self, device: Any = "cpu", name: str = "run", output_dir: str | Path = "outputs"):
        """A fresh profiler for one run of this solver."""
        from scopebench.profiler import profiler_from_config

        config = getattr(self, "profiler_config", None) or self.validate_profiler()
        return profiler_from_config(config, device=device, name=name, output_dir=output_dir)

    def run_profiled(
        self,
        callback: Callable[[], bool] | None,
        step: Callable[[Any], Any],
        *,
        device: Any = "cpu",
        name: str = "run",
        output_dir: str | Path = "outputs",
    ) -> None:
        """The whole ``Solver.run``: ``step(profiler)`` once per iteration until told to stop.

        The profiler stays reachable as ``self.profiler`` so that ``get_result`` can
        return :meth:`current_metrics`; its files are written when the loop ends.
        """
        with self.build_profiler(device=device, name=name, output_dir=output_dir) as prof:
            self.profiler = prof
            for _ in prof.iterate(callback):
                step(prof)

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

    def current_metrics(self) -> dict[str, Any]:
        """Metrics of the last finished iteration (``{}`` before the first or outside the window)."""
        prof = getattr(self, "profiler", None)
        return prof.get_current_metrics() if prof is not None else {}
