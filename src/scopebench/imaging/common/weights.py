"""Denoiser weight files: the one writer, the one checker, the one loader.

A weight file written by ``benchmark_training`` (:func:`save_denoiser_weights`) is a
safetensors file holding the plain ``state_dict`` of a deepinv denoiser; its header holds
the :class:`~scopebench.imaging.common.architectures.DenoiserSpec` that rebuilds it (format
:data:`~scopebench.imaging.common.architectures.WEIGHTS_FORMAT`) and JSON-encoded extras (trained step sizes, noise levels, steps).

:func:`load_denoiser_weights` reads that format and also foreign state dicts
(``.safetensors``, ``.pth``, ``.pt``, optionally wrapped in ``state_dict`` / ``model`` or
prefixed by ``module.`` / ``_orig_mod.`` / an enclosing model's name), whose architecture
it reads from the tensors' shapes. :func:`check_weights_file` refuses an empty, truncated
or corrupt file when the configuration is validated, before any work, naming the key and
the file.
"""

from __future__ import annotations

import functools
import json
import os
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

# Not from denoisers: that registry imports this module (one-way dependency).
from scopebench.imaging.common.architectures import LEARNED, SPEC_KEYS, WEIGHTS_FORMAT, DenoiserSpec, construct

__all__ = [
    "WEIGHTS_FORMAT",
    "check_weights_file",
    "load_denoiser_weights",
    "load_state_dict",
    "read_denoiser_metadata",
    "save_denoiser_weights",
]

SUFFIXES = (".safetensors", ".pth", ".pt")
#: Prefixes that wrappers add to parameter names (DDP, torch.compile).
_PREFIXES = ("module.", "_orig_mod.")


@functools.lru_cache(maxsize=64)
def _file_problem(path: str, size: int, mtime_ns: int) -> str | None:
    """What is wrong with the file's structure, or ``None`` (cached per version of the file)."""
    if size == 0:
        return "is empty"
    if path.endswith(".safetensors"):
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"is truncated ({size} bytes, no safetensors header)"
            (length,) = struct.unpack("<Q", head)
            if 8 + length > size:
                return f"is truncated or corrupt: its header announces {length} bytes, the file has {size}"
            try:
                header = json.loads(fh.read(length))
                ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
            except (ValueError, TypeError, KeyError, IndexError):
                return "is corrupt: its safetensors header cannot be read"
        expected = 8 + length + max(ends, default=0)
        if expected != size:
            return f"is truncated or corrupt: its tensors need {expected} bytes, the file has {size}"
        return None
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            return f"is corrupt ({err})"
        return None if bad is None else f"is corrupt (bad checksum in {bad})"
    try:  # the pre-zip torch.save format
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several unrelated types for a bad file
        return (
            f"is truncated or corrupt: neither a zip archive of torch.save nor its older format ({type(err).__name__})"
        )
    return None


def check_weights_file(key: str, value: Any) -> Path:
    """``value`` as the path of a readable weight file, else ``ValueError`` naming ``key`` and the file.

    Checks existence, suffix and structure (an empty file, a safetensors file shorter than
    its header says, a zip archive that fails its checksums...), without building anything.
    """
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise ValueError(f"{key}={value!r} is not a file")
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{key} must be a .safetensors, .pth or .pt file, got {value!r}")
    stat = path.stat()
    problem = _file_problem(str(path), stat.st_size, stat.st_mtime_ns)
    if problem:
        raise ValueError(f"{key}={str(value)!r} {problem}")
    return path


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a local state-dict file, with wrapper prefixes removed.

    Accepts a plain state dict or a checkpoint dict holding one under ``state_dict`` /
    ``model``; ``module.`` and ``_orig_mod.`` prefixes (DDP, torch.compile) are dropped.
    """
    path = Path(path).expanduser()
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        for key in ("state_dict", "model"):
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a state dict of tensors")
    clean = {}
    for key, value in state.items():
        for prefix in _PREFIXES:
            key = key.replace(prefix, "")
        clean[key] = value
    return clean


def _strip_to(state: dict[str, torch.Tensor], anchor: str) -> dict[str, torch.Tensor]:
    # Weights saved from an enclosing model (e.g. an unrolled network's ``denoiser.``)
    # carry a prefix before the denoiser's own names: find it from a known key.
    for key in state:
        if key.endswith(anchor):
            prefix = key[: -len(anchor)]
            return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    raise ValueError(f"the weights file has no {anchor!r} tensor; keys start with {sorted(state)[:5]}")


def _architecture(name: str, state: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Constructor keyword arguments read from the tensors' shapes, and the state they fit."""
    if name == "drunet":
        state = _strip_to(state, "m_head.weight")
        head = state["m_head.weight"]  # (nc0, in + 1, k, k[, k])
        nb = len({m.group(1) for k in state if (m := re.match(r"m_down1\.(\d+)\.res\.0\.weight$", k))})
        nc = [head.shape[0]] + [state[f"m_down{i}.{nb}.weight"].shape[0] for i in (1, 2, 3)]
        tail = state["m_tail.weight"]
        kwargs = {
            "in_channels": head.shape[1] - 1,
            "out_channels": tail.shape[0] if tail.ndim == head.ndim else head.shape[1] - 1,
            "nc": tuple(int(c) for c in nc),
            "nb": nb,
        }
    else:
        state = _strip_to(state, "in_conv.weight")
        head = state["in_conv.weight"]  # (nf, in, k, k[, k])
        kwargs = {
            "in_channels": head.shape[1],
            "out_channels": state["out_conv.weight"].shape[0],
            "depth": len([k for k in state if re.match(r"conv_list\.\d+\.weight$", k)]) + 2,
            "bias": "in_conv.bias" in state,
            "nf": head.shape[0],
        }
    return {**kwargs, "dim": head.ndim - 2}, state


def read_denoiser_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The header metadata of a safetensors weight file: spec keys as strings, extras JSON-decoded."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        raw = dict(fh.metadata() or {})
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SPEC_KEYS or key == "format":
            out[key] = value
        else:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
    return out


def load_denoiser_weights(
    path: str | os.PathLike, name: str | None = None, *, device: Any = "cpu", key: str = "denoiser_weights"
) -> torch.nn.Module:
    """The deepinv denoiser stored in a weight file, in eval mode.

    Args:
        path: A file of :func:`save_denoiser_weights` (architecture from its header), or,
            with ``name``, any DRUNet / DnCNN state dict (architecture from the shapes).
        name: ``drunet`` or ``dncnn`` when known (a file holding the other is refused).
        device: Where the returned network lives.
        key: Parameter named in errors.

    Returns:
        The network; call it as ``denoiser(x, sigma)`` (DnCNN ignores ``sigma``). The
        trained step sizes and noise levels are in :func:`read_denoiser_metadata`
        (``unrolled_stepsize``, ``unrolled_sigma``).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no denoiser weight file at {path}")
    check_weights_file(key, path)
    metadata = read_denoiser_metadata(path) if path.suffix == ".safetensors" else {}
    state = load_state_dict(path)
    if metadata.get("format") == WEIGHTS_FORMAT or name is None:
        spec = DenoiserSpec.from_metadata(metadata)
        kind, kwargs = spec.denoiser, spec.constructor_kwargs()
    else:
        kind = name
        kwargs, state = _architecture(name, state)
    if name is not None and kind != name:
        raise ValueError(f"{key}={str(path)!r} holds a {kind}, not a {name}")
    if kind not in LEARNED:
        raise ValueError(f"{key}={str(path)!r}: unknown denoiser {kind!r}")
    net = construct(kind, kwargs)
    net.load_state_dict(state, strict=True)
    return net.to(device).eval()


def save_denoiser_weights(
    path: str | os.PathLike, denoiser: torch.nn.Module, spec: DenoiserSpec, extra: dict[str, Any] | None = None
) -> Path:
    """Write ``denoiser``'s ``state_dict`` and ``spec`` (plus ``extra``, JSON-encoded) as safetensors.

    Atomic (:func:`scopebench.atomic.atomic_write`): the file appears complete or not at all.
    """
    from safetensors.torch import save

    from scopebench.atomic import atomic_write

    path = Path(path)
    state = {key: value.detach().cpu().contiguous() for key, value in denoiser.state_dict().items()}
    metadata = spec.to_metadata()
    for key, value in (extra or {}).items():
        if key in metadata:
            raise ValueError(f"extra metadata key {key!r} collides with the denoiser spec")
        metadata[key] = json.dumps(value)
    with atomic_write(path, "wb") as fh:
        fh.write(save(state, metadata=metadata))
    return path
