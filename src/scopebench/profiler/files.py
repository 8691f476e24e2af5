"""Per-rank output files: unique run names and atomic CSV writes."""

from __future__ import annotations

import csv
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["METRICS_FILE", "OPS_FILE", "new_run_id", "run_name", "write_csv"]

#: Per-iteration metrics of one rank (every backend).
METRICS_FILE = "{run_name}_gpu_metrics.csv"
#: Operator rows of one rank (torch backend).
OPS_FILE = "{run_name}_torch_ops.csv"


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

    The file appears complete or not at all: it is written beside its destination and
    renamed, so a run that fails mid-write leaves nothing half-written.
    """
    rows = list(rows)
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(columns), restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
