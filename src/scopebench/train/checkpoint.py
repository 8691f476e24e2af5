"""Training checkpoints: save on every rank, resume exactly, consolidate ZeRO shards.

Layout of a run's output folder (the upstream training layout)::

    <output_dir>/checkpoints/000020/
        model.safetensors        the weights (DDP; under ZeRO after ``convert-checkpoint``)
        optimizer.bin            AdamW state (DDP; under ZeRO inside ``pytorch_model/``)
        pytorch_model/, latest   DeepSpeed's sharded weights and optimizer state (ZeRO)
        scheduler.bin            the LR schedule
        random_states_<r>.pkl    every rank's Python / numpy / torch RNG states
        train_config.yaml        the run config, to resume from (``--config`` of ``scopebench train``)
        policy_config.json       the model's config (``make_policy`` rebuilds it)
        training_step.json       step, data position (epoch, batch in epoch), backend, world size
    <output_dir>/checkpoints/last -> 000020

Everything but ``training_step.json`` is ``accelerator.save_state`` (accelerate saves the
model, optimizer, scheduler and RNG states; under DeepSpeed the engine writes its shards).
A checkpoint is written into a temporary folder beside its final name by every rank, then
``training_step.json`` is written last and the folder renamed (:func:`scopebench.atomic.replace_dir`),
so a crash never leaves a folder that looks finished; ``last`` is a relative symbolic link
replaced atomically. Resuming restores all of it, so the steps after a resume are the steps
an uninterrupted run would have taken (the tests compare weights to 1e-6).

Checkpoints are data, not code: every file read back (``load_checkpoint``, ``consolidate``)
goes through ``torch.load(weights_only=True)`` under :func:`data_only_loading`, even where
accelerate or DeepSpeed ask for ``weights_only=False``; the few non-tensor types DeepSpeed's
shards hold are allow-listed (:func:`data_only_globals`). A file holding pickled code is
refused with a ``ValueError`` naming it, before anything in it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scopebench.atomic import atomic_write, replace_dir, temporary_dir

__all__ = [
    "CHECKPOINTS",
    "CONFIG_FILE",
    "LAST",
    "MODEL_FILE",
    "STEP_FILE",
    "checkpoint_dir",
    "consolidate",
    "data_only_globals",
    "data_only_loading",
    "load_checkpoint",
    "read_step_file",
    "resolve_checkpoint",
    "save_checkpoint",
]

CHECKPOINTS = "checkpoints"
LAST = "last"
STEP_FILE = "training_step.json"
CONFIG_FILE = "train_config.yaml"
MODEL_FILE = "model.safetensors"
#: Files a finished checkpoint holds besides :data:`STEP_FILE`, by backend (``{rank}`` per rank).
_REQUIRED = {
    "ddp": (MODEL_FILE, "random_states_{rank}.pkl"),
    "zero2": ("latest", "pytorch_model", "random_states_{rank}.pkl"),
    "zero3": ("latest", "pytorch_model", "random_states_{rank}.pkl"),
}


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    """``<output_dir>/checkpoints/<step:06d>``.

    :Examples:
        >>> checkpoint_dir("outputs/train/tiny", 20).as_posix()
        'outputs/train/tiny/checkpoints/000020'
    """
    return Path(output_dir) / CHECKPOINTS / f"{step:06d}"


def save_checkpoint(
    accelerator: Any, output_dir: str | Path, step: int, *, meta: dict[str, Any], files: dict[str, str] | None = None
) -> Path:
    """Write the checkpoint of ``step``; every rank calls this (DeepSpeed saves its shards
    on every rank). Returns the checkpoint folder.

    Args:
        accelerator: The run's accelerator (``save_state``).
        output_dir: The run's output folder.
        step: Optimizer steps done.
        meta: JSON facts for :data:`STEP_FILE` (step, data position, backend, world size...).
        files: Extra text files (name -> content) written by rank 0.
    """
    from scopebench.distributed import gather_objects

    final = checkpoint_dir(output_dir, step)
    tmp = temporary_dir(final) if accelerator.is_main_process else None
    tmp = Path(gather_objects(None if tmp is None else str(tmp))[0])
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        with atomic_write(tmp / STEP_FILE) as fh:  # last: it marks the folder finished
            json.dump({**meta, "step": step}, fh, indent=2)
            fh.write("\n")
        replace_dir(tmp, final)
        _point_last(final)
    accelerator.wait_for_everyone()
    return final


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
    """
    path = Path(path)
    if path.is_file():
        path = path.parent
    for parent in (path / CHECKPOINTS, path):
        if (parent / LAST).exists() or (parent / LAST).is_symlink():
            path = parent / LAST
            break
    if not path.exists():
        what = "link" if path.name == LAST else "folder"
        raise FileNotFoundError(f"no checkpoint to resume from: {what} {path} does not exist")
    path = path.resolve()
    meta = read_step_file(path)
    missing = []
    for pattern in _REQUIRED.get(meta.get("backend", "ddp"), _REQUIRED["ddp"]):
        ranks = range(int(meta.get("world_size", 1))) if "{rank}" in pattern else [0]
        missing += [name for name in (pattern.format(rank=r) for r in ranks) if not (path / name).exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {path} is incomplete: {', '.join(missing)} missing")
    return path


def read_step_file(checkpoint: str | Path) -> dict[str, Any]:
    """:data:`STEP_FILE` of a checkpoint folder.

    Raises:
        FileNotFoundError: the folder has none (it was never finished), named.
    """
    step_file = Path(checkpoint) / STEP_FILE
    if not step_file.is_file():
        raise FileNotFoundError(
            f"{checkpoint} is not a finished checkpoint: {step_file} is missing "
            "(it is written last, when every other file is complete)"
        )
    return json.loads(step_file.read_text())


def load_checkpoint(accelerator: Any, checkpoint: str | Path, *, world_size: int, backend: str) -> dict[str, Any]:
    """Restore a checkpoint into the prepared objects of ``accelerator``; returns its
    :data:`STEP_FILE` facts.

    Raises:
        ValueError: the checkpoint was written by another backend or number of ranks
            (ZeRO shards and per-rank RNG states do not carry over).
    """
    checkpoint = resolve_checkpoint(checkpoint)
    meta = read_step_file(checkpoint)
    saved = (meta.get("backend", "ddp"), int(meta.get("world_size", 1)))
    if saved != (backend, world_size):
        raise ValueError(
            f"checkpoint {checkpoint} was written with backend={saved[0]} on {saved[1]} rank(s); this run has "
            f"backend={backend} on {world_size}: resume with the same backend and number of ranks"
        )
    with data_only_loading():  # accelerate and DeepSpeed's engine would unpickle anything
        accelerator.load_state(str(checkpoint))
    return meta


def consolidate(checkpoint: str | Path) -> Path:
    """Write ``model.safetensors`` (fp32, full weights) from a ZeRO checkpoint's shards.

    DDP checkpoints already hold it; the file is returned as it is. Runs on one process,
    without the ranks that wrote the shards (DeepSpeed's ``zero_to_fp32``).
    """
    checkpoint = resolve_checkpoint(checkpoint)
    meta = read_step_file(checkpoint)
    target = checkpoint / MODEL_FILE
    if meta.get("backend", "ddp") == "ddp":
        return target
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import save

    with data_only_loading():  # zero_to_fp32 loads every shard with weights_only=False
        state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    with atomic_write(target, "wb") as fh:
        fh.write(save({key: value.contiguous() for key, value in state.items()}))
    return target


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


@contextlib.contextmanager
def data_only_loading() -> Iterator[None]:
    """While active, ``torch.load`` loads data only, whatever its caller asks for.

    ``torch.load`` (and ``torch.serialization.load``) is replaced by a function that always
    passes ``weights_only=True`` and no ``pickle_module``, and the types of
    :func:`data_only_globals` are allow-listed; both are undone when the block ends, even on
    an error. Blocks nest (the outermost one patches and restores).

    Raises:
        ValueError: a file loaded inside the block holds Python code or objects that are not
            data, naming the file and the global. It is raised where ``torch.load`` was called
            and, if the library that called it swallowed it (accelerate does, for the RNG
            states), again when the block ends: a refused file never passes for a missing one.
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
        start = len(_DataOnly.refused)
    try:
        yield
        swallowed = _DataOnly.refused[start:]
        if swallowed:
            raise swallowed[0]
    finally:
        with _DataOnly.lock:
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
            name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", repr(f))
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
