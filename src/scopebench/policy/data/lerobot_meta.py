"""The LeRobot v3.0 format's names, and a folder's metadata checked before it names a file or a number is used.

The format's names (:data:`STATE_KEY`, :data:`ACTION_KEY`, the path templates) are defined
here once, for the reader (:mod:`scopebench.policy.data.lerobot`) and the synthetic writer
(:mod:`scopebench.policy.data.synthetic`) alike.

What :class:`scopebench.policy.data.lerobot.LeRobotFolder` reads from ``meta/info.json`` and
``meta/stats.json``, each refused in one line naming the file and the key:

* the JSON itself (:func:`read_json`): not UTF-8, not JSON, nested deeper than
  :data:`MAX_JSON_DEPTH` levels, or an integer of more digits than Python reads;
* the format version (:func:`check_version`), the state and action sizes (:func:`vector_size`);
* the statistics (:func:`check_stats`): finite numbers everywhere, and for the state and the
  action the ``min`` and ``max`` the policy normalises with, one number per dimension;
* the ``data_path`` and ``video_path`` templates (:func:`check_template`, :func:`template_path`):
  plain fields from LeRobot's set with a plain format spec, and every path they give relative to
  the folder with no ``..`` part, each of its names at most :data:`NAME_MAX` bytes. The rule is
  lexical, so symlinks inside the folder are followed wherever they point: Hugging Face's hub
  cache links each file of a snapshot to a blob outside the snapshot folder.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
import sys
from pathlib import Path, PurePosixPath

from scopebench.validate import quote

__all__ = [
    "ACTION_KEY",
    "CHUNKS_SIZE",
    "CODEBASE_VERSION",
    "DATA_PATH",
    "EPISODES_PATH",
    "MAX_JSON_DEPTH",
    "NAME_MAX",
    "NORMALIZING_STATS",
    "PER_DIMENSION_STATS",
    "STATE_KEY",
    "TEMPLATES",
    "VIDEO_PATH",
    "camera_shape",
    "check_stats",
    "check_template",
    "check_version",
    "read_json",
    "template_path",
    "vector_size",
]

#: Column and feature names of the state and action vectors (LeRobot's), the one definition.
STATE_KEY = "observation.state"
ACTION_KEY = "action"
#: The format version the writer writes; the reader takes any v3.x (:func:`check_version`).
CODEBASE_VERSION = "v3.0"
#: LeRobot v3.0's file layout: frames, videos and episode tables, ``CHUNKS_SIZE`` files per
#: ``chunk-XXX`` folder.
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNKS_SIZE = 1000

#: info.json's path templates -> the fields LeRobot v3.0 formats them with, and an example
TEMPLATES = {
    "data_path": (("chunk_index", "file_index"), DATA_PATH),
    "video_path": (("video_key", "chunk_index", "file_index"), VIDEO_PATH),
}
# Integers: a standard spec without fill or nested fields; a width of at most 3 digits, since
# "{chunk_index:0999999999d}" would build a string of a gigabyte. The camera name: as it is.
_INDEX_SPEC = re.compile(r"[<>=^]?[+\- ]?#?0?\d{0,3}[,_]?[bdoxX]?")
_NAME_SPEC = re.compile(r"s?")
#: Bytes a file or folder name may have (Linux's and macOS's ``NAME_MAX``): a longer name built
#: from a template is refused naming the template, not left to the system's ``File name too long``.
NAME_MAX = 255
#: Levels of JSON objects and arrays a metadata file may nest: LeRobot's nest five at most (a
#: camera's statistic, ``stats[camera]["mean"]`` of shape (3, 1, 1)); Python's own reader fails
#: with a ``RecursionError`` at about a thousand.
MAX_JSON_DEPTH = 32
#: The statistics the policy normalises the state and the actions with (``runner.Preprocessor``):
#: required for both features, one number per dimension.
NORMALIZING_STATS = ("min", "max")
#: Further statistics LeRobot writes per dimension; checked like those when present.
PER_DIMENSION_STATS = ("mean", "std")
#: The largest finite float32 (``numpy.finfo(numpy.float32).max``).
FLOAT32_MAX = 3.4028234663852886e38


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; every error is one line naming the file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not UTF-8, not JSON, nested deeper than :data:`MAX_JSON_DEPTH` levels, an
            integer of more digits than Python reads (``sys.get_int_max_str_digits()``), or not
            an object.
    """
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); JSON files are UTF-8"
        ) from None
    too_deep = f"{path}: JSON nested over {MAX_JSON_DEPTH} levels deep; LeRobot's metadata nests a few levels"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    except RecursionError:  # Python's reader gives up at about a thousand levels
        raise ValueError(too_deep) from None
    except ValueError:  # the one other ValueError json raises: an integer over the digit limit
        raise ValueError(
            f"{path} holds an integer of over {sys.get_int_max_str_digits()} digits, which Python refuses to "
            "read (sys.get_int_max_str_digits()); no LeRobot metadata needs one"
        ) from None
    if _depth_over(value, MAX_JSON_DEPTH):
        raise ValueError(too_deep)
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def _depth_over(value, limit: int) -> bool:
    """Whether objects and arrays nest more than ``limit`` levels in ``value`` (no recursion).

    >>> _depth_over({"a": [[1]]}, 3), _depth_over({"a": [[1]]}, 2)
    (False, True)
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def check_version(info: dict, info_path: Path) -> None:
    """Refuse anything but a v3.x dataset, saying which version it is."""
    version = str(info.get("codebase_version", ""))
    major = version.lstrip("v").split(".")[0]
    if major == "3":
        return
    if major == "2":
        raise ValueError(
            f"{info_path}: codebase_version {version!r} is a LeRobot v2 dataset (one parquet file per episode); "
            "scopebench reads LeRobot v3.0 datasets: convert it with LeRobot's "
            "`python -m lerobot.scripts.convert_dataset_v21_to_v30`"
        )
    raise ValueError(f"{info_path}: codebase_version {version!r} is not a LeRobot v3.0 dataset (v3.0 is expected)")


def check_stats(stats: dict, path: Path, dims: dict[str, int] | None = None, info_path: Path | None = None) -> None:
    """Refuse ``meta/stats.json`` where a number is NaN or infinite, or where the statistics the
    policy normalises with are missing or malformed; one line naming the file and the key.

    Python's ``json`` reads ``NaN`` and ``Infinity`` (and turns ``1e999`` into infinity) where a
    strict parser would fail; the state and action are normalised by these statistics, so one
    such number makes every training loss NaN. Every number is checked, of every feature and
    statistic (a file of a few kilobytes).

    Each feature of ``dims`` (the state and the action: their size, from ``info_path``'s
    features) needs :data:`NORMALIZING_STATS`, and each of those and of
    :data:`PER_DIMENSION_STATS` present is a list of one number per dimension, ``min`` at most
    ``max``. Without them the actions were trained unnormalised (a loss twice as high), and a
    single-value ``min`` / ``max`` was broadcast over every dimension.

    >>> check_stats({"action": {"min": [0.0, -1.0], "max": [1.0, float("nan")]}}, Path("stats.json"))
    Traceback (most recent call last):
    ValueError: stats.json: stats['action']['max'][1] is nan; every statistic must be a finite number
    >>> check_stats({"action": {"min": [0.0], "max": [1.0]}}, Path("stats.json"), {"action": 2}, Path("info.json"))
    Traceback (most recent call last):
    ValueError: stats.json: stats['action']['min'] holds 1 value, but info.json declares features['action'] of shape [2]: a statistic has one number per dimension
    """
    stack = [(stats, "")]
    while stack:  # no recursion: read_json bounds the depth, this walk needs no bound of its own
        value, where = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{path}: stats{where} is {value}; every statistic must be a finite number")
        if isinstance(value, dict):
            stack.extend((item, f"{where}[{key!r}]") for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]") for i, item in reversed(list(enumerate(value))))
    for key, dim in (dims or {}).items():
        entry, needed = stats.get(key), " and ".join(map(repr, NORMALIZING_STATS))
        if not isinstance(entry, dict):
            held = (
                f"holds {quote(entry)} there" if key in stats else f"has no {key!r} entry (only {quote(sorted(stats))})"
            )
            raise ValueError(
                f"{path} {held}: the policy normalises {key!r} with its {needed}, one number per dimension"
            )
        missing = [stat for stat in NORMALIZING_STATS if stat not in entry]
        if missing:
            raise ValueError(
                f"{path}: stats[{key!r}] lacks {' and '.join(map(repr, missing))} (it has {quote(sorted(entry))}): the policy "
                f"normalises {key!r} with its {needed}"
            )
        for stat in (*NORMALIZING_STATS, *PER_DIMENSION_STATS):
            values = entry.get(stat)
            if stat not in entry:
                continue
            name = f"{path}: stats[{key!r}][{stat!r}]"
            if not isinstance(values, list) or not all(_is_number(v) for v in values):
                raise ValueError(f"{name} must be a list of {dim} numbers (one per dimension), got {quote(values)}")
            if len(values) != dim:
                raise ValueError(
                    f"{name} holds {len(values)} value{'s' if len(values) != 1 else ''}, but {info_path} declares "
                    f"features[{key!r}] of shape [{dim}]: a statistic has one number per dimension"
                )
            huge = [i for i, v in enumerate(values) if abs(v) > FLOAT32_MAX]
            if huge:
                raise ValueError(
                    f"{name}[{huge[0]}] is {quote(values[huge[0]])}, beyond float32's range (the policy normalises in "
                    "float32, where it is infinite)"
                )
        above = [i for i, (lo, hi) in enumerate(zip(entry["min"], entry["max"])) if lo > hi]
        if above:
            i = above[0]
            raise ValueError(
                f"{path}: stats[{key!r}]['min'][{i}] is {entry['min'][i]}, above stats[{key!r}]['max'][{i}] "
                f"{entry['max'][i]}; min must be at most max"
            )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def vector_size(features: dict, key: str, info_path: Path) -> int:
    """The size ``n`` of the vector feature ``key`` of ``info_path`` (shape ``[n]``, ``n >= 1``).

    >>> vector_size({"action": {"shape": [7]}}, "action", Path("info.json"))
    7
    >>> vector_size({"action": {"shape": "7"}}, "action", Path("info.json"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: info.json: features['action'] needs a 'shape' of one integer >= 1 ...
    """
    feature = features.get(key)
    shape = feature.get("shape") if isinstance(feature, dict) else None
    if not (isinstance(shape, list) and len(shape) == 1 and _is_number(shape[0]) and shape[0] == int(shape[0]) >= 1):
        got = (
            f"features[{key!r}]['shape'] {quote(shape)}"
            if isinstance(feature, dict)
            else f"features {sorted(features)}"
        )
        raise ValueError(
            f"{info_path}: features[{key!r}] needs a 'shape' of one integer >= 1 (the policy reads the state and the "
            f"actions as vectors), got {got}"
        )
    return int(shape[0])


def camera_shape(feature: dict) -> tuple[int, int]:
    """(height, width) of a camera feature whose shape is (H, W, C) or (C, H, W); the position
    of the 3 channels decides, since published datasets' ``names`` do not always match the shape."""
    shape = [int(n) for n in feature["shape"]]
    if len(shape) == 3 and shape[0] in (1, 3) and shape[2] not in (1, 3):
        return shape[1], shape[2]
    return shape[0], shape[1]


def check_template(template, key: str, info_path: Path) -> None:
    """Refuse a path template of ``info_path`` (``key`` is ``data_path`` or ``video_path``) that
    could name more than a file of the dataset or run code: ``str.format`` evaluates attribute
    and index access (``{chunk_index.__class__}``), and an absolute or ``..`` template reads any
    file the user can (FFmpeg decodes whatever it is given).

    Allowed: a non-empty relative path without a ``..`` part, whose fields are plain names of
    :data:`TEMPLATES` with no conversion and a plain format spec (``03d``; none or ``s`` for
    ``video_key``).

    >>> check_template(DATA_PATH, "data_path", Path("meta/info.json"))
    >>> check_template("../{file_index}.parquet", "data_path", Path("info.json"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: info.json: data_path '../{file_index}.parquet' must be a path inside the dataset folder: ...
    """
    allowed, example = TEMPLATES[key]
    where = f"{info_path}: {key} {template!r}"
    if not isinstance(template, str) or not template.strip():
        raise ValueError(f"{where} must be a non-empty path template, such as {example!r}")
    if template.startswith(("/", "~")) or ".." in PurePosixPath(template).parts:
        raise ValueError(
            f"{where} must be a path inside the dataset folder: relative, with no '..' part (such as {example!r})"
        )
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError as err:
        raise ValueError(f"{where} is not a format template ({err}); such as {example!r}") from err
    for name, spec, conversion in fields:
        if name not in allowed:
            raise ValueError(
                f"{where}: field {{{name}}} is not allowed; fields are plain names from {list(allowed)}, "
                "without attribute or index access ('.', '[')"
            )
        if conversion is not None:
            raise ValueError(f"{where}: field {{{name}}} has conversion !{conversion}; none is allowed")
        if not (_NAME_SPEC if name == "video_key" else _INDEX_SPEC).fullmatch(spec):
            allowed_spec = (
                "none or 's'" if name == "video_key" else "a plain integer spec such as '03d', width <= 3 digits"
            )
            raise ValueError(f"{where}: field {{{name}}} has format spec {spec!r}; allowed: {allowed_spec}")


def template_path(root: Path, template: str, key: str, info_path: Path, **fields) -> Path:
    """``root / template.format(**fields)`` for a template :func:`check_template` passed,
    refused where a value leads out of ``root``: a camera name (``video_key``, a key of
    info.json's ``features``) with a ``..`` part or a leading ``/``.

    The check is lexical, not :meth:`Path.resolve`: a symlink inside ``root`` is followed
    wherever it points (the hub cache's snapshot files are links to blobs outside the snapshot
    folder). Any ``..`` is refused, even one that would lexically land back inside: after a
    symlink, the system takes ``link/..`` in the link's target.
    """
    relative = PurePosixPath(template.format(**fields))
    path = root / relative
    values = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    if relative.is_absolute() or ".." in relative.parts:
        raise ValueError(
            f"{info_path}: {key} {template!r} with {values} gives {path}, outside the dataset folder {root}; "
            "paths must stay inside it (relative, with no '..' part)"
        )
    longest = max(relative.parts, key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(longest)) > NAME_MAX:
        raise ValueError(
            f"{info_path}: {key} {template!r} with {values} gives a name of {len(os.fsencode(longest))} bytes "
            f"({quote(longest[:40])}...), over the {NAME_MAX} a file or folder name may have"
        )
    return path
