"""Preflight of a ``benchopt run``: the grid a config expands to, every cell checked, the jobs it would submit.

Nothing is submitted and no data is loaded. The grid follows benchopt's rules (each
``dataset``/``objective``/``solver`` pattern updates the product of its class's default
``parameters``; ``"a, b": [[...], ...]`` couples parameters); the defaults are read from
the benchmark's own classes (:func:`load_classes`). Each cell is then checked by the hook
registered for its solver in :data:`CELL_CHECKS`, which calls the library functions and
config classes the solver itself calls, as inside the cell's job (its SLURM tasks are its
ranks). A Submitit parallel config and each cell's job go through
:mod:`scopebench.cluster` (benchopt 1.10's merge, Submitit's validation and sbatch writer).

This module never imports benchopt; :func:`load_classes` executes the benchmark's
``objective.py``, ``datasets/*.py`` and ``solvers/*.py``, which do.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scopebench.cluster import (
    BENCHOPT_DEFAULT_TIMEOUT_SEC,
    JOB_FOLDER,
    MIN_SLURM_MINUTES,
    job_parameters,
    launcher_world_size,
    read_parallel_config,
    sbatch_script,
    slurm_minutes,
)

__all__ = [
    "CELL_CHECKS",
    "Cell",
    "Classes",
    "Report",
    "cell_check",
    "expand",
    "load_classes",
    "parse_pattern",
    "preflight",
]

#: Solver name -> ``"module:function"`` checking one cell of that solver without benchopt:
#: ``check(cell, launcher_world_size) -> str | None`` raises ``ValueError`` naming the key
#: when the cell is invalid, returns the reason when the solver would decline it (skip) and
#: ``None`` when it runs. ``launcher_world_size`` is the number of SLURM tasks of the cell's
#: job, ``None`` when the cell runs as one process (which may spawn its own ranks). Hooks
#: live in :mod:`scopebench.preflight_checks`; a benchmark adds its solvers here. A solver
#: without a hook has its cells expanded and its jobs rendered, its values not checked.
CELL_CHECKS: dict[str, str] = {
    "PnP": "scopebench.preflight_checks:imaging_inference_cell",
    "Denoiser": "scopebench.preflight_checks:imaging_inference_cell",
    "UnrolledPnP": "scopebench.preflight_checks:imaging_training_cell",
    "Pi05Train": "scopebench.preflight_checks:policy_train_cell",
    "Pi05Dataloader": "scopebench.preflight_checks:policy_train_cell",
    "Pi05Inference": "scopebench.preflight_checks:policy_inference_cell",
}


# -- patterns and the grid -----------------------------------------------------------------
_SCALARS = {"True": True, "False": False, "None": None}  # Python's spelling, as benchopt reads names
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _value(text: str) -> Any:
    text = text.strip()
    if text[:1] in "[(" and text[-1:] in "])":
        return [_value(item) for item in _split_top(text[1:-1])]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in _SCALARS:
        return _SCALARS[text]
    if _NUMBER.fullmatch(text):
        number = float(text)
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else number
    return text


def parse_pattern(pattern: str | Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(class name pattern, parameters)`` of a config entry, as benchopt reads it.

    :Examples:
        >>> parse_pattern("simulated[image_size=32,operator=[blur, inpainting],noise_level=1e-2]")
        [('simulated', {'image_size': 32, 'operator': ['blur', 'inpainting'], 'noise_level': 0.01})]
        >>> parse_pattern({"PnP": {"denoiser": "tv"}})
        [('PnP', {'denoiser': 'tv'})]
    """
    if isinstance(pattern, Mapping):
        out = []
        for name, params in pattern.items():
            if params is None:
                params = {}
            if not isinstance(params, Mapping):
                raise ValueError(f"{name}: expected a mapping of parameters, got {params!r}")
            out.append((str(name), dict(params)))
        return out
    if not isinstance(pattern, str):
        raise ValueError(f"expected a name or a mapping, got {pattern!r}")
    match = re.fullmatch(r"\s*([^\[\]]+?)\s*(?:\[(.*)\])?\s*", pattern)
    if match is None:
        raise ValueError(f"cannot read the pattern {pattern!r} (expected name[key=value, ...])")
    name, inside = match.group(1), match.group(2)
    params = {}
    for item in _split_top(inside or ""):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{pattern!r}: {item!r} is not key=value (check-config reads only named parameters)")
        params[key.strip().strip("'\"")] = _value(value)
    return [(name, params)]


def _product(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of a parameter grid; ``"a, b"`` keys take value tuples together."""
    keys = list(params)
    values = [v if isinstance(v, (list, tuple)) else [v] for v in params.values()]
    grid = []
    for combo in itertools.product(*values):
        cell: dict[str, Any] = {}
        for key, value in zip(keys, combo):
            if "," in key:
                names = [n.strip() for n in key.split(",")]
                if not isinstance(value, (list, tuple)) or len(value) != len(names):
                    raise ValueError(f"{key!r}: each value must list {len(names)} items, got {value!r}")
                cell.update(zip(names, value))
            else:
                cell[key] = value
        grid.append(cell)
    return grid


def expand(patterns: Any, classes: Mapping[str, Mapping[str, Any]], kind: str) -> list[tuple[str, dict, dict]]:
    """``(class name, full parameters, parameters set by the config)`` of every cell.

    Args:
        patterns: The config's list under ``kind`` (``None`` or ``"all"``: every class with
            its defaults).
        classes: Class name -> its default ``parameters`` grid.
        kind: ``dataset``, ``objective`` or ``solver`` (for messages).
    """
    if patterns is None or patterns == "all" or (isinstance(patterns, list) and "all" in patterns):
        selected = [(name, {}) for name in classes]
    else:
        items = patterns if isinstance(patterns, list) else [patterns]
        selected = [entry for item in items for entry in parse_pattern(item)]
    cells: list[tuple[str, dict, dict]] = []
    for name_pattern, params in selected:
        regex = re.escape(name_pattern).replace(r"\*", ".*")
        names = [name for name in classes if re.fullmatch(regex, name, flags=re.IGNORECASE)]
        if not names:
            raise ValueError(f"{kind} {name_pattern!r} matches none of {sorted(classes)}")
        for name in names:
            defaults = classes[name]
            known = {p.strip() for key in defaults for p in key.split(",")}
            for update in _product(params):
                unknown = sorted(set(update) - known)
                if unknown:
                    raise ValueError(f"{kind} {name}: unknown parameter(s) {unknown}; known: {sorted(known)}")
                for default in _product(defaults):
                    full = {**default, **update}
                    if all(full != c[1] or name != c[0] for c in cells):
                        cells.append((name, full, update))
    return cells


# -- the benchmark's classes ---------------------------------------------------------------
@dataclass
class Classes:
    """Names and default parameters of a benchmark's objective, datasets and solvers."""

    objectives: dict[str, dict] = field(default_factory=dict)
    datasets: dict[str, dict] = field(default_factory=dict)
    solvers: dict[str, dict] = field(default_factory=dict)
    slurm_params: dict[str, dict] = field(default_factory=dict)
    """Each solver's static ``slurm_params`` (benchopt merges them between the parallel
    config and the solver's ``slurm_*`` parameters)."""


def _load(path: Path, attr: str) -> Any:
    name = f"_scopebench_preflight_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        return getattr(module, attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot read the {attr} class of {path}: {err}") from None
    finally:
        sys.modules.pop(name, None)


def load_classes(benchmark: str | Path) -> Classes:
    """Read ``name`` and ``parameters`` of every class of a benchmark folder (no data)."""
    root = Path(benchmark)
    if not (root / "objective.py").is_file():
        raise ValueError(f"{root} is not a benchmark folder (no objective.py)")
    classes = Classes()
    objective = _load(root / "objective.py", "Objective")
    classes.objectives[objective.name] = dict(objective.parameters)
    for path in sorted((root / "datasets").glob("*.py")):
        dataset = _load(path, "Dataset")
        classes.datasets[dataset.name] = dict(dataset.parameters)
    for path in sorted((root / "solvers").glob("*.py")):
        solver = _load(path, "Solver")
        classes.solvers[solver.name] = dict(solver.parameters)
        classes.slurm_params[solver.name] = dict(getattr(solver, "slurm_params", {}) or {})
    return classes


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


def cell_check(solver: str) -> Callable[[Cell, int | None], str | None] | None:
    """The hook registered for ``solver`` in :data:`CELL_CHECKS`, ``None`` if there is none."""
    target = CELL_CHECKS.get(solver)
    if target is None:
        return None
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


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
    """Cell index -> why it is invalid (naming the parameters)."""
    skips: dict[int, str] = field(default_factory=dict)
    """Cell index -> why its solver would decline it (on SLURM it still takes a job)."""
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Cell index -> the ``slurm_*`` settings of its job (SLURM only)."""
    groups: dict[int, int] = field(default_factory=dict)
    """Cell index -> its submission: cells with equal settings go in one job array."""
    unchecked: set[int] = field(default_factory=set)
    """Cells whose solver has no hook in :data:`CELL_CHECKS` (values not checked)."""
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
    config = yaml.safe_load(Path(config_path).read_text()) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a mapping of benchopt run options, got {config!r}")
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
        check = cell_check(cell.solver)
        if check is None:
            report.unchecked.add(cell.index)
            report.notes.append(f"no preflight hook for solver {cell.solver}: its parameter values are not checked")
            continue
        try:
            reason = check(cell, world)
        except (ValueError, TypeError) as err:
            report.errors[cell.index] = str(err)
            continue
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
