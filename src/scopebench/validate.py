"""The one home of parameter checks: every error names the key, the value and what is allowed.

Used by the configs of every benchmark, the solvers and the command-line tools, so that a
bad value reads the same wherever it is caught::

    batch_size must be an integer >= 1, got 'abc' (str)

Each helper returns the value (converted where a conversion is unambiguous: an ``int``
passed where a float is expected becomes a ``float``) so a ``__post_init__`` can write
``self.lr = number("learning_rate", self.lr, low=0, low_open=True)``. ``bool`` is never
accepted as a number, and strings are never parsed: a YAML ``abc`` stays an error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["choice", "flag", "integer", "number", "optional", "yaml_mapping"]


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _bounds(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high}")
    return " and ".join(parts)


def integer(key: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` within ``[low, high]`` (each bound optional).

    :Examples:
        >>> integer("batch_size", 4, low=1)
        4
        >>> integer("batch_size", "abc", low=1)
        Traceback (most recent call last):
        ...
        ValueError: batch_size must be an integer >= 1, got 'abc' (str)
    """
    what = "an integer" + (f" {_bounds(low, high)}" if low is not None or high is not None else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be {what}, got {_describe(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{key} must be {what}, got {value!r}")
    return value


def number(
    key: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite ``float`` within the bounds (``*_open``: strict inequality).

    :Examples:
        >>> number("learning_rate", 1e-3, low=0, low_open=True)
        0.001
        >>> number("learning_rate", 0, low=0, low_open=True)
        Traceback (most recent call last):
        ...
        ValueError: learning_rate must be a finite number > 0, got 0
    """
    bounds = _bounds(low, high, low_open, high_open)
    what = "a finite number" + (f" {bounds}" if bounds else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be {what}, got {_describe(value)}")
    value = float(value)
    bad = not math.isfinite(value)
    if low is not None:
        bad |= value <= low if low_open else value < low
    if high is not None:
        bad |= value >= high if high_open else value > high
    if bad:
        raise ValueError(f"{key} must be {what}, got {value:g}")
    return value


def flag(key: str, value: Any) -> bool:
    """``value`` if it is a ``bool`` (YAML ``true``/``false``), else ``ValueError``.

    :Examples:
        >>> flag("no_optim", "yes")
        Traceback (most recent call last):
        ...
        ValueError: no_optim must be true or false, got 'yes' (str)
    """
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {_describe(value)}")
    return value


def choice(key: str, value: Any, allowed: Iterable[Any]) -> Any:
    """``value`` if it is one of ``allowed``.

    :Examples:
        >>> choice("precision", "fp16", ("fp32", "bf16"))
        Traceback (most recent call last):
        ...
        ValueError: precision must be one of 'fp32', 'bf16', got 'fp16'
    """
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{key} must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
    return value


def optional(check, key: str, value: Any, **bounds: Any) -> Any:
    """``None`` passes; anything else goes through ``check(key, value, **bounds)``.

    :Examples:
        >>> optional(integer, "max_batch_size", None, low=1) is None
        True
    """
    return None if value is None else check(key, value, **bounds)


def yaml_mapping(path, what: str) -> dict:
    """The mapping a YAML file holds (an empty file: ``{}``).

    Args:
        path: The file.
        what: What the mapping holds, for the message (``"accelerate settings"``).

    Raises:
        FileNotFoundError: no such file; the message names it (``<what> file not found``).
        ValueError: not YAML, or not a mapping, naming the file.
    """
    from pathlib import Path

    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a mapping of {what} settings, got {type(raw).__name__}")
    return raw
