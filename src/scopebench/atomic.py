"""The one home of atomic writes: a file or a folder appears complete or not at all.

Everything the suite writes that a reader could mistake for finished (per-rank CSVs,
Chrome traces, weights, datasets, checkpoints, JSON reports) goes through here:

* :func:`atomic_write` opens a temporary file made with :func:`tempfile.mkstemp` in the
  target folder (unpredictable name, ``O_EXCL``: a planted symlink cannot redirect the
  write), and renames it over the target with :func:`os.replace` when the block ends
  without error; on error the temporary file is removed.
* :func:`atomic_dir` does the same for a folder (:func:`tempfile.mkdtemp` beside the final
  name, then a rename); :func:`temporary_dir` and :func:`replace_dir` are its two halves,
  for a folder that several processes fill together (a multi-rank checkpoint).

Permissions are those :func:`open` and :func:`os.mkdir` would give under the user's umask
(``0666 & ~umask`` for a file, ``0777 & ~umask`` for a folder), not mkstemp's and mkdtemp's
private 0600 / 0700: colleagues on a shared cluster read each other's results as they read
any file the user writes. The temporary is private while it is written and takes the
user's permissions just before it gets its final name.

Temporary names are ``.<name>.<pid>.<random>.tmp``, so :func:`remove_stale_temporaries`
can remove those left by a process that died (a second Ctrl-C, ``kill -9``) before the
next write of the same name.

A write that fails leaves its target as it was; :func:`no_space` tells whether the failure was
a full disk or quota (libraries lose the errno: torch's zip writer says ``unexpected pos``), so
the caller can say so in one line (a checkpoint save does).

An atomic write keeps a reader from seeing half a file, not two writers from overwriting
each other: two runs writing the same ``--json`` each print ``wrote``, the file holds the
last one, and a JSON and a PNG of one command may come from different runs. So a command
*claims* its output files when it validates them, before any work (:func:`claim_output`),
and holds them until it has written them (:func:`release_outputs`, at the end of the
command: :func:`scopebench.commands._common.refuses`). A claim is an exclusive
:class:`FileLock` on ``.<name>.lock`` beside the file; a second run that claims it refuses
at once, naming the holder's pid and host. The kernel drops a ``flock`` when its holder
exits in any way (``kill -9`` too), so a lock file left behind by a dead run never blocks:
the next run takes it over. The same :class:`FileLock` guards a training run's output
folder (:mod:`scopebench.train.run_folder`).

A lock file is never a link: it is opened with ``O_NOFOLLOW`` and refused, in one line naming
it and before anything is written to it, when it is a symbolic link, not a regular file, or a
second name (hard link) of another file. Otherwise a folder someone shipped with
``.scopebench_run.lock -> ~/.bashrc`` would have the lock truncate and overwrite that file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "OUTPUTS_ENV",
    "FileLock",
    "atomic_dir",
    "atomic_write",
    "claim_output",
    "no_space",
    "claimed_outputs_env",
    "file_kind",
    "read_lock_record",
    "release_outputs",
    "remove_stale_temporaries",
    "replace_dir",
    "temporary_dir",
    "user_permissions",
]


def current_umask() -> int:
    """This process's umask, read without changing it where Linux tells it (``/proc``)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, hence the fallback only)
    os.umask(mask)
    return mask


def user_permissions(path: str | Path) -> None:
    """Give ``path`` the permissions :func:`open` (a file) or :func:`os.mkdir` (a folder) would.

    :Examples:
        >>> import tempfile, pathlib, stat
        >>> fd, name = tempfile.mkstemp(); os.close(fd)
        >>> user_permissions(name)
        >>> oct(stat.S_IMODE(os.stat(name).st_mode)) == oct(0o666 & ~current_umask())
        True
    """
    base = 0o777 if Path(path).is_dir() else 0o666
    os.chmod(path, base & ~current_umask())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_temporaries(parent: str | Path, name: str) -> list[Path]:
    """Remove ``.<name>.<pid>.*.tmp`` entries in ``parent`` whose process is gone.

    Returns:
        The removed paths.
    """
    parent = Path(parent)
    removed = []
    if not parent.is_dir():
        return removed
    prefix = f".{name}."
    for entry in parent.iterdir():
        if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
            continue
        pid_text = entry.name[len(prefix) :].split(".", 1)[0]
        if not pid_text.isdigit() or _pid_alive(int(pid_text)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", **open_kwargs) -> Iterator[IO]:
    """Open a temporary file beside ``path``; it becomes ``path`` when the block succeeds.

    Args:
        path: Final file name; its folder is created when missing.
        mode: ``"w"`` (text) or ``"wb"``.
        **open_kwargs: Passed to :func:`open` (``newline=""`` for CSV, ``encoding``...).

    :Examples:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> with atomic_write(folder / "a.txt") as fh:
        ...     _ = fh.write("done")
        >>> (folder / "a.txt").read_text(), sorted(p.name for p in folder.iterdir())
        ('done', ['a.txt'])
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as fh:
            yield fh
        user_permissions(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path, *, exist_ok: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; it becomes ``path`` on success.

    Args:
        path: Final folder name; must not exist yet.
        exist_ok: When ``path`` appeared meanwhile (another process finished the same
            work first), keep that one and discard ours instead of raising.

    Raises:
        FileExistsError: ``path`` exists and ``exist_ok`` is false.
    """
    path = Path(path)
    tmp = temporary_dir(path)
    try:
        yield tmp
        user_permissions(tmp)
        try:
            os.rename(tmp, path)
        except OSError:
            if not (exist_ok and path.exists()):
                if path.exists():
                    raise FileExistsError(f"{path} already exists") from None
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def temporary_dir(path: str | Path) -> Path:
    """A new empty folder beside ``path``, named ``.<name>.<pid>.<random>.tmp`` (stale ones of
    dead processes are removed first); :func:`replace_dir` turns it into ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, path.name)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent))


def replace_dir(tmp: str | Path, path: str | Path) -> None:
    """Rename the finished folder ``tmp`` to ``path``, replacing an older ``path``.

    The older folder is first renamed aside, so at every moment ``path`` is either the old
    complete folder, absent for an instant, or the new complete one.

    :Examples:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> for text in ("old", "new"):
        ...     tmp = temporary_dir(root / "ckpt")
        ...     _ = (tmp / "f").write_text(text)
        ...     replace_dir(tmp, root / "ckpt")
        >>> (root / "ckpt" / "f").read_text(), sorted(p.name for p in root.iterdir())
        ('new', ['ckpt'])
    """
    tmp, path = Path(tmp), Path(path)
    user_permissions(tmp)
    old = None
    if path.exists():
        old = temporary_dir(path)
        os.replace(path, old / path.name)
    os.rename(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- a full disk ------------------------------------------------------------------------------------
#: Space left below which a failed write is taken for a full disk: a write that fails on a
#: full file system leaves less than a block (torch's ``unexpected pos`` loses the errno).
FULL_BYTES = 1 << 20
#: How an error that lost its errno says the disk is full (``os error 28``: Rust's ENOSPC).
_SPACE_TEXT = re.compile(r"No space left on device|Disk quota exceeded|os error (?:28|122)\b")


def no_space(err: BaseException, folder: Path) -> tuple[int, int | None] | None:
    """(errno, bytes left) when the failed write ``err`` met a full disk or quota, else None: an
    ``ENOSPC`` / ``EDQUOT`` anywhere in its causes (or their text, where a library kept only
    that), or under :data:`FULL_BYTES` left on the file system of ``folder`` (torch's zip writer
    says only ``unexpected pos ...``). Root's bytes include the file system's reserve.

    :Examples:
        >>> import errno, tempfile
        >>> no_space(OSError(errno.ENOSPC, "No space left on device"), tempfile.gettempdir())[0] == errno.ENOSPC
        True
    """
    found, seen = None, 0
    cause: BaseException | None = err
    while cause is not None and seen < 16 and found is None:
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            found = cause.errno
        elif _SPACE_TEXT.search(str(cause)):  # safetensors' Rust error keeps only the text
            found = errno.EDQUOT if "quota" in str(cause).lower() or "os error 122" in str(cause) else errno.ENOSPC
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    try:
        fs = os.statvfs(folder)
        left = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize  # root may use the reserve
    except OSError:
        left = None
    if found is None and (left is None or left >= FULL_BYTES):
        return None
    return found or errno.ENOSPC, left


# -- one writer per file: locks -------------------------------------------------------------------

#: ``flock`` errors saying another descriptor holds the lock (the rest: no locking here).
_HELD = (errno.EAGAIN, errno.EACCES)


#: The most of a lock file :func:`read_lock_record` reads (a record is about 80 bytes).
_RECORD_BYTES = 1 << 16


def read_lock_record(path: str | Path) -> dict[str, Any] | None:
    """The holder's record in the lock file ``path``; None when there is none or it is
    unreadable (its holder has just created it and not yet written it), or when ``path`` is
    not a regular file of its own (a link, a FIFO, ``/dev/zero``: nothing is read through it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        record = json.loads(os.read(fd, _RECORD_BYTES).decode())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else None


#: How a lock file is opened: never through a link, never blocking on a FIFO or a device.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def _not_a_lock(path: Path, found: os.stat_result | None) -> str | None:
    """Why ``path`` cannot be a lock file (``found``: its ``lstat``, None when absent), or None."""
    if found is None:
        return None
    if stat.S_ISLNK(found.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"{path} -> {target}: a lock file is never a link"
    if not stat.S_ISREG(found.st_mode):
        return f"{path} is {file_kind(found.st_mode)}, not a regular file: a lock file is a regular file"
    if found.st_nlink > 1:
        return f"{path} has {found.st_nlink} hard links (it is another file's name too): a lock file has one"
    return None


def file_kind(mode: int) -> str:
    """``a directory``, ``a FIFO``... what a path that is no regular file is, for a refusal (a lock
    path here, a checkpoint's file in :mod:`scopebench.train.checkpoint_files`).

    :Examples:
        >>> import stat
        >>> file_kind(stat.S_IFIFO)
        'a FIFO'
    """
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _open_lock(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created if absent), which is a regular file of
    its own: refused otherwise, before anything is written to it.

    Raises:
        ValueError: ``path`` is a link, not a regular file, or has several hard links, named.
    """
    refusal = _not_a_lock(path, _lstat(path))  # before opening: opening a device may act on it
    if refusal is None:
        try:
            fd = os.open(path, _LOCK_FLAGS, 0o644)
        except OSError as err:
            if err.errno != errno.ELOOP:  # O_NOFOLLOW's answer for a link planted meanwhile
                raise
            refusal = _not_a_lock(path, _lstat(path)) or f"{path}: a lock file is never a link"
        else:
            refusal = _not_a_lock(path, os.fstat(fd))
            if refusal is None:
                return fd
            os.close(fd)
    raise ValueError(f"{refusal}; refused, nothing was written to it (remove it if you did not put it there)")


class FileLock:
    """An exclusive :func:`fcntl.flock` on a file, held from :meth:`acquire` to :meth:`release`;
    the file holds its holder's record (``pid``, ``host``, ``started``) so that a second
    process can say whom it waits for.

    The kernel releases the lock when its holder exits in any way, so a file left behind by a
    dead process is unlocked and the next :meth:`acquire` takes it over. The holder removes
    the file before it unlocks it; a process that locked the removed file opens the new one.

    Attributes:
        path: The lock file.
        record: The record written into it.
    """

    def __init__(self, path: Path, fd: int | None, record: dict[str, Any]) -> None:
        self.path, self._fd, self.record = path, fd, record

    @classmethod
    def acquire(
        cls,
        path: str | Path,
        *,
        busy: Callable[[dict[str, Any] | None], str],
        unprotected: Callable[[OSError], str],
        extra: dict[str, Any] | None = None,
    ) -> FileLock:
        """Lock ``path`` (created if needed; its folder must exist), without waiting.

        Args:
            path: The lock file.
            busy: The holder's record (None: not written yet) -> the refusal's message.
            unprotected: On a file system without ``flock`` (some Lustre mounts): the error ->
                the warning printed on stderr; the caller goes on unprotected rather than
                refusing every run there.
            extra: More facts for the record (JSON values), for a second process's message.

        Raises:
            ValueError: another live process holds it (``busy``'s message); ``path`` is a
                symbolic link, not a regular file, or a hard link of another file (named,
                nothing written to it).
        """
        path = Path(path)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        record.update(extra or {})
        while True:
            fd = _open_lock(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in _HELD:
                    raise ValueError(busy(read_lock_record(path))) from None
                print(unprotected(err), file=sys.stderr)
                return cls(path, None, record)
            # The previous holder removes the file before it unlocks: a lock on a removed
            # file protects nothing (a third process creates a new one), so open it again.
            try:  # lstat: a link planted in its place is not the file we locked
                same = os.path.samestat(os.fstat(fd), os.lstat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(record) + "\n").encode())
        return cls(path, fd, record)

    def release(self) -> None:
        """Remove the lock file, then unlock it (in this order: see :meth:`acquire`)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


#: Set by a process that holds claims for the ranks it launches (``scopebench train``
#: relaunching itself): ``{"pid": its pid, "paths": [the files it claimed]}``.
OUTPUTS_ENV = "SCOPEBENCH_CLAIMED_OUTPUTS"
#: This process's claims: file -> (how the user named it, its lock).
_claims: dict[Path, tuple[str, FileLock]] = {}


def _claimed_by_parent(target: Path) -> bool:
    """Whether the process that started this one claimed ``target`` for it (:data:`OUTPUTS_ENV`
    names this process's parent: a stale variable names another process)."""
    try:
        handed = json.loads(os.environ.get(OUTPUTS_ENV, ""))
    except ValueError:
        return False
    return isinstance(handed, dict) and handed.get("pid") == os.getppid() and str(target) in handed.get("paths", ())


def claim_output(key: str, path: str | Path) -> None:
    """Hold the file ``path`` for this process until :func:`release_outputs`: another process
    claiming it meanwhile is refused, naming this one.

    The lock is ``.<name>.lock`` in the file's folder, which must exist. A file the parent
    process claimed for this one (:data:`OUTPUTS_ENV`) is not claimed again.

    Args:
        key: How the user gave the path (``--json``, ``--png``), for the messages.
        path: The file that will be written.

    Raises:
        ValueError: another run holds it (its pid and host named), or this process already
            claimed it under another key.
    """
    target = Path(path).expanduser()
    target = target.parent.resolve() / target.name  # one name per file, whatever the spelling
    if target in _claims:
        raise ValueError(f"{key} {str(path)!r} is also the {_claims[target][0]} path: give each output its own file")
    if _claimed_by_parent(target):
        return

    def busy(record: dict[str, Any] | None) -> str:
        who = f"pid {record.get('pid')} on host {record.get('host')}" if record else "it is starting"
        return f"{key} {path} is being written by another run ({who}); choose another path or wait"

    def unprotected(err: OSError) -> str:
        return f"warning: cannot lock {lock} ({err.strerror}): another run writing {key} {path} would not be detected"

    lock = target.parent / f".{target.name}.lock"
    _claims[target] = (key, FileLock.acquire(lock, busy=busy, unprotected=unprotected))


def claimed_outputs_env() -> dict[str, str]:
    """The environment that hands this process's claims to the ranks it launches (empty when
    it holds none)."""
    if not _claims:
        return {}
    return {OUTPUTS_ENV: json.dumps({"pid": os.getpid(), "paths": [str(p) for p in _claims]})}


def release_outputs() -> None:
    """Release every claim of this process (a command's end: its files are written or it failed)."""
    while _claims:
        _, (_, lock) = _claims.popitem()
        lock.release()
