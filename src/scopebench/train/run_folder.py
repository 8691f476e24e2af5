"""One ``scopebench train`` run per output folder: a lock the run holds for its lifetime.

Two runs writing checkpoints into one folder interleave them (each believes the folder is
its own, both exit 0). So a run owns ``<output_dir>/.scopebench_run.lock`` while it lives:
an exclusive :func:`fcntl.flock` on a descriptor it keeps open, the file holding its
``{"pid", "host", "started"}`` so that a second run can say whom it waits for. The kernel
drops the lock when its holder exits in any way (``kill -9`` too), so a dead run never
blocks the folder; its file stays behind, unlocked, and the next run takes it over. The
file lies beside ``checkpoints/``, never inside, so it is never mistaken for a
checkpoint, and its holder removes it at the end.

Who takes it (:func:`own_run_folder`): exactly one process per run.

* The process the user started takes it, before any work. When it relaunches itself on
  several ranks (``accelerate launch``), it keeps holding the lock while they run and
  names itself to them in :data:`OWNER_ENV` (its record, as JSON).
* A rank (under a launcher) other than rank 0 never takes it.
* Rank 0 takes it unless :data:`OWNER_ENV` names the record the lock file holds: then its
  own parent holds the lock for it. So ranks started by hand (``torchrun``, SLURM) are
  protected by their rank 0, and a stale variable names nothing (the record also holds
  the start time, so it matches only the run that wrote it).

What is written is locked too: ``checkpoints/`` may be a link to a scratch disk, and two runs
whose output folders differ may have one checkpoints folder. So the run also holds a lock in
the folder ``<output_dir>/checkpoints`` resolves to (created at set-up), whose record names
its output folder: a second run writing there is refused naming the first and its folder.

Limit: when only the user's process is killed, the ranks it launched may outlive it
unprotected (the launcher normally stops them).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scopebench.atomic import FileLock, read_lock_record

__all__ = ["LOCK_FILE", "OWNER_ENV", "RunFolderLock", "own_run_folder", "read_owner"]

LOCK_FILE = ".scopebench_run.lock"
#: The owner's record (JSON), handed by the owner to the ranks it launches.
OWNER_ENV = "SCOPEBENCH_TRAIN_RUN_OWNER"


def read_owner(output_dir: str | Path) -> dict[str, Any] | None:
    """The record in ``output_dir``'s lock file; None when there is none or it is unreadable
    (its holder has just created it and not yet written it)."""
    return read_lock_record(Path(output_dir) / LOCK_FILE)


class RunFolderLock:
    """The lock on one output folder, held from :meth:`acquire` to :meth:`release`
    (a :class:`scopebench.atomic.FileLock` on :data:`LOCK_FILE`), and on the folder its
    ``checkpoints/`` resolves to (:data:`LOCK_FILE` in it).

    Attributes:
        path: The output folder's lock file.
        owner: The record written into it (``pid``, ``host``, ``started``).
        checkpoints_path: The checkpoints folder's lock file.
    """

    def __init__(self, lock: FileLock, checkpoints: FileLock) -> None:
        self._lock, self.path, self.owner = lock, lock.path, lock.record
        self._checkpoints, self.checkpoints_path = checkpoints, checkpoints.path

    @classmethod
    def acquire(cls, output_dir: str | Path) -> RunFolderLock:
        """Take ``output_dir``'s lock, then its checkpoints folder's (both folders are created
        if needed; ``checkpoints/`` may be a link to another disk), without waiting.

        Raises:
            ValueError: another live run holds either, named by pid, host and start time (and
                its output folder, for the checkpoints folder); ``checkpoints/`` cannot be a
                folder (a dangling link, a file), named.
        """
        folder = Path(output_dir)
        folder.mkdir(parents=True, exist_ok=True)

        def unprotected(err: OSError) -> str:
            return (
                f"scopebench train: warning: cannot lock {folder / LOCK_FILE} ({err.strerror}): a second run into "
                f"output_dir {folder} would not be detected"
            )

        lock = FileLock.acquire(folder / LOCK_FILE, busy=lambda owner: _busy(folder, owner), unprotected=unprotected)
        try:
            return cls(lock, _lock_checkpoints(folder))
        except BaseException:
            lock.release()
            raise

    def release(self) -> None:
        """Remove the lock files, then unlock them (:meth:`scopebench.atomic.FileLock.release`)."""
        self._checkpoints.release()
        self._lock.release()


def _lock_checkpoints(folder: Path) -> FileLock:
    """Lock the folder ``folder/checkpoints`` resolves to, naming ``folder`` in the record."""
    from scopebench.train.checkpoint import CHECKPOINTS

    link = folder / CHECKPOINTS
    try:
        link.mkdir(exist_ok=True)
    except OSError as err:
        target = f" -> {os.readlink(link)}" if link.is_symlink() else ""
        raise ValueError(
            f"output_dir {folder}: {link}{target} cannot be the checkpoints folder ({err.strerror}): it must be "
            "a folder or a link to one"
        ) from None
    real = link.resolve()
    where = f"checkpoints folder {real}" + (f" ({link} -> {real})" if real != folder.resolve() / CHECKPOINTS else "")

    def busy(owner: dict[str, Any] | None) -> str:
        if owner is None:
            who = "whose pid is not written yet: it is starting"
        else:
            who = (
                f"pid {owner.get('pid')} on host {owner.get('host')}, started {owner.get('started')}, "
                f"output_dir {owner.get('output_dir')}"
            )
        return (
            f"{where} is in use by another scopebench train run ({who}): its checkpoints would replace each "
            "other's; wait for it, or give each run a checkpoints folder of its own"
        )

    def unprotected(err: OSError) -> str:
        return (
            f"scopebench train: warning: cannot lock {real / LOCK_FILE} ({err.strerror}): a second run writing "
            f"into {where} would not be detected"
        )

    extra = {"output_dir": str(folder.resolve())}
    return FileLock.acquire(real / LOCK_FILE, busy=busy, unprotected=unprotected, extra=extra)


def _handed_owner() -> dict[str, Any] | None:
    """The record in :data:`OWNER_ENV`; None when it is unset or not a record."""
    try:
        owner = json.loads(os.environ.get(OWNER_ENV, ""))
    except ValueError:
        return None
    return owner if isinstance(owner, dict) else None


def _busy(folder: Path, owner: dict[str, Any] | None) -> str:
    if owner is None:
        who = "whose pid is not written yet: it is starting"
    else:
        who = f"pid {owner.get('pid')} on host {owner.get('host')}, started {owner.get('started')}"
    return (
        f"output_dir {folder} is in use by another scopebench train run ({who}): wait for it or choose "
        "another --output_dir"
    )


@contextlib.contextmanager
def own_run_folder(output_dir: str | Path, *, info: Any = None) -> Iterator[dict[str, str]]:
    """Hold ``output_dir`` for this run when this process is the one that should (see the
    module's docstring); yields the environment variables to give the ranks it launches
    (empty when it holds nothing).

    Args:
        output_dir: The run's output folder (``training.output_dir``).
        info: This process's :class:`~scopebench.distributed.DistInfo` (default: read now).

    Raises:
        ValueError: another live run holds the folder, named.
    """
    from scopebench.distributed import get_dist_info

    info = get_dist_info() if info is None else info
    if info.is_distributed and info.rank != 0:
        yield {}
        return
    if info.is_distributed and _handed_owner() is not None and read_owner(output_dir) == _handed_owner():
        yield {}  # the process that launched this rank holds the lock
        return
    lock = RunFolderLock.acquire(output_dir)
    try:
        yield {OWNER_ENV: json.dumps(lock.owner)}
    finally:
        lock.release()
