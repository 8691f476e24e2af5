"""Preflight of a ``benchopt run``: the grid a config expands to, every cell checked, the jobs it would submit.

Nothing is submitted and no data is loaded. The grid follows benchopt's rules (each
``dataset``/``objective``/``solver`` pattern updates the product of its class's default
``parameters``; ``"a, b": [[...], ...]`` couples parameters); the defaults are read from
the benchmark's own classes (:func:`~scopebench.preflight.grid.load_classes`, benchopt's
grid syntax). Each cell is then checked by its solver's own ``check_cell`` (the check its
``skip`` calls too: :meth:`scopebench.harness.ProfiledSolverMixin.check_cell`), as
inside the cell's job (its SLURM tasks are its ranks). A Submitit parallel config and each cell's job go through
:mod:`scopebench.cluster` (benchopt 1.10's merge, Submitit's validation and sbatch writer).

This module never imports benchopt; :func:`load_classes` executes the benchmark's
``objective.py``, ``datasets/*.py`` and ``solvers/*.py``, which do.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scopebench.cluster import (
    BENCHOPT_DEFAULT_TIMEOUT_SEC,
    JOB_FOLDER,
    MIN_SLURM_MINUTES,
    CellLayout,
    Layout,
    cell_layout,
    job_parameters,
    launcher_world_size,
    read_parallel_config,
    sbatch_script,
    slurm_minutes,
)
from scopebench.harness.solver import LayoutReason, MachineReason
from scopebench.preflight.grid import Classes, expand, load_classes, parse_pattern
from scopebench.validate import load_yaml, quote

__all__ = [
    "Cell",
    "Classes",
    "Report",
    "expand",
    "load_classes",
    "parse_pattern",
    "preflight",
]


# -- cells ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One (dataset, objective, solver) combination of the grid: one job per repetition."""

    index: int
    dataset: str
    dataset_params: dict
    objective: str
    objective_params: dict
    solver: str
    solver_params: dict
    solver_set: dict
    """The solver parameters the config set (the rest are the solver's defaults)."""
    dataset_set: dict

    def label(self) -> str:
        """``#<index> <solver>[<set params>] on <dataset>[<set params>]``."""

        def fmt(name: str, params: dict) -> str:
            return name + ("[" + ",".join(f"{k}={v}" for k, v in params.items()) + "]" if params else "")

        return f"#{self.index} {fmt(self.solver, self.solver_set)} on {fmt(self.dataset, self.dataset_set)}"


# -- the whole preflight -------------------------------------------------------------------
@dataclass
class Report:
    """What :func:`preflight` found; nothing was submitted."""

    benchmark: str
    cells: list[Cell]
    n_repetitions: int
    backend: str | None
    """``None`` without a parallel config (benchopt runs the cells in its own process)."""
    cluster: str | None
    """``slurm`` or ``local`` for the submitit backend: where Submitit would run the jobs."""
    errors: dict[int, str] = field(default_factory=dict)
    """Cell index -> why it is invalid (naming the parameters): an error ``check_cell`` raised, or its
    :class:`~scopebench.harness.solver.LayoutReason` (ranks that contradict the cell)."""
    skips: dict[int, str] = field(default_factory=dict)
    """Cell index -> why its solver would decline it (on SLURM it still takes a job)."""
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Cell index -> the ``slurm_*`` settings of its job (SLURM only)."""
    groups: dict[int, int] = field(default_factory=dict)
    """Cell index -> its submission: cells with equal settings go in one job array."""
    layouts: dict[int, Layout] = field(default_factory=dict)
    """Cell index -> its ranks: nodes, ranks per node, world size (:func:`scopebench.cluster.cell_layout`)."""
    unchecked: set[int] = field(default_factory=set)
    """Cells whose solver has no ``check_cell`` (values not checked)."""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def submissions(self) -> int:
        """``sbatch`` calls benchopt would make (one per distinct job settings)."""
        return len(set(self.groups.values()))


def _config_option(config: Mapping[str, Any], key: str, default: Any) -> Any:
    return config.get(key, config.get(key.replace("-", "_"), default))


def preflight(
    benchmark: str | Path,
    config_path: str | Path,
    parallel_path: str | Path | None = None,
    *,
    n_jobs: int | None = None,
    cluster: str | None = None,
) -> Report:
    """Expand ``config_path`` for ``benchmark`` and check every cell and job.

    Args:
        benchmark: The benchmark folder.
        config_path: The ``--config`` YAML of ``benchopt run``.
        parallel_path: Its ``--parallel-config`` (default: the config's ``parallel-config``).
        n_jobs: The ``-j`` that would be passed (default: the config's ``n-jobs``).
        cluster: ``slurm`` or ``local`` for a submitit config; default: what Submitit
            picks on this machine (SLURM when ``srun`` is on the PATH).

    Raises:
        ValueError: the config, the parallel config or a pattern cannot be read; the
            message names the file and key. Cell problems go to ``Report.errors``.
    """
    config = load_yaml(config_path) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a mapping of benchopt run options, got {quote(config)}")
    n_jobs = n_jobs if n_jobs is not None else _config_option(config, "n-jobs", None)
    parallel_path = parallel_path or _config_option(config, "parallel-config", None)
    parallel = read_parallel_config(parallel_path, n_jobs) if parallel_path else None
    backend = parallel["backend"] if parallel else None
    if backend == "submitit" and cluster is None:
        import submitit

        cluster = "slurm" if submitit.AutoExecutor.which() == "slurm" else "local"
    if cluster not in (None, "slurm", "local"):
        raise ValueError(f"cluster must be 'slurm' or 'local', got {cluster!r}")
    classes = load_classes(benchmark)
    datasets = expand(config.get("dataset"), classes.datasets, "dataset")
    objectives = expand(config.get("objective"), classes.objectives, "objective")
    solvers = expand(config.get("solver"), classes.solvers, "solver")
    cells = [
        Cell(i, d[0], d[1], o[0], o[1], s[0], s[1], s[2], d[2])
        for i, (d, o, s) in enumerate(itertools.product(datasets, objectives, solvers), start=1)
    ]
    report = Report(
        benchmark=str(benchmark),
        cells=cells,
        n_repetitions=int(_config_option(config, "n-repetitions", 1)),
        backend=backend,
        cluster=cluster if backend == "submitit" else None,
    )
    timeout = _config_option(config, "timeout", BENCHOPT_DEFAULT_TIMEOUT_SEC)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError(f"{config_path}: timeout must be a number of seconds for check-config, got {timeout!r}")
    folder = Path(benchmark).resolve() / JOB_FOLDER
    group_of: dict[str, int] = {}
    for cell in cells:
        world = None
        if report.cluster == "slurm":
            job = job_parameters(parallel, cell.solver_params, classes.slurm_params.get(cell.solver))
            if "slurm_time" not in job:
                job["slurm_time"] = f"00:{int(1.5 * timeout)}"  # what benchopt 1.10 sets
                report.notes.append(f"no slurm_time: benchopt sets {job['slurm_time']} (1.5 x timeout of {timeout} s)")
            report.jobs[cell.index] = job
            # benchopt makes one executor (one sbatch call, an array when it holds several
            # jobs) per distinct merged settings, None values included.
            raw = job_parameters(parallel, cell.solver_params, classes.slurm_params.get(cell.solver), drop_none=False)
            report.groups[cell.index] = group_of.setdefault(repr(sorted(raw.items(), key=str)), len(group_of) + 1)
            world = launcher_world_size(job)
            try:
                sbatch_script(job, folder)
                if slurm_minutes(job["slurm_time"]) < MIN_SLURM_MINUTES:
                    raise ValueError(
                        f"slurm_time={job['slurm_time']!r} is under {MIN_SLURM_MINUTES} minutes: Submitit's USR2 "
                        "signal 90 s before the end kills the job as it starts"
                    )
            except ValueError as err:
                report.errors[cell.index] = str(err)
                continue
        elif report.cluster == "local":
            report.groups[cell.index] = 1
        # A SLURM cell's job merges the parallel config's settings; elsewhere the cell's own
        # keys are checked against the one process that will spawn its ranks.
        resources = report.jobs.get(cell.index, cell.solver_params)
        try:
            report.layouts[cell.index] = cell_layout(
                cell.solver_params.get("nproc_per_node", CellLayout.nproc_per_node),
                resources.get("slurm_nodes", CellLayout.slurm_nodes),
                resources.get("slurm_ntasks_per_node"),
                world,
            )
        except ValueError as err:
            report.errors[cell.index] = str(err)
            continue
        check = getattr(classes.solver_classes.get(cell.solver), "check_cell", None)
        if check is None:
            report.unchecked.add(cell.index)
            report.notes.append(f"no check_cell for solver {cell.solver}: its parameter values are not checked")
            continue
        try:
            reason = check(cell.solver_params, {"kind": cell.dataset, **cell.dataset_params}, world)
        except (ValueError, TypeError) as err:
            report.errors[cell.index] = str(err)
            continue
        if isinstance(reason, LayoutReason):  # the run would decline it; a config that asks for it is a mistake
            report.errors[cell.index] = str(reason)
            continue
        if isinstance(reason, MachineReason):
            reason = f"{reason} (on this machine; a compute node may differ)"
        if reason:
            report.skips[cell.index] = reason
        wrapper = " ".join(map(str, report.jobs.get(cell.index, {}).get("slurm_srun_args", [])))
        if "cudaProfilerApi" in wrapper and cell.solver_params.get("profiler_mode") != "nvidia":
            report.notes.append(
                f"cell #{cell.index}: nsys waits for the CUDA profiler API, which only profiler_mode: nvidia "
                "calls; its reports will hold nothing"
            )
    report.notes = list(dict.fromkeys(report.notes))
    return report
