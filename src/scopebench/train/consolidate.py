"""A checkpoint's weights for use outside training: consolidated into ``model.safetensors``
(``scopebench convert-checkpoint``), and a file of a finished checkpoint read alone
(:func:`listed_file`: ``load_policy``), both within what its manifest lists.

The backend that wrote the checkpoint (its step file's record) consolidates its own shards
(:meth:`~scopebench.train.backends.TrainingBackend.consolidated_state`: DeepSpeed's
``zero_to_fp32``, or torch.distributed.checkpoint read without a process group); the files are
verified against the manifest first (:func:`scopebench.train.checkpoint.verify_files`) and read
as data only.
"""

from __future__ import annotations

import json
from pathlib import Path

from scopebench.atomic import atomic_write
from scopebench.train.backends import MODEL_FILE
from scopebench.train.checkpoint import (
    MANIFEST,
    read_manifest,
    read_step_file,
    recorded_backend,
    recorded_world_size,
    resolve_checkpoint,
    verify_files,
)
from scopebench.train.checkpoint_files import confined, regular, sha256_of

__all__ = ["consolidate", "listed_file"]


def consolidate(checkpoint: str | Path) -> Path:
    """Write ``model.safetensors`` (fp32, full weights) from a sharded checkpoint (one whose backend
    does not save :data:`MODEL_FILE`).

    A checkpoint that already holds it (DDP) is returned as it is. Runs on one process,
    without the ranks that wrote the shards (the backend's ``consolidated_state``: DeepSpeed's
    ``zero_to_fp32``; for FSDP torch.distributed.checkpoint read without a process group). The
    files are checked against the manifest first (:func:`verify_files`), as for a resume, then
    read as data only.

    Raises:
        ValueError: a damaged file, or one that holds pickled code, named.
        FileNotFoundError: a shard missing from the folder and from the manifest (the
            backend's :meth:`~scopebench.train.backends.TrainingBackend.check_shards`, DCP's
            ``.metadata`` for ``fully_shard``'s), named.
    """
    checkpoint = resolve_checkpoint(checkpoint)
    target = checkpoint / MODEL_FILE
    meta = read_step_file(checkpoint)
    backend = recorded_backend(meta)
    sharded = MODEL_FILE not in backend.checkpoint_files
    verify_files(checkpoint, rewritten=(MODEL_FILE,) if sharded else ())  # a former conversion's is replaced
    backend.check_shards(checkpoint, recorded_world_size(checkpoint, meta))
    state = backend.consolidated_state(checkpoint)
    if state is None:
        return target
    from safetensors.torch import save

    with atomic_write(target, "wb") as fh:
        fh.write(save({key: value.contiguous() for key, value in state.items()}))
    _list_in_manifest(checkpoint, MODEL_FILE)
    return target


def listed_file(checkpoint: str | Path, name: str, *, hint: str = "") -> Path:
    """``checkpoint / name`` when the manifest lists it and it is a regular file inside the
    checkpoint (what a reader of one file checks, without hashing the whole folder).

    Raises:
        ValueError: no manifest, ``name`` unlisted (``hint`` added), a link out or not a regular
            file, named.
    """
    checkpoint = Path(checkpoint)
    if name not in read_manifest(checkpoint)["files"]:
        raise ValueError(
            f"{checkpoint / name}: not listed in {checkpoint / MANIFEST}: refused, a checkpoint holds only the files "
            f"its manifest lists{f'; {hint}' if hint else ''}"
        )
    path = confined(checkpoint, name, checkpoint / MANIFEST)
    if regular(path, checkpoint / MANIFEST) is None:
        raise FileNotFoundError(f"{path}: missing, the manifest lists it: the checkpoint is damaged")
    return path


def _list_in_manifest(checkpoint: Path, name: str) -> None:
    """Add (or update) ``name``'s entry in :data:`MANIFEST`: a file written into a finished
    checkpoint (``convert-checkpoint``'s weights) is listed like the others, so loaders open it."""
    manifest = read_manifest(checkpoint)
    size = (checkpoint / name).stat().st_size
    manifest["files"][name] = {"bytes": size, "sha256": sha256_of(checkpoint / name, size)}
    with atomic_write(checkpoint / MANIFEST) as fh:
        json.dump(manifest, fh, indent=2)
        fh.write("\n")
