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
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = [
    "atomic_dir",
    "atomic_write",
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
