"""Checkpoints are data, not code: every pickle the suite reads back is unpickled data-only.

Three kinds of pickle reach the suite from a checkpoint folder, and each is read without
running anything it holds:

* **torch.load files** (accelerate's ``optimizer.bin``, ``scheduler.bin``,
  ``random_states_<r>.pkl``; DeepSpeed's ZeRO shards; the non-tensor items of a
  torch.distributed.checkpoint folder, which DCP's own planner loads with
  ``weights_only=False``): while :func:`data_only_loading` is active, ``torch.load`` always
  runs torch's ``weights_only`` unpickler, which resolves a global only when its full dotted
  path is on an allow-list (torch's own plus :func:`data_only_globals`) and does not know
  protocol 4's ``STACK_GLOBAL`` at all.
* **DCP's index** (``.metadata``), a plain pickle of DCP's dataclasses that DCP reads with
  ``pickle.load``: :func:`read_dcp_metadata` unpickles it with :class:`_MetadataUnpickler`,
  whose ``find_class`` admits exact (module, name) pairs from :data:`METADATA_GLOBALS` and
  returns the object it resolved itself. A module is never admitted whole and a dotted name
  never resolves: pickle's own ``find_class`` walks dots (``("torch.distributed.checkpoint.metadata",
  "os.system")`` is ``os.system``, since that module imports ``os``), which is how an earlier
  module-wide allow-list ran code.
* Nothing else: model weights are ``safetensors``.

A refusal is one ``ValueError`` naming the file and the global; it is raised before anything
in the file runs.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pickle
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "METADATA_GLOBALS",
    "DataOnlyReader",  # noqa: F822 - defined on first use, by the module's __getattr__
    "checked_reader",
    "data_only_globals",
    "data_only_loading",
    "read_dcp_metadata",
    "refuse_code",
]

#: The globals DCP's ``.metadata`` pickle may name, as exact (module, name) pairs: its
#: dataclasses, the memory-format enum of ``TensorProperties``, the layout lookup and the
#: path type of ``StorageMeta`` (torch 2.14; ``tests/train/test_data_only.py`` checks it
#: against real FSDP2 checkpoints). torch's dtypes, layouts and memory formats are added by
#: :func:`_metadata_objects`.
METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [
        *(
            ("torch.distributed.checkpoint.metadata", name)
            for name in (
                "Metadata",
                "MetadataIndex",
                "StorageMeta",
                "TensorProperties",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    ]
)


@functools.cache
def _metadata_objects() -> dict[tuple[str, str], Any]:
    """(module, name) -> object for every global a ``.metadata`` may name, resolved here once
    (plain ``getattr`` on an imported module: no dots are walked)."""
    import importlib

    import torch

    objects = {(module, name): getattr(importlib.import_module(module), name) for module, name in METADATA_GLOBALS}
    for name, value in vars(torch).items():
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            objects["torch", name] = value
    return objects


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata: exact (module, name) pairs only (see the module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        found = _metadata_objects().get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a persistent id is not part of a checkpoint's metadata")


def read_dcp_metadata(path: str | Path) -> Any:
    """The ``Metadata`` of a DCP ``.metadata`` file, unpickled from DCP's own types only.

    Raises:
        ValueError: the file names any other global (code), or is no pickle, naming the file.
    """
    path = Path(path)
    try:
        return _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
        raise ValueError(
            f"{path} holds more than checkpoint metadata ({err}): refused, a checkpoint is only loaded as data"
        ) from None


def checked_reader(folder: str | Path) -> Any:
    """A :class:`DataOnlyReader` of ``folder`` whose metadata was read once here and checked
    (:func:`scopebench.train.checkpoint_files.check_dcp_metadata`: every shard it names is a
    regular file inside ``folder``, every byte range inside its file, every tensor no larger
    than the bytes stored for it), and every shard file it names found: DCP itself joins
    ``relative_path`` as given (absolute, ``..``), allocates what the sizes say, and folds a
    reader's error into an ``AssertionError`` or a ``CheckpointException`` of every rank's
    attempts, two tracebacks long.

    Raises:
        ValueError: the metadata holds more than data (:func:`read_dcp_metadata`), names a
            path outside ``folder``, a file that is not regular, or sizes past what is stored.
        FileNotFoundError: a shard the metadata names is missing, named.
    """
    from scopebench.train.checkpoint_files import check_dcp_metadata

    folder = Path(folder)
    reader = _data_only_reader_class()(folder)
    metadata = reader.read_metadata()
    check_dcp_metadata(folder, metadata, folder / ".metadata")
    names = {getattr(item, "relative_path", None) for item in (metadata.storage_data or {}).values()}
    missing = sorted(name for name in names if isinstance(name, str) and not (folder / name).is_file())
    if missing:
        raise FileNotFoundError(
            f"{folder / missing[0]}: missing, {folder / '.metadata'} names it"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + ": the checkpoint is damaged"
        )
    return reader


@functools.cache
def _data_only_reader_class() -> type:
    """:class:`DataOnlyReader`, defined on first use: importing DCP (and DTensor with it) costs
    about a second, which a rank that trains under ``ddp`` would pay for nothing."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class DataOnlyReader(FileSystemReader):
        """DCP's ``FileSystemReader`` whose ``.metadata`` is read by :func:`read_dcp_metadata`.

        Its byte items are still read by DCP's planner with ``torch.load``: load under
        :func:`data_only_loading` (``scopebench.train.fsdp`` does).

        Raises (from ``read_metadata``):
            ValueError: the metadata file holds anything else (code), naming the file.
        """

        def read_metadata(self, *args: Any, **kwargs: Any):
            metadata = read_dcp_metadata(self._get_metadata_path(kwargs.get("rank")))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    DataOnlyReader.__module__, DataOnlyReader.__qualname__ = __name__, "DataOnlyReader"
    return DataOnlyReader


def __getattr__(name: str) -> Any:
    if name == "DataOnlyReader":
        return _data_only_reader_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def refuse_code(path: Path) -> None:
    """A changed file that holds pickled code is refused as such, with :func:`data_only_loading`'s
    (or :func:`read_dcp_metadata`'s) message: it was planted, not merely damaged, the more
    important fact. Nothing in it runs. A torch file is loaded as accelerate loads it (its numpy
    allow-list); other files are left to the caller's message."""
    if path.name == ".metadata":
        try:
            read_dcp_metadata(path)
        except ValueError as err:
            if re.search(r"\(\S+\.\S+ is not part of a checkpoint's metadata\)", str(err)):
                raise
        return
    if path.suffix not in (".bin", ".pkl", ".pt"):
        return
    from accelerate.utils.other import load

    try:
        with data_only_loading():
            load(str(path), map_location="cpu")
    except ValueError as err:
        # a refusal naming a global (posix.system) is code; one naming the unpickler's reason
        # ("pickle data was truncated") is damage, which the caller's message says
        if re.search(r"\([A-Za-z_]\w*\.[\w.]+\): scopebench loads", str(err)):
            raise
    except Exception:  # damaged, not code: the caller's message says so
        return


def data_only_globals() -> list[Callable]:
    """The non-tensor types that DeepSpeed's ZeRO-2 / ZeRO-3 shards hold, allow-listed for
    ``torch.load(weights_only=True)`` by :func:`data_only_loading`.

    Each is rebuilt from plain values (no code of the file runs): ``LossScaler`` (the
    optimizer's static loss scale: fp32 and bf16 runs; only fp16, which scopebench does not
    offer, saves a ``DynamicLossScaler``), ``ZeroStageEnum`` (the ZeRO stage, an int enum)
    and ``fragment_address`` (ZeRO-2's ``numel`` / ``start`` of each parameter's slice of the
    flat partition). The numpy types of ``random_states_<r>.pkl`` are accelerate's to allow:
    its loader adds them around its own ``torch.load``.
    """
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


class _DataOnly:
    """What the active :func:`data_only_loading` blocks share (one set per process)."""

    lock = threading.Lock()
    depth = 0
    stack: contextlib.ExitStack | None = None
    refused: list[ValueError] = []
    sources: list[str | None] = []


@contextlib.contextmanager
def data_only_loading(source: str | Path | None = None) -> Iterator[None]:
    """While active, ``torch.load`` loads data only, whatever its caller asks for.

    Args:
        source: What a refusal names when ``torch.load`` is given an unnamed buffer (DCP hands
            its planner a ``BytesIO`` of each non-tensor item): the folder being read.

    ``torch.load`` (and ``torch.serialization.load``) is replaced by a function that always
    passes ``weights_only=True`` and no ``pickle_module``, and the types of
    :func:`data_only_globals` are allow-listed; both are undone when the block ends, even on
    an error. Blocks nest (the outermost one patches and restores).

    Raises:
        ValueError: a file loaded inside the block holds Python code or objects that are not
            data, naming the file and the global. It is raised where ``torch.load`` was called
            and, if the library that called it swallowed it (accelerate does, for the RNG
            states) or wrapped it in an error of its own (DCP's ``CheckpointException``), again
            when the block ends, in place of that error: a refused file never passes for a
            missing one, and its one line is what the user reads.
    """
    import torch

    allowed = data_only_globals()  # imports DeepSpeed: before the patch, so a failure leaves torch as it was
    # torch.load is one attribute for the whole process: while any block is active, every
    # thread's torch.load is data-only (stricter, never looser). The lock keeps the patch,
    # the count of active blocks and the allow-list consistent when threads enter and leave
    # blocks at once; the original function comes back when the last block ends.
    with _DataOnly.lock:
        if _DataOnly.depth == 0:
            stack = contextlib.ExitStack()
            originals = (torch.load, torch.serialization.load)
            data_only = _data_only_load(originals[0])
            torch.load = torch.serialization.load = data_only
            stack.callback(_restore_load, *originals)
            present = set(torch.serialization.get_safe_globals())
            # only what is not allowed already: leaving must not remove someone else's entries
            stack.enter_context(torch.serialization.safe_globals([g for g in allowed if g not in present]))
            _DataOnly.stack, _DataOnly.refused = stack, []
        _DataOnly.depth += 1
        _DataOnly.sources.append(None if source is None else str(source))
        start = len(_DataOnly.refused)
    try:
        yield
    except BaseException:
        refused = _DataOnly.refused[start:]
        if refused:
            raise refused[0] from None
        raise
    else:
        swallowed = _DataOnly.refused[start:]
        if swallowed:
            raise swallowed[0]
    finally:
        with _DataOnly.lock:
            _DataOnly.sources.pop()
            _DataOnly.depth -= 1
            if _DataOnly.depth == 0:
                stack, _DataOnly.stack = _DataOnly.stack, None
                stack.close()


def _restore_load(load: Callable, serialization_load: Callable) -> None:
    import torch

    torch.load, torch.serialization.load = load, serialization_load


def _data_only_load(original: Callable) -> Callable:
    """``original`` (``torch.load``) with ``weights_only=True`` forced; a refusal becomes a
    one-line ``ValueError`` naming the file (recorded for :func:`data_only_loading`)."""

    def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **pickle_load_args):
        # The caller's weights_only and pickle_module are dropped on purpose: the data-only
        # unpickler is the point, and torch refuses a pickle_module with weights_only=True.
        try:
            return original(f, map_location, weights_only=True, mmap=mmap, **pickle_load_args)
        except pickle.UnpicklingError as err:  # what the weights_only unpickler raises on a refusal
            if isinstance(f, (str, os.PathLike)):
                name = os.fspath(f)
            else:
                given = [s for s in _DataOnly.sources if s is not None]
                name = getattr(f, "name", None) or (given[-1] if given else repr(f))
            refusal = ValueError(
                f"{name} holds Python code or objects that are not data ({_not_data(str(err))}): "
                "scopebench loads checkpoints as data only; do not load checkpoints you do not trust"
            )
            _DataOnly.refused.append(refusal)
            raise refusal from None

    load.__doc__ = original.__doc__
    load.__wrapped__ = original
    return load


def _not_data(message: str) -> str:
    """The global (or the unpickler's reason) in torch's ``weights_only`` refusal ``message``.

    :Examples:
        >>> _not_data("Trying to load unsupported GLOBAL posix.system whose module posix is blocked.")
        'posix.system'
        >>> _not_data("Can only build Tensor ... via `add_safe_globals`, but got <class 'numpy.dtypes.UInt32DType'>")
        'numpy.dtypes.UInt32DType'
        >>> _not_data("Weights only load failed. Re-run ...\\n\\nUnsupported operand 149\\n\\nCheck the documentation")
        'Unsupported operand 149'
    """
    found = re.search(r"GLOBAL ([\w.]+)", message) or re.search(r"but got <class '([^']+)'>", message)
    if found:
        return found.group(1).rstrip(".")
    # torch wraps the unpickler's reason between its advice and its pointer to the docs
    reasons = [p for p in message.split("\n\n") if p.strip() and not p.startswith(("Weights only", "Check the doc"))]
    return " ".join((reasons[0] if reasons else message).split())
