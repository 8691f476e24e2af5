"""The one solver lifecycle of the suite, without importing benchopt.

Every solver mixes in :class:`ProfiledSolverMixin` (``class Solver(Mixin, BaseSolver)``) and
gets benchopt's whole lifecycle from it: ``skip`` (:meth:`~ProfiledSolverMixin.check_cell`,
then the set-up, so that a value refused before any work is said in one line),
``set_objective`` (every value validated, the run object built, nothing started),
``get_next`` (every iteration evaluated), ``pre_run_hook`` (the run started, untimed:
:meth:`~ProfiledSolverMixin.start_run`) and ``run`` (the profiled loop, torn down on any exit:
:meth:`~ProfiledSolverMixin.finish_run`). The run object
(:class:`scopebench.harness.run.RankRun`) is ``self.run_object``, its profiler
``self.profiler``; a benchmark's mixin writes :meth:`~ProfiledSolverMixin.cell_spec`,
:meth:`~ProfiledSolverMixin.make_run` and ``get_result`` (the work product and the run's
``metrics()``), and extends ``check_cell``, which ``scopebench check-config`` calls too.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scopebench.profiler.config import PROFILER_DEFAULTS, ProfilerConfig

__all__ = ["LayoutReason", "MachineReason", "ProfiledSolverMixin"]

#: The solvers whose run finished in this process and whose run object is still held.
_FINISHED: list[weakref.ref] = []


def _release_finished_runs(keep: Any) -> None:
    """Drop the run objects of the solvers whose run finished, but ``keep``'s.

    benchopt keeps every solver instance of its grid until it exits, and each kept its run
    object: a finished cell's model, optimizer, open video files and process groups stayed
    for the rest of the run (on a GPU, every earlier cell's model in its memory). A finished
    run stays readable until the next cell starts (benchopt's last ``get_result`` comes after
    ``run`` returns); the next cell's ``skip`` lets it go.
    """
    released = False
    for ref in _FINISHED:
        solver = ref()
        if solver is not None and solver is not keep and solver.run_object is not None:
            solver.run_object = solver.profiler = None
            released = True
    _FINISHED.clear()
    if released:
        gc.collect()  # a run object sits in reference cycles: free its memory and files now


class MachineReason(str):
    """A reason to decline a cell that holds on this machine only (a missing package, no C
    compiler): ``scopebench check-config`` says a compute node may differ."""


class LayoutReason(str):
    """A reason to decline a cell whose ranks contradict its problem or its flags (a split
    over more ranks than the problem has operators, several ranks without a distribution
    flag): the run declines it like any other reason, ``scopebench check-config`` lists
    it as invalid (a config that asks for it is a mistake to fix before a submission)."""


class ProfiledSolverMixin:
    """Mix into a benchopt ``BaseSolver``: the profiler parameters and benchopt's lifecycle.

    ``class Solver(ProfiledSolverMixin, BaseSolver)`` with
    ``parameters = {**ProfiledSolverMixin.parameters, ...}``; a subclass writes
    :meth:`cell_spec`, :meth:`make_run` and ``get_result``, and extends :meth:`check_cell`.

    **The skip rule** (one for every solver; STYLE.md rule 18): ``skip`` returns
    ``(True, reason)`` when :meth:`check_cell` returns a reason — a grid combination that
    does not apply, a :class:`MachineReason`, a :class:`LayoutReason` — and
    ``(True, "refused: <message>")`` when the cell refuses a value before any work: the
    ``ValueError`` (naming the key) of :meth:`check_cell`, or of ``set_objective``, which
    ``skip`` runs for a cell that passes (an unwritable ``profiler_trace_dir`` or output
    folder, a value the run object refuses). benchopt prints either as the cell's skip and
    its one-line ``Reason:`` instead of a traceback; an invalid value is still never
    skipped silently: :func:`scopebench.runs.run_benchopt` counts a ``refused:`` skip as a
    failure (:data:`scopebench.runs.REFUSED_SKIP`). ``(False, None)`` otherwise; the run
    object ``skip`` built is the one ``set_objective`` then keeps (built once).

    A finished run object is dropped when the next cell's ``skip`` runs in the process
    (benchopt keeps every solver instance until it exits: each would keep its run's model,
    files and process groups).
    """

    parameters: dict[str, list[Any]] = {key: [value] for key, value in PROFILER_DEFAULTS.items()}
    #: Folder of the per-rank profiler files (a solver sets its benchmark's ``outputs/``).
    output_dir: str | Path | None = None
    #: The profiler of the current run (``None`` before the first).
    profiler: Any = None
    #: The run object of the current cell, built by ``set_objective`` (``None`` before, and
    #: after ``set_objective`` refused its values).
    run_object: Any = None
    #: The validated profiler parameters (:meth:`validate_profiler`).
    profiler_config: ProfilerConfig | None = None
    #: The objective ``skip`` built :attr:`run_object` for (``set_objective`` then keeps it).
    _set_up_for: dict[str, Any] | None = None

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
            this machine's; a :class:`LayoutReason` when its ranks contradict it).

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

    # -- what a benchmark's mixin writes -----------------------------------------------
    def cell_spec(self, **objective: Any) -> Mapping[str, Any]:
        """The cell's dataset as :meth:`check_cell` takes it, ``{"kind": <dataset name>, ...}``,
        from the objective's ``get_objective()`` dict."""
        raise NotImplementedError

    def make_run(self, **objective: Any) -> Any:
        """The run object of this cell from the objective's dict and this solver's parameters
        (:attr:`profiler_config` is validated by then); raises ``ValueError`` on a bad value,
        starts nothing."""
        raise NotImplementedError

    # -- benchopt's lifecycle --------------------------------------------------------
    def skip(self, **objective: Any) -> tuple[bool, str | None]:
        """``(True, reason)`` when :meth:`check_cell` declines the cell, ``(True, "refused:
        <message>")`` when it or ``set_objective`` refuses a value, else ``(False, None)`` (the
        skip rule of the class docstring)."""
        from scopebench.runs import REFUSED_SKIP

        _release_finished_runs(keep=self)
        self._set_up_for = None
        try:
            reason = self.check_cell(self.cell_params(), self.cell_spec(**objective), self.launcher_world_size())
            if not reason:
                self.set_objective(**objective)
                self._set_up_for = objective
        except ValueError as err:
            return True, REFUSED_SKIP + str(err).replace("\n", " ")  # benchopt prints one line
        return (True, str(reason)) if reason else (False, None)

    def set_objective(self, **objective: Any) -> None:
        """Validate the profiler (and its output folders), then build the run object
        (:meth:`make_run`); nothing is started, and a refused value leaves no run object.
        After a ``skip`` that built it for this very objective, that run object is kept."""
        built, self._set_up_for = self._set_up_for, None
        if built is not None and built.keys() == objective.keys() and all(built[k] is objective[k] for k in objective):
            return
        self.run_object = None
        self.validate_profiler()
        self.run_object = self.make_run(**objective)

    def get_next(self, stop_val: int) -> int:
        """Evaluate every iteration (docs/design.md, "How one iteration flows")."""
        return stop_val + 1

    def pre_run_hook(self, stop_val: Any) -> None:
        self.start_run(self.run_object)

    def run(self, callback: Callable[[], bool] | None) -> None:
        self.finish_run(self.run_object, callback)

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

        Teardown happens on any exit; after a failure it names the rank that caused it. The
        run object stays readable until the next cell's ``skip`` in this process drops it.
        """
        try:
            with run:
                run.loop(callback)
                self.close_callback(run.info.rank, callback)
        finally:
            _FINISHED.append(weakref.ref(self))

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
