"""Per-rank output files: unique run names and atomic writes (CSV rows, Chrome traces)."""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from scopebench.atomic import atomic_write

__all__ = ["METRICS_FILE", "OPS_FILE", "TRACE_FILE", "new_run_id", "run_name", "write_csv", "write_exported"]

#: Per-iteration metrics of one rank (every backend).
METRICS_FILE = "{run_name}_gpu_metrics.csv"
#: Operator rows of one rank (torch backend).
OPS_FILE = "{run_name}_torch_ops.csv"
#: Chrome trace of one rank's profiler cycle (torch scheduled mode); cycles after the
#: first insert ``.cycle<k>`` before ``.pt.trace.json``.
TRACE_FILE = "{run_name}.pt.trace.json"


def new_run_id() -> str:
    """Timestamp plus random suffix: unique even for runs started in the same second."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def run_name(name: str, run_id: str, rank: int) -> str:
    """``<name>_<run_id>_rank<rank>``, the stem of every per-rank file.

    :Examples:
        >>> run_name("pnp", "20260101-000000-abcd1234", 1)
        'pnp_20260101-000000-abcd1234_rank1'
    """
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "run"
    return f"{safe}_{run_id}_rank{rank}"


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``rows`` (union of their keys, first-seen order) atomically to ``path``.

    The file appears complete or not at all (:func:`scopebench.atomic.atomic_write`).
    """
    rows = list(rows)
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    with atomic_write(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_exported(path: Path, export: Callable[[str], Any]) -> Path:
    """Atomically write the file that ``export(filename)`` produces (a Chrome trace).

    Exporters that only take a file name write into a private folder (``mkdtemp``: mode
    0700, unpredictable name) beside ``path``; the result is then copied into an
    :func:`scopebench.atomic.atomic_write` handle, so nobody can redirect the write and a
    reader never sees half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Named like atomic_write's temporaries, so a dead process's folder is removed later.
    private = tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        scratch = Path(private) / path.name
        export(str(scratch))
        with open(scratch, "rb") as src, atomic_write(path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return path
