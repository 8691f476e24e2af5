"""Check a benchopt run before submitting it: the grid, every cell's parameters, the SLURM jobs.

What it checks, without submitting anything or loading any data: the grid ``--config``
expands to (benchopt's rules, the benchmark's own defaults); every cell's parameter values
and process layout, with the checks its solver runs (``slurm_ntasks_per_node`` against
``nproc_per_node`` and the ``distribute_*`` flags, GPUs per task, operators or tiles per
rank...), evaluated as inside the cell's job (its SLURM tasks are its ranks); the
parallel config as benchopt 1.10 reads it (``-j`` with the submitit backend, keys
Submitit refuses such as ``slurm_python``, a ``slurm_time`` under 5 minutes); and each
cell's job, merged as benchopt merges it and written by Submitit's sbatch writer.

Run from the repository root, with the arguments ``benchopt run`` will get::

    scopebench check-config benchmark_inference \\
        --config benchmark_inference/configs/experiments/strong_scaling.yml \\
        --parallel-config configs/parallel/slurm.yml [--sbatch] [--json]

Exit status 0 when no cell is invalid, 1 when one is (each named with its index,
parameters and the key at fault), 2 when a file cannot be used (``-j`` with the submitit
backend among them). Cells the solver would decline (``skip``: a 2-D denoiser on a
volume...) are listed, not counted as invalid; on SLURM each still takes a job. ``--json`` prints
``{"benchmark", "backend", "cluster", "n_repetitions", "submissions", "ok",
"cells": [{"index", "solver", "solver_params", "dataset", "dataset_params", "error",
"skip", "job", "submission"}], "notes"}`` where ``solver_params``/``dataset_params`` are the
values the config set, ``job`` the cell's ``slurm_*`` settings (SLURM only) and
``submission`` the index of the sbatch call it belongs to (cells with equal settings
share a job array) and ``layout`` its ranks ``{"nodes", "ranks_per_node", "world_size",
"spawned"}`` (:func:`scopebench.cluster.job_layout`: every SLURM task is one rank; a cell
whose ``nproc_per_node`` disagrees with its job's ``slurm_nodes`` x ``slurm_ntasks_per_node``
is invalid).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scopebench.commands._common import print_json, refuses

HELP = "check a benchopt config (and parallel config) before submitting it; submits nothing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark", help="benchmark folder (., benchmark_inference, benchmark_training)")
    parser.add_argument("--config", required=True, help="the run config YAML given to benchopt run --config")
    parser.add_argument("--parallel-config", default=None, help="the YAML given to benchopt run --parallel-config")
    parser.add_argument("-j", "--n-jobs", type=int, default=None, help="the -j that benchopt run would get")
    parser.add_argument(
        "--cluster",
        choices=("slurm", "local"),
        default=None,
        help="where Submitit runs the jobs (default: SLURM when srun is on the PATH, as Submitit decides)",
    )
    parser.add_argument("--sbatch", action="store_true", help="also print each submission's sbatch script")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


_FIRST = ("slurm_nodes", "slurm_ntasks_per_node", "slurm_gres", "slurm_time", "slurm_partition")
_HIDDEN = ("slurm_setup", "slurm_array_parallelism", "slurm_additional_parameters", "slurm_srun_args")


def _resources(job: dict) -> str:
    """``nodes=1 ntasks_per_node=2 gres=gpu:2 time=... partition=... cpus-per-task=4 ...``."""
    keys = [k for k in _FIRST if k in job] + [k for k in job if k not in _FIRST and k not in _HIDDEN]
    parts = [f"{key.removeprefix('slurm_')}={job[key]}" for key in keys]
    parts += [f"{key}={value}" for key, value in (job.get("slurm_additional_parameters") or {}).items()]
    if job.get("slurm_srun_args"):
        parts.append("ranks run under: " + " ".join(map(str, job["slurm_srun_args"])))
    return " ".join(parts)


def _layout_json(layout) -> dict | None:
    if layout is None:
        return None
    return {
        "nodes": layout.nodes,
        "ranks_per_node": layout.ranks_per_node,
        "world_size": layout.world_size,
        "spawned": layout.spawned,
    }


def _layout_text(layout) -> str:
    """``ranks: 2 node(s) x 2 task(s) per node = world size 4`` (or the ranks one task spawns)."""
    if layout.spawned:
        return f"ranks: 1 process spawning {layout.ranks_per_node} on 1 node = world size {layout.world_size}"
    return f"ranks: {layout.nodes} node(s) x {layout.ranks_per_node} task(s) per node = world size {layout.world_size}"


def _as_json(report) -> dict:
    return {
        "benchmark": report.benchmark,
        "backend": report.backend,
        "cluster": report.cluster,
        "n_repetitions": report.n_repetitions,
        "submissions": report.submissions(),
        "ok": report.ok,
        "cells": [
            {
                "index": cell.index,
                "solver": cell.solver,
                "solver_params": cell.solver_set,
                "dataset": cell.dataset,
                "dataset_params": cell.dataset_set,
                "error": report.errors.get(cell.index),
                "skip": report.skips.get(cell.index),
                "job": report.jobs.get(cell.index),
                "submission": report.groups.get(cell.index),
                "layout": _layout_json(report.layouts.get(cell.index)),
            }
            for cell in report.cells
        ],
        "notes": report.notes,
    }


def _print_text(report, show_sbatch: bool) -> None:
    from scopebench.preflight import JOB_FOLDER, sbatch_script

    where = {None: "in the benchopt process", "local": "as local Submitit jobs", "slurm": "as SLURM jobs"}
    reps = report.n_repetitions
    print(f"{report.benchmark}: {len(report.cells)} cell(s) x {reps} repetition(s), run {where[report.cluster]}")
    members: dict[int, list[int]] = {}
    for index, group in report.groups.items():
        members.setdefault(group, []).append(index)
    for cell in report.cells:
        if cell.index in report.errors:
            status = f"INVALID: {report.errors[cell.index]}"
        elif cell.index in report.skips:
            status = f"would be skipped: {report.skips[cell.index]}"
        elif cell.index in report.unchecked:
            status = "values not checked (no preflight hook)"
        else:
            status = "ok"
        print(f"  {cell.label()}: {status}")
        if cell.index in report.layouts:
            print(f"      {_layout_text(report.layouts[cell.index])}")
        if cell.index in report.jobs:
            group = report.groups[cell.index]
            size = len(members[group]) * reps
            kind = f"job array {group} ({size} jobs)" if size > 1 else f"job {group}"
            print(f"      {kind}: {_resources(report.jobs[cell.index])}")
    for note in report.notes:
        print(f"  note: {note}")
    if show_sbatch and report.jobs:
        for group, indices in sorted(members.items()):
            print(f"\n# submission {group} (cells {', '.join(f'#{i}' for i in indices)})")
            print(sbatch_script(report.jobs[indices[0]], Path(report.benchmark).resolve() / JOB_FOLDER))
    invalid = len(report.errors)
    if report.cluster == "slurm":
        total = f"{report.submissions()} sbatch submission(s)"
    else:
        total = f"{len(report.cells) * reps} run(s)"
    verdict = f"{invalid} invalid cell(s)" if invalid else "no invalid cell"
    if report.skips:
        verdict += f", {len(report.skips)} the solver would skip"
    print(f"{verdict}; would make {total}; nothing was submitted")


@refuses("check-config", errors=(OSError, ValueError))
def run(args: argparse.Namespace) -> int:
    from scopebench.preflight import preflight

    report = preflight(args.benchmark, args.config, args.parallel_config, n_jobs=args.n_jobs, cluster=args.cluster)
    if args.json:
        print_json(_as_json(report))
    else:
        _print_text(report, args.sbatch)
    return 0 if report.ok else 1
