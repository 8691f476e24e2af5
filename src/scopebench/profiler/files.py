"""Per-rank output files: unique run names and atomic writes (CSV rows, Chrome traces)."""

from __future__ import annotations

import csv
import gzip
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from scopebench.atomic import atomic_write

__all__ = [
    "METRICS_FILE",
    "OPS_FILE",
    "TRACE_FILE",
    "TRACE_GZIP_LEVEL",
    "new_run_id",
    "run_name",
    "shared_run_name",
    "write_csv",
    "write_exported",
]

#: Per-iteration metrics of one rank (every backend).
METRICS_FILE = "{run_name}_gpu_metrics.csv"
#: Operator rows of one rank (torch backend).
OPS_FILE = "{run_name}_torch_ops.csv"
#: Chrome trace of one rank's profiler cycle ``k`` (torch scheduled mode), gzipped, under the
#: trace folder: one folder per run (every rank's name without its rank) and per cycle, so a
#: cycle folder holds exactly one cycle of one run, every rank's file (what HTA loads).
TRACE_FILE = "{shared_run_name}/cycle{cycle}/{run_name}.pt.trace.json.gz"
#: zlib level of the gzipped traces: 6 (zlib's default) takes a 16.1 MB trace (one rank, 3
#: iterations of the tiny policy under DDP) to 1.02 MB in 0.09 s, 9 (``gzip.open``'s, so
#: torch's own ``.gz`` export) to 0.92 MB in 0.41 s (``gzip.GzipFile``, best of 3, 2-core VM).
TRACE_GZIP_LEVEL = 6


def new_run_id() -> str:
    """Timestamp plus random suffix: unique even for runs started in the same second."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def shared_run_name(name: str, run_id: str) -> str:
    """``<name>_<run_id>``: the run name without the rank, shared by every rank of one run
    (ranks take rank 0's run id), the folder of the run's traces.

    :Examples:
        >>> shared_run_name("pnp/a b", "20260101-000000-abcd1234")
        'pnp-a-b_20260101-000000-abcd1234'
    """
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "run"
    return f"{safe}_{run_id}"


def run_name(name: str, run_id: str, rank: int) -> str:
    """``<name>_<run_id>_rank<rank>``, the stem of every per-rank file.

    :Examples:
        >>> run_name("pnp", "20260101-000000-abcd1234", 1)
        'pnp_20260101-000000-abcd1234_rank1'
    """
    return f"{shared_run_name(name, run_id)}_rank{rank}"


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


def write_exported(
    path: Path, export: Callable[[str], Any], rewrite: Callable[[BinaryIO, BinaryIO], Any] | None = None
) -> Path:
    """Atomically write the file that ``export(filename)`` produces (a Chrome trace).

    Exporters that only take a file name write into a private folder (``mkdtemp``: mode
    0700, unpredictable name) beside ``path``; the result is then copied into an
    :func:`scopebench.atomic.atomic_write` handle, so nobody can redirect the write and a
    reader never sees half a file. A ``path`` ending in ``.gz`` is gzipped on that copy
    (level :data:`TRACE_GZIP_LEVEL`), the exporter writing plain text: torch's own ``.gz``
    export would write one more temporary copy, in the system's temporary folder.
    ``rewrite(src, dst)``, when given, makes that copy itself (the exported bytes from ``src``,
    edited, to ``dst``, before gzip): the ledger's events join a trace that way
    (:mod:`scopebench.profiler.trace_ledger`), with no second copy on disk.

    :Examples:
        >>> import gzip, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "t.json.gz"
        >>> _ = write_exported(path, lambda name: pathlib.Path(name).write_text("{}"))
        >>> gzip.decompress(path.read_bytes())
        b'{}'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Named like atomic_write's temporaries, so a dead process's folder is removed later.
    private = tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        compress = path.name.endswith(".gz")
        scratch = Path(private) / (path.name[: -len(".gz")] if compress else path.name)
        export(str(scratch))
        copy = rewrite or (lambda src, dst: shutil.copyfileobj(src, dst, 1 << 20))
        with open(scratch, "rb") as src, atomic_write(path, "wb") as dst:
            if compress:  # the header names the final file, not the temporary one
                with gzip.GzipFile(path.name, "wb", TRACE_GZIP_LEVEL, dst) as zipped:
                    copy(src, zipped)
            else:
                copy(src, dst)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return path
