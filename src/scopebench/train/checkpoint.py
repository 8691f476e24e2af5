"""Training checkpoints: save on every rank, resume exactly (consolidated weights: :mod:`scopebench.train.consolidate`).

Layout of a run's output folder (the upstream training layout)::

    <output_dir>/checkpoints/000020/
        model.safetensors        the weights (DDP; under ZeRO after ``convert-checkpoint``)
        optimizer.bin            AdamW state (DDP; under ZeRO inside ``pytorch_model/``)
        pytorch_model/, latest   DeepSpeed's sharded weights and optimizer state (ZeRO)
        fsdp_model/, fsdp_optimizer/   torch.distributed.checkpoint shards (FSDP2, HSDP: every rank writes its own)
        scheduler.bin            the LR schedule
        random_states_<r>.pkl    every rank's Python / numpy / torch RNG states
        train_config.yaml        the run config, to resume from (``--config`` of ``scopebench train``)
        policy_config.json       the model's config (``make_policy`` rebuilds it)
        manifest.json            every other file's size and sha256, and the settings a resume must keep
        training_step.json       step, data position (epoch, batch in epoch), backend, world size
    <output_dir>/checkpoints/last -> 000020

Everything but ``training_step.json`` is ``accelerator.save_state`` (accelerate saves the
model, optimizer, scheduler and RNG states; under DeepSpeed the engine writes its shards),
plus what the backend writes itself (:meth:`~scopebench.train.backends.TrainingBackend.save`):
under FSDP2 and HSDP every rank writes the model and optimizer shards with
``torch.distributed.checkpoint`` beside accelerate's scheduler and RNG files. Which files a
finished checkpoint holds and how its shards are consolidated are the backend's too.
A checkpoint is written into a temporary folder beside its final name by every rank; after a
barrier rank 0 writes :data:`MANIFEST` (:func:`write_manifest`: relative path, size and
sha256 of every file the ranks wrote, and the settings an exact resume needs unchanged), then
``training_step.json`` is written last and the folder renamed (:func:`scopebench.atomic.replace_dir`),
so a crash never leaves a folder that looks finished; ``last`` is a relative symbolic link
replaced atomically. Resuming restores all of it, so the steps after a resume are the steps
an uninterrupted run would have taken (the tests compare weights to 1e-6).
:func:`verify_checkpoint` checks a checkpoint against its manifest and the resumed run's
settings before anything is built, so a damaged or mismatched one is refused by name
instead of resuming inexactly.

Checkpoints are data, not code: every file read back (``load_checkpoint``, ``consolidate``)
goes through ``torch.load(weights_only=True)`` under
:func:`~scopebench.train.data_only.data_only_loading`, even where accelerate, DeepSpeed or DCP
ask for ``weights_only=False``, and DCP's ``.metadata`` through an unpickler of exact
(module, name) pairs (:mod:`scopebench.train.data_only`). A file holding pickled code is
refused with a ``ValueError`` naming it, before anything in it runs; ``convert-checkpoint``
verifies the manifest first, as a resume does (:func:`verify_files`).

A checkpoint cannot make the loaders read outside it (:mod:`scopebench.train.checkpoint_files`):
every name in the manifest (and in DCP's ``.metadata``, DeepSpeed's ``latest``) is a relative
path inside the folder, only regular files are read (hashing reads no more than their size),
the folder holds nothing its manifest does not list (:func:`check_contents`, on every rank of
a resume too), the step file's ``world_size`` is bounded by the files present before any
per-rank name is built, and ``convert-checkpoint`` lists the ``model.safetensors`` it writes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

from scopebench.atomic import atomic_write, no_space, replace_dir, temporary_dir
from scopebench.train.backends import DEFAULT_BACKEND, MODEL_FILE, TrainingBackend, find_backend, get_backend
from scopebench.train.checkpoint_files import (
    bounded_ranks,
    check_listed,
    confined,
    read_json,
    regular,
    sha256_of,
)
from scopebench.train.data_only import data_only_loading, refuse_code
from scopebench.validate import integer, quote

__all__ = [
    "CHECKPOINTS",
    "CONFIG_FILE",
    "LAST",
    "CheckpointSpaceError",
    "MANIFEST",
    "MODEL_FILE",
    "STEP_FILE",
    "check_contents",
    "checkpoint_dir",
    "load_checkpoint",
    "read_manifest",
    "read_step_file",
    "recorded_backend",
    "recorded_world_size",
    "resolve_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
    "verify_files",
    "write_manifest",
]

CHECKPOINTS = "checkpoints"
LAST = "last"
STEP_FILE = "training_step.json"
CONFIG_FILE = "train_config.yaml"
MANIFEST = "manifest.json"
#: Format of :data:`MANIFEST` (raise it when its keys change meaning).
MANIFEST_FORMAT = 1


def recorded_backend(meta: dict[str, Any]) -> TrainingBackend:
    """The backend a checkpoint's step file records (one written before backends were recorded,
    or by an unknown one: the default's files)."""
    name = meta.get("backend", DEFAULT_BACKEND)
    return (find_backend(name) if isinstance(name, str) else None) or get_backend(DEFAULT_BACKEND)


def recorded_world_size(checkpoint: str | Path, meta: dict[str, Any]) -> int:
    """The step file's ``world_size`` (1 when absent), an integer >= 1 bounded by the files
    present (:func:`~scopebench.train.checkpoint_files.bounded_ranks`), before any per-rank
    name is built from it.

    Raises:
        ValueError: naming the file, the key and the bound.
    """
    return bounded_ranks(Path(checkpoint) / STEP_FILE, meta.get("world_size", 1), checkpoint)


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    """``<output_dir>/checkpoints/<step:06d>``.

    :Examples:
        >>> checkpoint_dir("outputs/train/tiny", 20).as_posix()
        'outputs/train/tiny/checkpoints/000020'
    """
    return Path(output_dir) / CHECKPOINTS / f"{step:06d}"


def save_checkpoint(
    accelerator: Any,
    output_dir: str | Path,
    step: int,
    *,
    meta: dict[str, Any],
    files: dict[str, str] | None = None,
    settings: dict[str, Any] | None = None,
    backend: str | TrainingBackend = DEFAULT_BACKEND,
    state: tuple[Any, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step``; every rank calls this (DeepSpeed, FSDP2 and HSDP save
    their shards on every rank). Returns the checkpoint folder.

    A write that fails removes the partial folder (rank 0), so ``last`` and the checkpoint it
    names are untouched; a full disk or quota (torch only says ``unexpected pos ...``) is said
    so in one line (:class:`CheckpointSpaceError`).

    Args:
        accelerator: The run's accelerator (``save_state``).
        output_dir: The run's output folder.
        step: Optimizer steps done.
        meta: JSON facts for :data:`STEP_FILE` (step, data position, backend, world size...).
        files: Extra text files (name -> content) written by rank 0.
        settings: The settings an exact resume needs unchanged (key -> JSON value), recorded
            in :data:`MANIFEST` for :func:`verify_checkpoint`.
        backend: The run's backend, which writes what ``save_state`` does not.
        state: The run's ``(model, optimizer)``, for the backend's own files.

    Raises:
        CheckpointSpaceError: the file system holding the checkpoints is full (or the quota
            exceeded), naming the folder, the space left and the checkpoint kept.
    """
    from scopebench.distributed import gather_objects

    final = checkpoint_dir(output_dir, step)
    tmp = None
    try:
        tmp = temporary_dir(final) if accelerator.is_main_process else None
        tmp = Path(gather_objects(None if tmp is None else str(tmp))[0])
        accelerator.save_state(str(tmp))
        get_backend(backend).save(*(state or (None, None)), tmp)
        accelerator.wait_for_everyone()  # every rank's files are complete: the manifest covers them all
        if accelerator.is_main_process:
            for name, text in (files or {}).items():
                (tmp / name).write_text(text)
            write_manifest(tmp, settings or {}, {**meta, "step": step})
            with atomic_write(tmp / STEP_FILE) as fh:  # last: it marks the folder finished
                json.dump({**meta, "step": step}, fh, indent=2)
                fh.write("\n")
            replace_dir(tmp, final)
            _point_last(final)
    except Exception as err:
        full = no_space(err, final.parent)  # before the clean-up frees it: what the writes met
        if accelerator.is_main_process and tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # the partial folder: its space back, never taken as finished
        if full is None:
            raise
        raise CheckpointSpaceError(_no_space_message(final, err, *full)) from err
    accelerator.wait_for_everyone()
    return final


class CheckpointSpaceError(OSError):
    """A checkpoint could not be written for want of space; its message says so in one line,
    naming the folder, the space left and the checkpoint kept (``last`` is untouched)."""


def _no_space_message(final: Path, err: BaseException, code: int, left: int | None) -> str:
    """``checkpoint 000004 could not be written: no space left on the device of <folder> (12.0 KB
    left; RuntimeError: ... unexpected pos ...); its partial folder was removed and the last
    checkpoint, step 2, is kept as <folder>/last``."""
    what = "the disk quota is exceeded on" if code == errno.EDQUOT else "no space left on the device of"
    room = "" if left is None else f"{left / 1024:.1f} KB left; "
    cause = " ".join(f"{type(err).__name__}: {err}".split())
    cause = cause if len(cause) <= 160 else cause[:157] + "..."
    last = final.parent / LAST
    try:
        kept = f"the last checkpoint, step {read_step_file(last)['step']}, is kept as {last}"
    except (OSError, ValueError, KeyError):
        kept = "no earlier checkpoint is there"
    return (
        f"checkpoint {final.name} could not be written: {what} {final.parent} ({room}{cause}); its partial folder "
        f"was removed and {kept}"
    )


def _point_last(final: Path) -> None:
    """``checkpoints/last`` -> ``final`` (relative link, swapped in with ``os.replace``)."""
    link = final.parent / LAST
    tmp = final.parent / f".{LAST}.{os.getpid()}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(final.name, tmp)
    os.replace(tmp, link)


def resolve_checkpoint(path: str | Path) -> Path:
    """The finished checkpoint folder that ``path`` names.

    ``path`` may be a checkpoint folder, a file in one (``train_config.yaml``), a
    ``checkpoints/`` folder or a run's output folder (both through their ``last`` link).

    Raises:
        FileNotFoundError: naming the missing folder, link or file (a checkpoint without
            :data:`STEP_FILE` was never finished).
        ValueError: a link that dangles or loops, a ``last`` leading out of its
            ``checkpoints/`` folder, a :data:`STEP_FILE` that is no JSON object, or whose
            ``world_size`` is more than the files present, named.
    """
    path = Path(path)
    if path.is_file():
        path = path.parent
    for parent in (path / CHECKPOINTS, path):
        if (parent / LAST).exists() or (parent / LAST).is_symlink():
            path = parent / LAST
            break
    if path.is_symlink():
        _check_link(path)
    if not path.exists():
        what = "link" if path.name == LAST else "folder"
        raise FileNotFoundError(f"no checkpoint to resume from: {what} {path} does not exist")
    path = path.resolve()
    meta = read_step_file(path)
    world_size = recorded_world_size(path, meta)
    missing = []
    for pattern in recorded_backend(meta).checkpoint_files:
        ranks = range(world_size) if "{rank}" in pattern else [0]
        missing += [name for name in (pattern.format(rank=r) for r in ranks) if not (path / name).exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {path} is incomplete: {', '.join(missing)} missing")
    return path


def _check_link(link: Path) -> None:
    """Refuse a link that loops or whose target is missing, and a ``last`` that leads out of
    its ``checkpoints/`` folder, naming the link and its target."""
    try:
        os.stat(link)  # follows every link on the way: ELOOP for a loop, ENOENT for a dangling one
    except OSError as err:
        target = os.readlink(link)
        why = (
            "loops (it leads back to itself)" if err.errno == errno.ELOOP else "is dangling (its target does not exist)"
        )
        raise ValueError(
            f"{link} -> {target}: the link {why}; point it at a finished checkpoint folder of this run, "
            "or pass --config <checkpoint>/train_config.yaml"
        ) from None
    # save_checkpoint points last at a sibling folder: elsewhere, it would resume another run
    if link.name == LAST and Path(os.path.realpath(link)).parent != link.parent.resolve():
        raise ValueError(
            f"{link} -> {os.readlink(link)}: the link points outside {link.parent} (another run's checkpoint?); "
            "point it at a checkpoint folder beside it, or pass --config <checkpoint>/train_config.yaml"
        )


def read_step_file(checkpoint: str | Path) -> dict[str, Any]:
    """:data:`STEP_FILE` of a checkpoint folder.

    Raises:
        FileNotFoundError: the folder has none (it was never finished), named.
        ValueError: it is not valid JSON or not a JSON object, or not a regular file of at most
            1 MiB (a link, a FIFO), named.
    """
    step_file = Path(checkpoint) / STEP_FILE
    try:
        meta = read_json(step_file, "step file", _STEP_FILE_LIMIT)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{checkpoint} is not a finished checkpoint: {step_file} is missing "
            "(it is written last, when every other file is complete)"
        ) from None
    if not isinstance(meta, dict):
        raise ValueError(f"{step_file} must hold a JSON object with step, epoch and position, got {_kind(meta)}")
    return meta


#: The most bytes of a step file read (it holds a few keys).
_STEP_FILE_LIMIT = 1 << 20


#: The keys of :data:`STEP_FILE` the manifest repeats (``training_step``): where the data
#: order continues, which no file's hash covers (the step file is written after the manifest).
MIRRORED = ("step", "epoch", "position", "world_size")


def write_manifest(folder: str | Path, settings: dict[str, Any], step: dict[str, Any] | None = None) -> Path:
    """Write :data:`MANIFEST` of ``folder``: every file under it (relative path, size in bytes,
    sha256), ``settings`` and, as ``training_step``, the :data:`MIRRORED` keys of ``step`` (the
    step file's facts); the format is in ``docs/distributed.md`` ("What resume checks").

    Called by rank 0 once every rank's files are written, before :data:`STEP_FILE` (which
    the manifest cannot list: it is written after it; its data position is mirrored instead,
    so an edit of it is detected).
    """
    folder = Path(folder)
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        name = path.relative_to(folder).as_posix()
        if name not in (MANIFEST, STEP_FILE):
            size = path.stat().st_size
            files[name] = {"bytes": size, "sha256": sha256_of(path, size)}
    manifest = {"format": MANIFEST_FORMAT, "files": files, "settings": settings}
    if step is not None:
        manifest["training_step"] = {key: step[key] for key in MIRRORED if key in step}
    with atomic_write(folder / MANIFEST) as fh:
        json.dump(manifest, fh, indent=2)
        fh.write("\n")
    return folder / MANIFEST


def verify_files(checkpoint: str | Path, *, rewritten: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check a finished checkpoint's files before anything reads them; returns its manifest.

    Checks :data:`STEP_FILE` (a JSON object; integer ``step`` >= 1 equal to the folder's
    number; integer ``epoch`` and ``position`` >= 0, equal to the manifest's copy of them),
    then every :data:`MANIFEST` entry (a relative path inside the checkpoint, a regular file
    with the recorded size and sha256; a changed file that holds pickled code is named as
    such), then that the folder holds nothing else (:func:`check_contents`). A resume
    (:func:`verify_checkpoint`) and ``convert-checkpoint`` both call it.

    Args:
        checkpoint: A finished checkpoint folder.
        rewritten: Files the caller is about to replace (``convert-checkpoint``'s
            ``model.safetensors``): neither checked nor refused when unlisted.

    Raises:
        ValueError: in one line, naming the file and the key or the first damaged, unlisted
            or out-of-folder file; a checkpoint without a manifest (written before manifests
            existed) cannot be verified and is refused too.
    """
    checkpoint = Path(checkpoint)
    step_file = checkpoint / STEP_FILE
    meta = read_step_file(checkpoint)
    for key in ("step", "epoch", "position"):
        if key not in meta:
            raise ValueError(
                f"{step_file} has no {key!r} key: the checkpoint is damaged (it needs step, epoch, position)"
            )
    integer(f"{step_file}: step", meta["step"], low=1)
    integer(f"{step_file}: epoch", meta["epoch"], low=0)
    integer(f"{step_file}: position", meta["position"], low=0)
    if checkpoint.name.isdigit() and meta["step"] != int(checkpoint.name):
        raise ValueError(
            f"{step_file}: step {meta['step']} but the folder is {checkpoint.name}: the step must equal the "
            "folder's number (the file was edited or copied from another checkpoint)"
        )
    manifest = read_manifest(checkpoint)
    _check_mirror(step_file, meta, manifest.get("training_step"))
    for name, entry in manifest["files"].items():
        if name not in rewritten:
            _check_entry(checkpoint, name, entry)
    check_contents(checkpoint, manifest, rewritten=rewritten)
    return manifest


def _check_mirror(step_file: Path, meta: dict[str, Any], mirrored: Any) -> None:
    """The step file's :data:`MIRRORED` keys equal the manifest's copy (a manifest written before
    the copy existed has none: nothing to compare)."""
    if mirrored is None:
        return
    if not isinstance(mirrored, dict):
        raise ValueError(f"{step_file.parent / MANIFEST}: training_step must be a JSON object, got {_kind(mirrored)}")
    for key in MIRRORED:
        if key in mirrored and meta.get(key, _ABSENT) != mirrored[key]:
            raise ValueError(
                f"{step_file}: {key} {_shown(meta, key)}, the manifest records {json.dumps(mirrored[key])}: the step "
                "file was edited; a resume continues the data order only from where it was saved"
            )


def read_manifest(checkpoint: str | Path) -> dict[str, Any]:
    """:data:`MANIFEST` of a checkpoint folder, a JSON object with a ``files`` object.

    Raises:
        ValueError: there is none (a checkpoint written before manifests: unverifiable), or it
            is no such object, named.
    """
    checkpoint = Path(checkpoint)
    manifest_file = checkpoint / MANIFEST
    try:
        manifest = read_json(manifest_file, "manifest")
    except FileNotFoundError:
        raise ValueError(
            f"{checkpoint} has no {MANIFEST}: it predates manifests and cannot be verified; "
            "start a new run, or read it with an older scopebench"
        ) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{manifest_file} must hold a JSON object with 'files' and 'settings', got {_kind(manifest)}")
    return manifest


def check_contents(checkpoint: str | Path, manifest: dict[str, Any], *, rewritten: tuple[str, ...] = ()) -> None:
    """Every name ``manifest`` lists is a path inside ``checkpoint`` to a regular file (or to
    nothing), and the folder holds nothing it does not list (but :data:`MANIFEST` and
    :data:`STEP_FILE`): what the loaders open is what the manifest lists. Reads no file (every
    rank of a resume calls it, through :func:`load_checkpoint`; the hashes are
    :func:`verify_files`').

    Raises:
        ValueError: the first name leading out of the folder, entry that is not a regular
            file, or file or link not listed, named.
    """
    checkpoint = Path(checkpoint)
    for name in manifest["files"]:
        if name not in rewritten:
            regular(confined(checkpoint, name, checkpoint / MANIFEST), checkpoint / MANIFEST)
    check_listed(checkpoint, manifest["files"], checkpoint / MANIFEST, own=(MANIFEST, STEP_FILE, *rewritten))


def verify_checkpoint(checkpoint: str | Path, *, settings: dict[str, Any]) -> dict[str, Any]:
    """Check a finished checkpoint before a resume builds anything; returns its manifest.

    :func:`verify_files`, then ``settings`` against the recorded ones (a key recorded on one
    side only is a mismatch too).

    Args:
        checkpoint: A finished checkpoint folder (:func:`resolve_checkpoint`'s answer).
        settings: The resumed run's settings that must match (key -> JSON value).

    Raises:
        ValueError: in one line, naming the file and the key or the first damaged file, or
            every mismatched setting (joined by ``; ``).
    """
    checkpoint = Path(checkpoint)
    manifest = verify_files(checkpoint)
    recorded = manifest.get("settings") or {}
    mismatches = [
        f"{key} {_shown(recorded, key)} in the checkpoint, {_shown(settings, key)} given"
        for key in sorted(set(recorded) | set(settings))
        if recorded.get(key, _ABSENT) != settings.get(key, _ABSENT)
    ]
    if mismatches:
        hint = ""
        if any(recorded.get(k, _ABSENT) != settings.get(k, _ABSENT) for k in ("backend", "nproc_per_node")):
            # Shards and per-rank RNG states belong to one backend and world size; the weights do not.
            hint = f"; `scopebench convert-checkpoint {checkpoint}` writes its weights alone (model.safetensors)"
        raise ValueError(f"{'; '.join(mismatches)}: an exact resume needs the same (checkpoint {checkpoint}){hint}")
    return manifest


_ABSENT = object()


def _shown(settings: dict[str, Any], key: str) -> str:
    return "(absent)" if key not in settings else json.dumps(settings[key])


def _kind(value: Any) -> str:
    return f"{quote(value)} ({type(value).__name__})"


def _check_entry(checkpoint: Path, name: Any, entry: Any) -> None:
    """One manifest entry: a path inside the checkpoint, a regular file there (nothing else is
    read), with the recorded size and sha256."""
    path = confined(checkpoint, name, checkpoint / MANIFEST)
    if not isinstance(entry, dict) or not {"bytes", "sha256"} <= set(entry):
        raise ValueError(f"{checkpoint / MANIFEST}: entry {name!r} must hold 'bytes' and 'sha256', got {entry!r}")
    found = regular(path, checkpoint / MANIFEST)
    if found is None:
        raise ValueError(f"{path}: missing, the manifest lists it: the checkpoint is damaged")
    size = found.st_size
    if size != entry["bytes"]:
        refuse_code(path)
        raise ValueError(f"{path}: {size} bytes, the manifest records {entry['bytes']}: the checkpoint is damaged")
    digest = sha256_of(path, size)
    if digest != entry["sha256"]:
        refuse_code(path)
        raise ValueError(
            f"{path}: sha256 {digest[:12]}..., the manifest records {str(entry['sha256'])[:12]}...: "
            "the checkpoint is damaged"
        )


def load_checkpoint(
    accelerator: Any,
    checkpoint: str | Path,
    *,
    world_size: int,
    backend: str | TrainingBackend,
    state: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint into the prepared objects of ``accelerator`` and, through the
    backend, its own files into ``state`` (the run's model and optimizer); returns its
    :data:`STEP_FILE` facts.

    Raises:
        ValueError: the checkpoint was written by another backend or number of ranks
            (ZeRO shards and per-rank RNG states do not carry over); it names a path outside
            it or holds a file its manifest does not list (:func:`check_contents`).
    """
    backend = get_backend(backend)
    checkpoint = resolve_checkpoint(checkpoint)
    meta = read_step_file(checkpoint)
    saved = (meta.get("backend", DEFAULT_BACKEND), recorded_world_size(checkpoint, meta))
    if saved != (backend.name, world_size):
        raise ValueError(
            f"checkpoint {checkpoint} was written with backend={saved[0]} on {saved[1]} rank(s); this run has "
            f"backend={backend.name} on {world_size}: resume with the same backend and number of ranks, or "
            f"`scopebench convert-checkpoint {checkpoint}` for its weights alone (model.safetensors)"
        )
    check_contents(checkpoint, read_manifest(checkpoint))  # every rank: what it opens is listed, inside
    backend.check_shards(checkpoint, world_size)
    with data_only_loading():  # accelerate and DeepSpeed's engine would unpickle anything
        accelerator.load_state(str(checkpoint))
        backend.load(*(state or (None, None)), checkpoint)
    return meta
