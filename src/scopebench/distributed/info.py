"""Rank discovery: the one place that reads the launcher's environment variables.

Sources, in order of precedence (docs/design.md, "Ranks and launch"):

* ``torchrun`` / ``accelerate launch``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT``.
* ``slurm``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` when more than one task
  runs (submitit starts one process per task); the rendezvous is always the first node of
  the step's node list (a ``MASTER_ADDR`` is ignored: sbatch copies the submitting shell's
  environment into the job, where it names the login node or ``localhost``), on a port
  derived from the job id (``MASTER_PORT`` when set).
* ``spawn``: a worker started by :mod:`scopebench.distributed.launch` (``SCOPEBENCH_RANK`` …); its
  rendezvous is a file store in the run's private temporary folder (port 0).
* ``single``: none of the above.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DistInfo", "get_dist_info", "is_main", "writes_reports", "SPAWN_ENV"]

#: Environment variables that :mod:`scopebench.distributed.launch` hands to spawned workers.
SPAWN_ENV = {
    "rank": "SCOPEBENCH_RANK",
    "world_size": "SCOPEBENCH_WORLD_SIZE",
    "store_addr": "SCOPEBENCH_STORE_ADDR",
    "store_port": "SCOPEBENCH_STORE_PORT",
    "store_file": "SCOPEBENCH_STORE_FILE",
    "run_dir": "SCOPEBENCH_RUN_DIR",
    "lifeline": "SCOPEBENCH_LIFELINE_FD",
    "timeout": "SCOPEBENCH_GROUP_TIMEOUT_SEC",
}


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in a (possibly single-process) run."""

    rank: int
    """Global rank, 0-based."""
    local_rank: int
    """Rank on this node (selects the GPU)."""
    world_size: int
    """Number of processes in the run."""
    master_addr: str
    """Host of rank 0's rendezvous (or the spawn store)."""
    master_port: int
    """Port of the rendezvous; 0 when unknown (single process)."""
    source: str
    """One of ``"torchrun"``, ``"slurm"``, ``"spawn"``, ``"single"``."""
    nodes: int = 1
    """Nodes the ranks run on (``SLURM_JOB_NUM_NODES``; torchrun: ``WORLD_SIZE / LOCAL_WORLD_SIZE``)."""

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list.

    :Examples:
        >>> _first_slurm_host("gpu[012-015,020],cpu01")
        'gpu012'
        >>> _first_slurm_host("node7")
        'node7'
    """
    match = re.match(r"^([^\[,]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"cannot parse SLURM node list {nodelist!r}")
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ValueError(f"environment variable {key} must be an integer, got {env[key]!r}") from None


def get_dist_info(environ: Mapping[str, str] | None = None) -> DistInfo:
    """Read rank, world size and rendezvous from the environment.

    Args:
        environ: Mapping to read instead of ``os.environ`` (tests).
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world, local = _int(env, "WORLD_SIZE"), _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 0
        return DistInfo(
            rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            world_size=_int(env, "WORLD_SIZE"),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500,
            source="torchrun",
            nodes=world // local if local and world % local == 0 else 1,
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        ntasks = _int(env, "SLURM_NTASKS")
        if ntasks > 1:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            if not nodelist:
                raise ValueError(
                    "SLURM_PROCID and SLURM_NTASKS are set but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST: "
                    "the rendezvous host (the job's first node) is unknown"
                )
            nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
            # A port every task derives alike from the job id, away from the usual 29500.
            job = env.get("SLURM_JOB_ID", "0")
            port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else 20000 + zlib.crc32(job.encode()) % 20000
            return DistInfo(
                rank=_int(env, "SLURM_PROCID"),
                local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
                world_size=ntasks,
                master_addr=_first_slurm_host(nodelist),
                master_port=port,
                source="slurm",
                nodes=int(nodes) if nodes and nodes.isdigit() else 1,
            )
    if SPAWN_ENV["rank"] in env:
        return DistInfo(
            rank=_int(env, SPAWN_ENV["rank"]),
            local_rank=_int(env, SPAWN_ENV["rank"]),
            world_size=_int(env, SPAWN_ENV["world_size"]),
            master_addr=env.get(SPAWN_ENV["store_addr"], "127.0.0.1"),
            master_port=_int(env, SPAWN_ENV["store_port"]) if SPAWN_ENV["store_port"] in env else 0,
            source="spawn",
        )
    return DistInfo(rank=0, local_rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, source="single")


def _current_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return get_dist_info().rank


def is_main() -> bool:
    """True on global rank 0 (of the initialised group, else of the environment)."""
    return _current_rank() == 0


def writes_reports() -> bool:
    """The one rule for who writes run-level reports and summaries: rank 0 only.

    Per-rank files (profiler CSVs, traces) are written by every rank and carry the rank
    in their name; this function decides only for files that exist once per run.
    """
    return is_main()
