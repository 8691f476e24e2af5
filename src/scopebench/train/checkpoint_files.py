"""What a checkpoint may name and hold: its own regular files, listed, in bounded numbers and sizes.

A checkpoint folder may come from someone else (a run folder shipped for ``--resume``, a
checkpoint handed to ``convert-checkpoint``), and every name in it is data that the loaders
would otherwise follow: DCP's ``.metadata`` gives each shard's ``relative_path``, which DCP
joins to its folder as given (an absolute path or ``..`` reads any file), ``manifest.json``
names the files to hash, DeepSpeed's ``latest`` names the folder of its shards. So:

* **Every path a checkpoint names is inside it** (:func:`confined`): a relative path, without
  ``..``, that does not lead out through a symbolic link.
* **Every file the loaders open is a regular file the manifest lists** (:func:`check_listed`):
  a file or link added to the folder after it was written (a shard replaced by a link to
  another run's and dropped from the manifest) is refused before anything is read.
* **Nothing is read without bound**: only regular files are hashed, and no more bytes than
  ``stat`` reported (:func:`sha256_of`: ``/proc`` files say 0 and never end), the JSON files
  are read up to a size (:func:`read_json`), the number of ranks a step file claims is bounded
  by the files present (:func:`bounded_ranks`) before any name is built, and DCP's tensor
  sizes by the bytes stored for them (:func:`check_dcp_metadata`) before any allocation.

Each refusal is one ``ValueError`` naming the file, the name it gives and why; nothing of
the checkpoint is loaded before these checks pass. ``docs/distributed.md`` ("What a
checkpoint may reference") states the rules for users.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from scopebench.atomic import file_kind

__all__ = [
    "JSON_LIMIT_BYTES",
    "bounded_ranks",
    "check_dcp_metadata",
    "check_listed",
    "confined",
    "read_json",
    "regular",
    "sha256_of",
]

#: The most bytes :func:`read_json` reads of a checkpoint's JSON file (a manifest lists a few
#: hundred files: tens of kilobytes).
JSON_LIMIT_BYTES = 16 << 20
#: What every refusal of a name ends with.
_RULE = "a checkpoint names only files inside it (relative paths, no '..', no link out of it)"


def confined(folder: str | Path, name: Any, source: str | Path) -> Path:
    """``folder / name`` when ``name`` is a relative path inside ``folder`` (also once every
    link on the way is followed).

    Args:
        folder: The checkpoint (or DCP) folder, resolved.
        name: The name ``source`` gives.
        source: The file that names it (for the message).

    Raises:
        ValueError: ``name`` is no string, empty, absolute, holds ``..``, or leads out of
            ``folder`` through a link, naming ``source``, ``name`` and the link.

    :Examples:
        >>> confined("/ckpt", "fsdp_model/__0_0.distcp", "manifest.json").as_posix()
        '/ckpt/fsdp_model/__0_0.distcp'
        >>> confined("/ckpt", "../other/__0_0.distcp", ".metadata")
        Traceback (most recent call last):
        ...
        ValueError: .metadata names '../other/__0_0.distcp', a path with '..': refused, a checkpoint names only files inside it (relative paths, no '..', no link out of it)
    """
    folder = Path(folder)
    if not isinstance(name, str) or not name or "\x00" in name:
        why = "which is not a file name"
    elif PurePosixPath(name).is_absolute():
        why = "an absolute path"
    elif ".." in PurePosixPath(name).parts:
        why = "a path with '..'"
    else:
        path = folder / name
        real, root = os.path.realpath(path), os.path.realpath(folder)
        if os.path.commonpath([real, root]) == root:
            return path
        why = f"a link out of {folder} ({_first_link(folder, name)} -> {real})"
    raise ValueError(f"{source} names {name!r}, {why}: refused, {_RULE}")


def _first_link(folder: Path, name: str) -> Path:
    """The first link on the way from ``folder`` to ``name`` (the one to name in a refusal)."""
    path = folder
    for part in PurePosixPath(name).parts:
        path = path / part
        if path.is_symlink():
            return path
    return folder / name


def regular(path: str | Path, source: str | Path) -> os.stat_result | None:
    """``path``'s ``stat`` when it is a regular file (None when it does not exist).

    Raises:
        ValueError: it exists and is a FIFO, a device, a folder..., named with ``source``.
    """
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(found.st_mode):
        raise ValueError(
            f"{path} is {file_kind(found.st_mode)}, not a regular file ({source} names it): refused before reading it"
        )
    return found


def sha256_of(path: str | Path, size: int) -> str:
    """sha256 of the regular file ``path``, reading at most the ``size`` bytes ``stat`` gave.

    Raises:
        ValueError: the file holds more than ``size`` bytes (it grew while read, or is a
            kernel file that reports 0 and never ends), named.
    """
    digest, left = hashlib.sha256(), size
    with open(path, "rb") as fh:
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            digest.update(block)
            left -= len(block)
        if fh.read(1):
            raise ValueError(f"{path}: more than the {size} bytes its size says (it is no plain file): refused")
    return digest.hexdigest()


def read_json(path: str | Path, what: str, limit: int = JSON_LIMIT_BYTES) -> Any:
    """The JSON in the regular file ``path`` (not a link), at most ``limit`` bytes.

    Raises:
        FileNotFoundError: there is no ``path``.
        ValueError: ``path`` is a link, not a regular file, larger than ``limit``, not UTF-8
            or not JSON, named (``what``: what the file is, for the message).
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise ValueError(f"{path}: {err.strerror}: the {what} must be a regular file, not a link") from None
    with os.fdopen(fd, "rb") as fh:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise ValueError(f"{path} is {file_kind(found.st_mode)}: the {what} must be a regular file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path}: more than {limit} bytes, more than a {what} holds: refused")
    try:
        return json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): the checkpoint is damaged") from None


def check_listed(folder: str | Path, listed: Iterable[str], manifest: str | Path, own: Iterable[str] = ()) -> None:
    """Refuse anything in ``folder`` that its manifest does not list: the loaders open only
    listed files (accelerate and DeepSpeed open what they find by name or by pattern).

    Args:
        folder: The checkpoint folder.
        listed: The manifest's relative names.
        manifest: The manifest file (for the message).
        own: Names written after the manifest (the step file, the manifest itself).

    Raises:
        ValueError: the first unlisted file or link (the link's target named).
    """
    folder = Path(folder)
    known = set(listed) | set(own)
    for root, dirs, files in os.walk(folder):  # followlinks=False: a linked folder is an entry, not a tree
        for name in sorted(dirs) + sorted(files):
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            if relative in known or (name in dirs and not path.is_symlink()):
                continue
            if path.is_symlink():
                raise ValueError(
                    f"{path} -> {os.readlink(path)}: a link that {manifest} does not list: refused, a checkpoint "
                    "holds only the files its manifest lists (a shard replaced by a link and dropped from it?)"
                )
            raise ValueError(
                f"{path}: not listed in {manifest}: refused, a checkpoint holds only the files its manifest lists "
                "(a file added after it was written?)"
            )


def bounded_ranks(step_file: str | Path, world_size: Any, folder: str | Path) -> int:
    """The step file's ``world_size`` once it is an integer >= 1 no larger than the number of
    entries in ``folder`` (every rank writes a file of its own there): bounded before any
    per-rank name is built.

    Raises:
        ValueError: naming the file, the key and the bound.
    """
    from scopebench.validate import integer

    integer(f"{step_file}: world_size", world_size, low=1)
    present = 0
    with os.scandir(folder) as entries:
        for _ in entries:
            present += 1
            if present >= world_size:
                return world_size
    raise ValueError(
        f"{step_file}: world_size {world_size}, but {folder} holds {present} entries, and every rank writes a file "
        "of its own there (random_states_<rank>.pkl): the checkpoint is damaged or the file was edited"
    )


def check_dcp_metadata(folder: str | Path, metadata: Any, source: str | Path) -> None:
    """Refuse DCP metadata that names files outside ``folder``, files that are not regular, byte
    ranges past a file's end, or tensors larger than the bytes stored for them, before DCP
    reads or allocates anything.

    Args:
        folder: The DCP folder (``fsdp_model/``), resolved.
        metadata: Its ``Metadata`` (:func:`scopebench.train.data_only.read_dcp_metadata`).
        source: The ``.metadata`` file, for the messages.

    Raises:
        ValueError: in one line, naming ``source``, the entry and the bound.
    """
    stored: dict[str, int] = {}  # fqn -> bytes stored for it
    sizes: dict[str, int] = {}  # relative path -> its size
    try:
        storage = dict(metadata.storage_data or {})
        tensors = dict(metadata.state_dict_metadata or {})
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"{source}: not DCP metadata (no storage_data / state_dict_metadata): refused") from None
    for index, info in storage.items():
        name = getattr(info, "relative_path", None)
        path = confined(folder, name, source)
        if name not in sizes:
            found = regular(path, source)
            sizes[name] = -1 if found is None else found.st_size  # a missing file: checked_reader names it
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            raise ValueError(f"{source}: {name!r} at offset {offset!r}, length {length!r}: integers >= 0; refused")
        if sizes[name] >= 0 and offset + length > sizes[name]:
            raise ValueError(
                f"{source}: bytes {offset}..{offset + length} of {name!r}, which holds {sizes[name]}: refused, "
                "the metadata is damaged or planted"
            )
        if getattr(info, "transform_descriptors", None):
            raise ValueError(f"{source}: {name!r} is stored through transforms, which scopebench does not write")
        fqn = str(getattr(index, "fqn", ""))
        stored[fqn] = stored.get(fqn, 0) + length
    for fqn, entry in tensors.items():
        if hasattr(entry, "size") and hasattr(entry, "chunks"):
            _check_tensor(source, fqn, entry, stored.get(str(fqn), 0))


def _check_tensor(source: str | Path, fqn: Any, entry: Any, stored: int) -> None:
    """One ``TensorStorageMetadata``: sizes >= 0, chunks inside the tensor, and no more bytes
    than were stored for it (what ``torch.empty`` would be asked for)."""
    size = list(entry.size)
    if not all(type(n) is int and n >= 0 for n in size):
        raise ValueError(
            f"{source}: tensor {fqn!r} has size {size}: sizes are integers >= 0; refused before any allocation"
        )
    itemsize = getattr(getattr(entry.properties, "dtype", None), "itemsize", None)
    if type(itemsize) is not int or itemsize < 1:
        raise ValueError(f"{source}: tensor {fqn!r} has no known dtype: refused")
    numel = 1
    for n in size:
        numel *= n
    if numel * itemsize > stored:
        raise ValueError(
            f"{source}: tensor {fqn!r} of size {size} ({numel} elements, {numel * itemsize} bytes) but {stored} "
            "bytes are stored for it: refused before any allocation, the metadata is damaged or planted"
        )
    for chunk in entry.chunks or ():
        offsets, lengths = list(chunk.offsets), list(chunk.sizes)
        inside = len(offsets) == len(lengths) == len(size) and all(
            type(o) is int and type(n) is int and o >= 0 and n >= 0 and o + n <= whole
            for o, n, whole in zip(offsets, lengths, size)
        )
        if not inside:
            raise ValueError(
                f"{source}: tensor {fqn!r} of size {size} has a chunk at {offsets} of size {lengths}, outside it: "
                "refused, the metadata is damaged or planted"
            )
