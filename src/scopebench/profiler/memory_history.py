"""OOM forensics on CUDA: torch's allocator history over the window, a snapshot per rank.

With ``profiler_memory: true`` on a CUDA device, :class:`MemoryHistory` turns on
``torch.cuda.memory._record_memory_history`` when the first recorded iteration starts and,
at the end of the run, writes ``<stem>_memory_snapshot.pickle`` (``torch.cuda.memory._dump_snapshot``)
in the trace folder (``profiler_trace_dir`` when set, beside the runs' trace folders; else the
CSV files' folder); it opens in PyTorch's memory viewer (https://pytorch.org/memory_viz). An
``torch.OutOfMemoryError`` inside a recorded region writes the snapshot first, then propagates
as a new ``OutOfMemoryError`` naming the file and the per-category breakdown of the last good step
(the original error chained to it).

Every call goes through the ``cuda`` object it is given (``torch.cuda`` in a run, a
recorder in the tests), so the logic runs without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["MAX_ENTRIES", "SNAPSHOT_FILE", "MemoryHistory", "oom_message"]

#: Allocation events kept (torch's ring buffer; 100 000 is its documentation's example).
MAX_ENTRIES = 100_000
SNAPSHOT_FILE = "{stem}_memory_snapshot.pickle"


def oom_message(region: str, path: Path | None, last_step_mb: dict[str, float] | None, error: BaseException) -> str:
    """The message of the OOM a run reports.

    :Examples:
        >>> print(oom_message("bwd", Path("out/r_memory_snapshot.pickle"), {"parameters": 10.0, "activations": 80.5},
        ...                   RuntimeError("CUDA out of memory")))  # doctest: +NORMALIZE_WHITESPACE
        out of memory in region 'bwd'; memory snapshot: out/r_memory_snapshot.pickle (open it in
        https://pytorch.org/memory_viz); last good step's peak by category: parameters 10.0 MB,
        activations 80.5 MB (total 90.5 MB); torch said: CUDA out of memory
    """
    where = f"memory snapshot: {path} (open it in https://pytorch.org/memory_viz)" if path else "no memory snapshot"
    if last_step_mb:
        parts = ", ".join(f"{key} {value:.1f} MB" for key, value in last_step_mb.items() if value)
        last = f"last good step's peak by category: {parts} (total {sum(last_step_mb.values()):.1f} MB)"
    else:
        last = "no step finished before it"
    return f"out of memory in region {region!r}; {where}; {last}; torch said: {str(error).splitlines()[0]}"


class MemoryHistory:
    """The allocator history of one rank over the recording window.

    Args:
        cuda: ``torch.cuda`` (or a recorder with ``memory._record_memory_history`` and
            ``memory._dump_snapshot``).
        where: ``() -> (folder, stem)`` of this rank's snapshot file.
    """

    def __init__(self, cuda: Any, where: Callable[[], tuple[Path, str]]) -> None:
        self.cuda = cuda
        self.where = where
        self.recording = False
        self.path: Path | None = None

    def start(self) -> None:
        """Record from now on (idempotent: the window's first iteration starts it)."""
        if not self.recording:
            self.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
            self.recording = True

    def dump(self) -> Path | None:
        """Write the snapshot (once); None when nothing was recorded or it could not be written."""
        if not self.recording:
            return self.path
        folder, stem = self.where()
        path = Path(folder) / SNAPSHOT_FILE.format(stem=stem)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.cuda.memory._dump_snapshot(str(path))
        except OSError as exc:
            import warnings

            warnings.warn(f"profiler_memory: could not write {str(path)!r} ({exc})", RuntimeWarning, stacklevel=2)
            path = None
        self.stop()
        self.path = path
        return path

    def stop(self) -> None:
        if self.recording:
            self.recording = False
            self.cuda.memory._record_memory_history(enabled=None)

    def fail(self, region: str, error: BaseException, last_step_mb: dict[str, float] | None) -> None:
        """An error left ``region``: for an OOM write the snapshot, then raise the named OOM."""
        import torch

        if not isinstance(error, torch.OutOfMemoryError) or getattr(error, "_scopebench_named", False):
            return
        path = self.dump()
        named = torch.OutOfMemoryError(oom_message(region, path, last_step_mb, error))
        named._scopebench_named = True
        raise named from error
