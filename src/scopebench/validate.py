"""The one home of parameter checks: every error names the key, the value and what is allowed.

Used by the configs of every benchmark, the solvers and the command-line tools, so that a
bad value reads the same wherever it is caught::

    batch_size must be an integer >= 1, got 'abc' (str)

Each helper returns the value (converted where a conversion is unambiguous: an ``int``
passed where a float is expected becomes a ``float``) so a ``__post_init__`` can write
``self.lr = number("learning_rate", self.lr, low=0, low_open=True)``. ``bool`` is never
accepted as a number, and strings are not parsed, with one exception: a float written with an
exponent (``1e-3``), which YAML 1.1 (PyYAML, hence benchopt and every config file) reads as a
string while the command line reads it as a number, is a number for :func:`number` wherever it
comes from. A YAML ``abc`` (or a quoted ``"30"``) stays an error.

It is also the one home of reading YAML (:func:`load_yaml`: every config the suite reads,
aliases bounded by :data:`MAX_ALIAS_NODES`, duplicate keys and non-UTF-8 files refused) and of
quoting a value in a message (:func:`quote`: at most :data:`QUOTE_LIMIT` characters), so that
neither a hostile file nor a huge value can exhaust memory on its way to an error; and of the
seeds' bound (:func:`seed`: what torch's generators take).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_ALIAS_NODES",
    "MAX_SEED",
    "QUOTE_LIMIT",
    "batch_limit",
    "check_batch_fits",
    "choice",
    "flag",
    "integer",
    "load_yaml",
    "number",
    "optional",
    "quote",
    "seed",
    "yaml_mapping",
]

#: Most characters of a value's ``repr`` an error message quotes. A message is read by a
#: person; past a line, more of the value helps no one, and the whole ``repr`` of a huge (or
#: alias-shared, hence exponentially long) value could take gigabytes to build.
QUOTE_LIMIT = 200

#: Most nodes YAML aliases may add to a document once expanded. No config of the suite needs
#: more than a few aliases (those in the repository use none), while nine nested levels of
#: nine aliases ("billion laughs", 540 bytes) expand to 10**9 nodes, which anything that
#: walks the data (a ``repr``, a copy, a dump) pays for in full.
MAX_ALIAS_NODES = 10_000

#: The largest seed a run takes: torch seeds its generators with 64 bits (``torch.manual_seed``
#: refuses 2**64 with "Overflow when unpacking long long"), and the policy's sampler seeds each
#: epoch with ``seed + epoch``, so half the range is left for the epochs.
MAX_SEED = 2**63 - 1

#: A float written with an exponent, as YAML 1.2 and Python read it (``1e-3``, ``2.5E+4``);
#: YAML 1.1 resolves it as a float only with a dot and a signed exponent, else as a string.
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+")

_BRACKETS = {list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}"), frozenset: ("frozenset({", "})"), dict: ("{", "}")}


def _repr_parts(value: Any, limit: int, active: set[int]):
    """The pieces of ``repr(value)``, lazily, so a caller can stop after ``limit`` characters.

    Built-in containers are walked here (a nested value's full ``repr`` is never built);
    ``active`` holds the containers being walked, which print as ``[...]`` as in ``repr``.
    """
    kind = type(value)
    if kind not in _BRACKETS or not value:
        # Slicing first: the repr of a long string is as long as the string.
        yield repr(value[: limit + 1] if kind in (str, bytes) else value)
        return
    opening, closing = _BRACKETS[kind]
    if id(value) in active:
        yield f"{opening[-1]}...{closing[0]}"
        return
    active.add(id(value))
    yield opening
    for i, item in enumerate(value.items() if kind is dict else value):
        if i:
            yield ", "
        if kind is dict:
            yield from _repr_parts(item[0], limit, active)
            yield ": "
            item = item[1]
        yield from _repr_parts(item, limit, active)
    yield ",)" if kind is tuple and len(value) == 1 else closing
    active.discard(id(value))


def _clipped_repr(value: Any, limit: int = QUOTE_LIMIT) -> tuple[str, bool]:
    """``repr(value)`` cut to ``limit`` characters and ``...``, and whether it was cut.

    Only the first ``limit`` characters are ever built; a cut string keeps its closing quote.

    :Examples:
        >>> _clipped_repr(["ab", (1,), {2: None}])
        ("['ab', (1,), {2: None}]", False)
        >>> _clipped_repr("x" * 50, limit=5)
        ("'xxxx...'", True)
        >>> _clipped_repr([[1, 2]] * 3, limit=10)
        ('[[1, 2], [...', True)
    """
    pieces, size = [], 0
    for piece in _repr_parts(value, limit, set()):
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            text = "".join(pieces)[:limit] + "..."
            return (text + text[0] if type(value) is str else text), True
    return "".join(pieces), False


def _clip(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and its length.

    :Examples:
        >>> _clip("abcdef", 3)
        'abc... (6 characters)'
    """
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _describe(value: Any) -> str:
    """``repr`` and type of ``value`` for a message, clipped with its length when long.

    :Examples:
        >>> _describe("abc")
        "'abc' (str)"
        >>> _describe("x" * 1000)[-45:]
        "xxxxxxxxxx...' (str, 1000 characters)"
    """
    text, clipped = _clipped_repr(value)
    kind = type(value).__name__
    if clipped and isinstance(value, (str, bytes)):
        kind += f", {len(value)} {'characters' if isinstance(value, str) else 'bytes'}"
    elif clipped and type(value) in _BRACKETS:
        kind += f", {len(value)} items"
    return f"{text} ({kind})"


def quote(value: Any) -> str:
    """``repr(value)``, or when it is over :data:`QUOTE_LIMIT` characters its start, the type
    and the length: the value as an error message shows it.

    :Examples:
        >>> quote("fp16")
        "'fp16'"
        >>> quote(list(range(1000)))[-30:]
        '0, 51, 5... (list, 1000 items)'
    """
    text, clipped = _clipped_repr(value)
    return _describe(value) if clipped else text


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

    A string holding a float with an exponent (``"1e-3"``: what YAML 1.1 makes of ``1e-3``,
    which the command line reads as a number) is that number; any other string is refused.

    :Examples:
        >>> number("learning_rate", 1e-3, low=0, low_open=True)
        0.001
        >>> number("learning_rate", "1e-3", low=0, low_open=True)
        0.001
        >>> number("learning_rate", 0, low=0, low_open=True)
        Traceback (most recent call last):
        ...
        ValueError: learning_rate must be a finite number > 0, got 0
    """
    bounds = _bounds(low, high, low_open, high_open)
    what = "a finite number" + (f" {bounds}" if bounds else "")
    if type(value) is str and len(value) <= 100 and _EXPONENT_FLOAT.fullmatch(value):
        value = float(value)
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


def seed(key: str, value: Any) -> int:
    """``value`` as a seed: an ``int`` from 0 to :data:`MAX_SEED`.

    :Examples:
        >>> seed("seed", 2**64)
        Traceback (most recent call last):
        ...
        ValueError: seed must be an integer from 0 to 2**63 - 1 (torch seeds its generators with 64 bits and the sampler adds the epoch), got 18446744073709551616
    """
    what = "an integer from 0 to 2**63 - 1 (torch seeds its generators with 64 bits and the sampler adds the epoch)"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be {what}, got {_describe(value)}")
    if not 0 <= value <= MAX_SEED:
        raise ValueError(f"{key} must be {what}, got {value!r}")
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
        raise ValueError(f"{key} must be one of {', '.join(repr(a) for a in allowed)}, got {quote(value)}")
    return value


def optional(check, key: str, value: Any, **bounds: Any) -> Any:
    """``None`` passes; anything else goes through ``check(key, value, **bounds)``.

    :Examples:
        >>> optional(integer, "max_batch_size", None, low=1) is None
        True
    """
    return None if value is None else check(key, value, **bounds)


def batch_limit(samples: int, world_size: int = 1) -> int:
    """The largest batch :func:`check_batch_fits` accepts: each rank's whole share of ``samples``.

    :Examples:
        >>> batch_limit(96, world_size=2), batch_limit(7, world_size=2)
        (48, 3)
    """
    return samples // world_size


def check_batch_fits(
    batch_size: int,
    samples: int | None,
    world_size: int = 1,
    dataset: str = "the dataset",
    larger: str = "a larger dataset",
) -> None:
    """Refuse a batch larger than a rank's share of the dataset (``samples``: None skips).

    The one home of the batch-against-dataset rule, for every benchmark and tool. The
    training loaders drop a last incomplete batch (the policy's) or draw a batch from the
    training set without repeating a sample (the unrolled networks'), and a rank's loader
    sees ``samples / world_size`` of them, so a rank gets no batch at all (a bare
    ``StopIteration`` at the first step) unless ``batch_size x world_size <= samples``.
    Pass ``world_size=1`` where every rank sees the whole set; ``find-max-batch`` searches
    up to :func:`batch_limit`.

    Args:
        batch_size: Samples per step and rank.
        samples: The dataset's training samples; ``None`` (unknown yet) skips the check.
        world_size: Ranks that split the dataset.
        dataset: The dataset, as the message names it.
        larger: How to get a larger dataset, as the message suggests it.

    Raises:
        ValueError: naming ``batch_size``, the samples (per rank) and ``dataset``.

    :Examples:
        >>> check_batch_fits(4, 8, world_size=2)
        >>> check_batch_fits(5, 8, world_size=2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: batch_size 5 is larger than the 4 training samples per rank of the dataset (8 over 2 ranks): ...
    """
    if samples is None or batch_size <= batch_limit(samples, world_size):
        return
    share = (
        f"the {samples} training samples of {dataset}"
        if world_size == 1
        else f"the {batch_limit(samples, world_size)} training samples per rank of {dataset} "
        f"({samples} over {world_size} ranks)"
    )
    raise ValueError(f"batch_size {batch_size} is larger than {share}: lower batch_size or use {larger}")


def _alias_nodes(root) -> int:
    """How many nodes the aliases under the composed YAML node ``root`` add once expanded.

    Walks the composed graph, in which an alias is the node it names, shared: each distinct
    node once, so the walk costs what the file does however far the aliases expand.

    Raises:
        ValueError: a node holds an alias of itself (a recursive structure).
    """
    # id(node) -> its node count, aliases expanded; capped, as a bomb's count has thousands of digits.
    expanded: dict[int, int] = {}
    walking: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if node.id == "mapping":
            children = [n for pair in node.value for n in pair]
        else:
            children = node.value if node.id == "sequence" else []
        if children_done:
            walking.discard(id(node))
            expanded[id(node)] = min(1 + sum(expanded[id(c)] for c in children), 2**62)
        elif id(node) in walking:
            raise ValueError("a YAML alias refers to a node that holds it (a recursive structure)")
        elif id(node) not in expanded:
            walking.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children)
    return expanded[id(root)] - len(expanded)


def _duplicate_key(root, loader) -> str | None:
    """The first key that a mapping under the composed node ``root`` holds twice, as a message
    naming it and both lines; None when there is none.

    Checked on the composed nodes, each distinct node once (aliases are not expanded), before a
    merge (``<<``) is flattened: a key that overrides a merged one is not a duplicate. Scalar
    keys compare by the value YAML builds (``1`` and ``0x1`` are one key, ``'1'`` another).
    """
    seen_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if node.id == "mapping":
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.id != "scalar" or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                try:
                    key = (type(value := loader.construct_object(key_node)).__name__, value)
                    hash(key)
                except (TypeError, ValueError):  # unhashable or unbuildable: PyYAML's own error follows
                    continue
                line = key_node.start_mark.line + 1
                if key in first:
                    return (
                        f"key {quote(key[1])} appears twice in one mapping, at line {first[key]} and line {line}; "
                        "YAML would keep only the last: remove one"
                    )
                first[key] = line
            stack.extend(n for pair in node.value for n in pair)
        elif node.id == "sequence":
            stack.extend(node.value)
    return None


def load_yaml(path: str | Path, text: str | None = None) -> Any:
    """The data of a YAML document, read safely (``yaml.safe_load``) with aliases bounded.

    The one loader of the suite's YAML: the aliases are expanded (counted) on the composed
    nodes, before any Python object is built, and a document whose aliases would add more
    than :data:`MAX_ALIAS_NODES` nodes is refused; so is a mapping that holds a key twice
    (``yaml.safe_load`` keeps the last one silently) and a file that is not UTF-8.

    Args:
        path: The file, read unless ``text`` is given; every message names it.
        text: The document, when it is not read from a file (a command-line value).

    Raises:
        FileNotFoundError: no such file (the message names it).
        ValueError: naming ``path``: not UTF-8, not YAML, aliases past :data:`MAX_ALIAS_NODES`
            or recursive, a duplicate key (named, with both lines), nested too deep to read, or
            a value YAML cannot build (an integer of over 4300 digits).

    :Examples:
        >>> load_yaml("--lr", "[1, 2]")
        [1, 2]
        >>> load_yaml("bomb.yml", "a: &a [" + "x, " * 100 + "]\\nb: [" + "*a, " * 200 + "]")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: bomb.yml: its YAML aliases add at least 20,200 nodes once expanded, over the 10,000 allowed; ...
    """
    import yaml

    if text is None:
        data = Path(path).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{path} is not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); save it as UTF-8"
            ) from None
    loader = yaml.SafeLoader(text)
    loader.name = str(path)  # PyYAML's marks name the file, not "<unicode string>"
    try:
        node = loader.get_single_node()
        added = 0 if node is None else _alias_nodes(node)
        duplicate = None if node is None or added > MAX_ALIAS_NODES else _duplicate_key(node, loader)
        if duplicate:
            raise ValueError(duplicate)
        data = None if node is None or added > MAX_ALIAS_NODES else loader.construct_document(node)
    except yaml.YAMLError as err:
        # PyYAML quotes at most a line of the file, but a tag or an alias name comes whole.
        raise ValueError(f"{path} is not valid YAML: {_clip(str(err), 4 * QUOTE_LIMIT)}") from err
    except RecursionError:
        raise ValueError(f"{path}: YAML nested too deep to read (over a few hundred levels)") from None
    except ValueError as err:  # a recursive alias, or an int Python refuses to build (over 4300 digits)
        raise ValueError(f"{path}: {_clip(str(err), 4 * QUOTE_LIMIT)}") from err
    finally:
        loader.dispose()
    if added > MAX_ALIAS_NODES:
        raise ValueError(
            f"{path}: its YAML aliases add at least {added:,} nodes once expanded, over the {MAX_ALIAS_NODES:,} "
            "allowed; write the values out instead"
        )
    return data


def yaml_mapping(path, what: str) -> dict:
    """The mapping a YAML file holds (an empty file: ``{}``), read by :func:`load_yaml`.

    Args:
        path: The file.
        what: What the mapping holds, for the message (``"accelerate settings"``).

    Raises:
        FileNotFoundError: no such file; the message names it (``<what> file not found``).
        ValueError: not YAML, or not a mapping, naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    raw = load_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a mapping of {what} settings, got {type(raw).__name__}")
    return raw
