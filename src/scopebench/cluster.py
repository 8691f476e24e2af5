"""Submitting through Submitit as benchopt 1.10 does: its parallel config, each job's SLURM settings, its sbatch script.

benchopt reads ``--parallel-config`` (:func:`read_parallel_config`), hands every key but
``backend`` to ``submitit.AutoExecutor.update_parameters`` and submits each
(dataset, objective, solver, repetition) as one job whose settings are the parallel
config, then the solver's static ``slurm_params``, then its ``slurm_*`` parameters
(:func:`job_parameters`). Cells with equal settings go in one job array. These functions
reproduce that without submitting, for ``scopebench check-config``; Submitit's own
parameter check and sbatch writer do the validation.

Facts of benchopt 1.10 + Submitit 1.5 these rest on (tests/slurm/test_parallel_configs.py
holds canaries): ``-j`` (``n_jobs``) reaches ``update_parameters`` and fails; so does
``slurm_python`` (Submitit takes ``python`` only in the executor's constructor); a missing
``slurm_time`` becomes ``00:<1.5 x timeout>`` (minutes:seconds); Submitit adds
``--signal=USR2@90``, so a time limit under :data:`MIN_SLURM_MINUTES` kills jobs at start.

After a run, :func:`job_ids` lists the jobs it submitted (from its job folder),
:func:`job_states` asks SLURM what became of them (``scontrol show job``) and
:func:`cancel_unfinished` cancels those still queued or running: a job whose node was cut
off keeps its ``srun`` waiting on the other nodes long after the run has its answer.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scopebench.validate import integer, load_yaml, optional, quote

__all__ = [
    "BENCHOPT_DEFAULT_TIMEOUT_SEC",
    "JOB_FOLDER",
    "MIN_SLURM_MINUTES",
    "SLURM_PARAMETERS",
    "CellLayout",
    "Layout",
    "cancel_unfinished",
    "cell_layout",
    "describe_jobs",
    "gres_gpu_count",
    "job_ids",
    "job_layout",
    "job_parameters",
    "job_states",
    "launcher_world_size",
    "read_parallel_config",
    "sbatch_script",
    "slurm_minutes",
]

#: Submitit asks SLURM for USR2 90 s before a job's end: shorter jobs die as they start.
MIN_SLURM_MINUTES = 5
#: benchopt's folder for Submitit's pickles, scripts and logs (``benchopt.benchmark.SLURM_JOB_NAME``).
JOB_FOLDER = "benchopt_run"
#: benchopt 1.10's ``default_timeout`` setting, from which it derives a missing ``slurm_time``.
BENCHOPT_DEFAULT_TIMEOUT_SEC = 100


def slurm_minutes(value: Any) -> float:
    """Minutes of a SLURM time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``, or int minutes).

    :Examples:
        >>> slurm_minutes("00:30:00"), slurm_minutes("1-00:00:00"), slurm_minutes("00:150"), slurm_minutes(10)
        (30.0, 1440.0, 2.5, 10.0)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"slurm_time must be a SLURM time such as '01:30:00', got {value!r}")
    if not isinstance(value, str):
        return float(value)
    days, _, rest = value.strip().rpartition("-")
    try:
        parts = [float(p) for p in rest.split(":")]
        day = float(days) if days else 0.0
    except ValueError:
        raise ValueError(f"slurm_time must be a SLURM time such as '01:30:00', got {value!r}") from None
    if len(parts) > 3:
        raise ValueError(f"slurm_time must be a SLURM time such as '01:30:00', got {value!r}")
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        units = (3600, 60, 1)
    else:  # MM, MM:SS, HH:MM:SS
        units = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(parts)]
    seconds = sum(p * u for p, u in zip(parts, units))
    return day * 1440 + seconds / 60


def read_parallel_config(path: str | Path, n_jobs: int | None = None) -> dict[str, Any]:
    """A ``--parallel-config`` file as benchopt 1.10 reads it, refused where benchopt would fail.

    Raises:
        ValueError: naming the key: no or an unknown ``backend``; ``-j``/``n_jobs`` with
            the submitit backend (benchopt 1.10 passes it to Submitit, which fails); a key
            Submitit does not accept (``slurm_python`` among them); a ``slurm_time`` under
            :data:`MIN_SLURM_MINUTES` minutes.
    """
    config = load_yaml(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {quote(config)}")
    backend = config.get("backend")
    if backend not in ("loky", "dask", "submitit"):
        raise ValueError(f"{path}: backend must be one of loky, dask, submitit, got {quote(backend)}")
    if isinstance(config.get("slurm_time"), int):
        # benchopt's reading: YAML turns an unquoted 10:30 into seconds.
        hours, rest = divmod(config["slurm_time"], 3600)
        config["slurm_time"] = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    if backend != "submitit":
        return config
    if n_jobs is not None or "n_jobs" in config:
        raise ValueError(
            f"{path}: -j/n_jobs cannot be combined with backend: submitit (benchopt 1.10 hands it to "
            "Submitit, which fails); Submitit runs one job per cell, slurm_array_parallelism bounds how many at once"
        )
    if "slurm_python" in config:
        raise ValueError(
            f"{path}: slurm_python is not accepted by benchopt 1.10 (Submitit takes `python` only when its "
            "executor is built); wrap each rank with slurm_srun_args, as configs/parallel/slurm_nsys.yml does"
        )
    # What benchopt hands Submitit: every key made a slurm_* one (so local_* settings fail).
    _check_submitit_keys(path, job_parameters(config, {}))
    if "slurm_time" in config and slurm_minutes(config["slurm_time"]) < MIN_SLURM_MINUTES:
        raise ValueError(
            f"{path}: slurm_time={config['slurm_time']!r} is under {MIN_SLURM_MINUTES} minutes; Submitit's "
            "USR2 signal 90 s before the end kills such jobs as they start"
        )
    return config


def _check_submitit_keys(path: str | Path, settings: dict[str, Any]) -> None:
    import tempfile

    import submitit

    with tempfile.TemporaryDirectory() as folder:
        executor = submitit.AutoExecutor(folder, cluster="local")  # validates keys of every executor
        try:
            executor.update_parameters(**settings)
        except (NameError, ValueError, AssertionError) as err:
            first = str(err).splitlines()[0]
            raise ValueError(f"{path}: Submitit refuses these settings: {first}") from None


def job_parameters(
    parallel: Mapping[str, Any],
    solver_params: Mapping[str, Any],
    static: Mapping[str, Any] | None = None,
    *,
    drop_none: bool = True,
) -> dict[str, Any]:
    """The ``slurm_*`` settings of one cell's job, merged as benchopt 1.10 merges them.

    The parallel config, then the solver's static ``slurm_params``, then its ``slurm_*``
    parameters, each key reduced to Submitit's name (``slurm_tasks_per_node`` is
    ``slurm_ntasks_per_node``); ``None`` values are dropped as Submitit drops them (kept
    with ``drop_none=False``: benchopt groups cells into job arrays by the settings with
    them).

    :Examples:
        >>> job_parameters({"backend": "submitit", "slurm_time": "01:00:00"}, {"slurm_ntasks_per_node": 2, "slurm_gres": None, "lr": 1})
        {'slurm_time': '01:00:00', 'slurm_ntasks_per_node': 2}
    """
    from submitit.slurm.slurm import SlurmExecutor

    renames = SlurmExecutor._equivalence_dict()
    merged: dict[str, Any] = {}
    for source in (parallel, static or {}, {k: v for k, v in solver_params.items() if k.startswith("slurm_")}):
        for key, value in source.items():
            if key == "backend":
                continue
            bare = key.removeprefix("slurm_")
            merged["slurm_" + renames.get(bare, bare)] = value
    return {key: value for key, value in merged.items() if value is not None or not drop_none}


@dataclass(frozen=True)
class Layout:
    """The ranks of a run: how many nodes, how many per node, and who starts them."""

    nodes: int
    ranks_per_node: int
    spawned: bool
    """The run's one process starts its other ranks itself (no launcher, or a job of one task)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


def job_layout(
    nproc_per_node: Any,
    slurm_nodes: Any = 1,
    slurm_ntasks_per_node: Any = None,
    *,
    launcher: str = "SLURM",
    key: str = "nproc_per_node",
) -> Layout:
    """The one rule for how ``nproc_per_node``, ``slurm_nodes`` and ``slurm_ntasks_per_node`` combine.

    Every SLURM task is one rank: a job of ``slurm_nodes`` x ``slurm_ntasks_per_node``
    tasks (unset: 1 per node) has that world size, and nothing is spawned. ``nproc_per_node``
    counts the ranks on each node, so in such a job it must equal ``slurm_ntasks_per_node``
    (``1`` is accepted too, meaning "the launcher's ranks"). Only a job of one task
    (or a run without a launcher) spawns its ranks itself: ``nproc_per_node`` on its node.
    The same rule holds under torchrun (``launcher``), its nodes and ranks per node in place
    of the job's.

    :Examples:
        >>> job_layout(2, 2, 2).world_size, job_layout(1, 2, 2).world_size, job_layout(4).world_size
        (4, 4, 4)
        >>> job_layout(4, 2, 2)
        Traceback (most recent call last):
        ...
        ValueError: nproc_per_node=4 disagrees with 2 node(s) x 2 task(s) per node (SLURM): every task is one rank, so nproc_per_node (ranks per node) must be 2, or 1 for the launcher's ranks
    """
    nproc = integer(key, nproc_per_node, low=1)
    nodes = integer("slurm_nodes", slurm_nodes, low=1)
    tasks = optional(integer, "slurm_ntasks_per_node", slurm_ntasks_per_node, low=1) or 1
    if nodes * tasks == 1:
        return Layout(nodes=1, ranks_per_node=nproc, spawned=nproc > 1)
    if nproc not in (1, tasks):
        raise ValueError(
            f"{key}={nproc} disagrees with {nodes} node(s) x {tasks} task(s) per node ({launcher}): "
            f"every task is one rank, so {key} (ranks per node) must be {tasks}, or 1 for the launcher's ranks"
        )
    return Layout(nodes=nodes, ranks_per_node=tasks, spawned=False)


def cell_layout(
    nproc_per_node: Any,
    slurm_nodes: Any = 1,
    slurm_ntasks_per_node: Any = None,
    launcher_world_size: int | None = None,
) -> Layout:
    """The ranks one grid cell runs with: :func:`job_layout` under a launcher, else ``nproc_per_node`` spawned here.

    ``launcher_world_size`` is the ranks a launcher started (the SLURM tasks of the cell's
    job, torchrun's world), ``None`` for one process: no ``--parallel-config``, Submitit's
    local executor, or a SLURM job of one task. That process spawns ``nproc_per_node``
    ranks on its machine, so the cell's ``slurm_nodes`` must be 1, and its SLURM keys must
    still follow :func:`job_layout` (a cell accepted here is accepted on the cluster, though
    ``nproc_per_node: 1`` with 2 tasks per node is one rank here and two there).
    Every solver's check and ``scopebench check-config`` take a cell's world size from here.

    :Examples:
        >>> cell_layout(2, 1, 2).world_size, cell_layout(1, 1, 2).world_size, cell_layout(1, 1, 2, 2).world_size
        (2, 1, 2)
        >>> cell_layout(1, 2, 1)
        Traceback (most recent call last):
        ...
        ValueError: slurm_nodes=2 needs a SLURM or torchrun launch; this run is a single local process
    """
    nodes = integer("slurm_nodes", slurm_nodes, low=1)
    if launcher_world_size is None and nodes > 1:
        raise ValueError(f"slurm_nodes={nodes} needs a SLURM or torchrun launch; this run is a single local process")
    layout = job_layout(nproc_per_node, nodes, slurm_ntasks_per_node)
    if launcher_world_size is None:
        nproc = int(nproc_per_node)  # an integer >= 1: job_layout checked it
        return Layout(nodes=1, ranks_per_node=nproc, spawned=nproc > 1)
    return layout


def gres_gpu_count(gres: str | None) -> int | None:
    """GPUs per node requested by a SLURM ``--gres`` string, ``None`` when it names none.

    :Examples:
        >>> gres_gpu_count("gpu:4"), gres_gpu_count("gpu:a100:2"), gres_gpu_count(None)
        (4, 2, None)
    """
    if gres is None:
        return None
    if not isinstance(gres, str):
        raise ValueError(f"slurm_gres must be a string such as 'gpu:4', got {gres!r}")
    match = re.search(r"gpu(?::[A-Za-z0-9_\-]+)?:(\d+)", gres)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, kw_only=True)
class CellLayout:
    """A grid cell's ranks and SLURM job: the layout parameters of every solver, one definition.

    Every solver that runs on several ranks takes its grid's ``nproc_per_node`` and
    ``slurm_*`` parameters, defaults included, from these fields
    (``scopebench.parameters.solver_parameters(CellLayout)``; the policy's ``nproc_per_node``
    is a run setting, so its solvers take :data:`SLURM_PARAMETERS` only), and reads a cell's
    values back with :meth:`from_params`. Validated when built.
    """

    nproc_per_node: int = 1
    """Processes per node (local spawn, torchrun or SLURM tasks)."""
    slurm_nodes: int = 1
    """Nodes; more than one needs a SLURM (or torchrun) launch."""
    slurm_ntasks_per_node: int | None = None
    """SLURM tasks per node (each task one rank; :func:`job_layout`); None: one."""
    slurm_gres: str | None = None
    """SLURM generic resources, e.g. ``gpu:4`` (one GPU per task); None: none asked for."""

    def __post_init__(self) -> None:
        integer("nproc_per_node", self.nproc_per_node, low=1)
        integer("slurm_nodes", self.slurm_nodes, low=1)
        optional(integer, "slurm_ntasks_per_node", self.slurm_ntasks_per_node, low=1)
        gres_gpu_count(self.slurm_gres)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CellLayout:
        """The layout of a cell from its solver parameters (the fields it has; the rest default).

        :Examples:
            >>> CellLayout.from_params({"nproc_per_node": 2, "lr": 1}).slurm_nodes
            1
        """
        return cls(**{f.name: params[f.name] for f in dataclasses.fields(cls) if f.name in params})

    def ranks(self, launcher_world_size: int | None = None) -> Layout:
        """The ranks the cell runs with (:func:`cell_layout`, ``ValueError`` when the counts disagree)."""
        return cell_layout(self.nproc_per_node, self.slurm_nodes, self.slurm_ntasks_per_node, launcher_world_size)


#: The cell's SLURM job parameters: the ``slurm_*`` fields of :class:`CellLayout`.
SLURM_PARAMETERS = tuple(f.name for f in dataclasses.fields(CellLayout) if f.name.startswith("slurm_"))


def launcher_world_size(job: Mapping[str, Any]) -> int | None:
    """SLURM tasks of a job (``nodes x ntasks_per_node``), ``None`` when it runs one task."""
    nodes = job.get("slurm_nodes", CellLayout.slurm_nodes) or CellLayout.slurm_nodes
    world = int(nodes) * int(job.get("slurm_ntasks_per_node") or 1)
    return world if world > 1 else None


def sbatch_script(job: Mapping[str, Any], folder: str | Path, python: str | None = None) -> str:
    """The sbatch script Submitit would write for one job (``ValueError`` for an unknown key)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = {key.removeprefix("slurm_"): value for key, value in job.items()}
    for key in ("python", "array_parallelism", "map_count"):
        params.pop(key, None)
    command = f"{python or sys.executable} -u -m submitit.core._submit {folder}"
    try:
        return _make_sbatch_string(command=command, folder=str(folder), **params)
    except TypeError as err:
        raise ValueError(f"Submitit cannot write an sbatch script from these settings: {err}") from None


#: SLURM job states in which a job still holds (or waits for) nodes.
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED")
#: Fields of ``scontrol show job`` quoted in a failed run's error.
REPORTED_FIELDS = ("JobState", "Reason", "ExitCode", "NodeList", "RunTime")
_SUBMITTED = re.compile(r"^(\d+(?:_\d+)?)_submitted\.pkl$")


def job_ids(folder: str | Path) -> list[str]:
    """The SLURM jobs Submitit submitted from ``folder`` (``<id>_submitted.pkl``; arrays ``<id>_<i>``).

    :Examples:
        >>> job_ids("/nonexistent")
        []
    """
    folder = Path(folder)
    found = [m.group(1) for p in folder.glob("*_submitted.pkl") if (m := _SUBMITTED.match(p.name))]
    return sorted(found, key=lambda j: tuple(int(x) for x in j.split("_")))


def job_states(ids: list[str], env: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """SLURM's record of each job (``scontrol show job --oneliner``), ``{}`` for one it no longer
    knows or where ``scontrol`` is missing."""
    env = {**os.environ, **(env or {})}
    if not ids or shutil.which("scontrol", path=env.get("PATH")) is None:
        return {}
    out = {}
    for job in ids:
        proc = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True, env=env, timeout=30
        )
        fields = dict(tok.split("=", 1) for tok in proc.stdout.split() if "=" in tok) if proc.returncode == 0 else {}
        if fields:
            out[job] = fields
    return out


def cancel_unfinished(states: Mapping[str, Mapping[str, str]], env: Mapping[str, str] | None = None) -> list[str]:
    """``scancel`` the jobs of ``states`` (:func:`job_states`) still queued or running; their ids."""
    left = [job for job, fields in states.items() if fields.get("JobState") in ACTIVE_STATES]
    if left:
        env = {**os.environ, **(env or {})}
        subprocess.run(["scancel", *left], capture_output=True, text=True, env=env, timeout=30)
    return left


def describe_jobs(states: Mapping[str, Mapping[str, str]], cancelled: list[str] = ()) -> str:
    """One line per job: SLURM's state, reason, exit code, nodes and run time (for an error).

    :Examples:
        >>> describe_jobs({"7": {"JobState": "NODE_FAIL", "Reason": "NodeDown", "NodeList": "n[1-2]"}})
        'job 7: JobState=NODE_FAIL Reason=NodeDown NodeList=n[1-2]'
    """
    lines = []
    for job, fields in states.items():
        facts = " ".join(f"{key}={fields[key]}" for key in REPORTED_FIELDS if key in fields)
        lines.append(f"job {job}: {facts}" + (" (still running: cancelled by this run)" if job in cancelled else ""))
    return "\n".join(lines)
