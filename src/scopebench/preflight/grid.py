"""benchopt's grid syntax: the cells a ``--config`` expands to, from a benchmark's own classes.

The rules are benchopt 1.10's: each ``dataset`` / ``objective`` / ``solver`` pattern
(``"Name[key=value,...]"`` or a mapping) updates the product of its class's default
``parameters``; ``"a, b": [[...], ...]`` couples parameters. The defaults are read from
the benchmark's files (:func:`load_classes`), which import benchopt; this module does not.
Nothing here checks whether a cell can run: :mod:`scopebench.preflight` asks each
solver's ``check_cell``.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Classes", "expand", "load_classes", "parse_pattern"]


# -- patterns and the grid -----------------------------------------------------------------
_SCALARS = {"True": True, "False": False, "None": None}  # Python's spelling, as benchopt reads names
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _value(text: str) -> Any:
    text = text.strip()
    if text[:1] in "[(" and text[-1:] in "])":
        return [_value(item) for item in _split_top(text[1:-1])]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in _SCALARS:
        return _SCALARS[text]
    if _NUMBER.fullmatch(text):
        number = float(text)
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else number
    return text


def parse_pattern(pattern: str | Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(class name pattern, parameters)`` of a config entry, as benchopt reads it.

    :Examples:
        >>> parse_pattern("simulated[image_size=32,operator=[blur, inpainting],noise_level=1e-2]")
        [('simulated', {'image_size': 32, 'operator': ['blur', 'inpainting'], 'noise_level': 0.01})]
        >>> parse_pattern({"PnP": {"denoiser": "tv"}})
        [('PnP', {'denoiser': 'tv'})]
    """
    if isinstance(pattern, Mapping):
        out = []
        for name, params in pattern.items():
            if params is None:
                params = {}
            if not isinstance(params, Mapping):
                raise ValueError(f"{name}: expected a mapping of parameters, got {params!r}")
            out.append((str(name), dict(params)))
        return out
    if not isinstance(pattern, str):
        raise ValueError(f"expected a name or a mapping, got {pattern!r}")
    match = re.fullmatch(r"\s*([^\[\]]+?)\s*(?:\[(.*)\])?\s*", pattern)
    if match is None:
        raise ValueError(f"cannot read the pattern {pattern!r} (expected name[key=value, ...])")
    name, inside = match.group(1), match.group(2)
    params = {}
    for item in _split_top(inside or ""):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{pattern!r}: {item!r} is not key=value (check-config reads only named parameters)")
        params[key.strip().strip("'\"")] = _value(value)
    return [(name, params)]


def _product(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of a parameter grid; ``"a, b"`` keys take value tuples together."""
    keys = list(params)
    values = [v if isinstance(v, (list, tuple)) else [v] for v in params.values()]
    grid = []
    for combo in itertools.product(*values):
        cell: dict[str, Any] = {}
        for key, value in zip(keys, combo):
            if "," in key:
                names = [n.strip() for n in key.split(",")]
                if not isinstance(value, (list, tuple)) or len(value) != len(names):
                    raise ValueError(f"{key!r}: each value must list {len(names)} items, got {value!r}")
                cell.update(zip(names, value))
            else:
                cell[key] = value
        grid.append(cell)
    return grid


def expand(patterns: Any, classes: Mapping[str, Mapping[str, Any]], kind: str) -> list[tuple[str, dict, dict]]:
    """``(class name, full parameters, parameters set by the config)`` of every cell.

    Args:
        patterns: The config's list under ``kind`` (``None`` or ``"all"``: every class with
            its defaults).
        classes: Class name -> its default ``parameters`` grid.
        kind: ``dataset``, ``objective`` or ``solver`` (for messages).
    """
    if patterns is None or patterns == "all" or (isinstance(patterns, list) and "all" in patterns):
        selected = [(name, {}) for name in classes]
    else:
        items = patterns if isinstance(patterns, list) else [patterns]
        selected = [entry for item in items for entry in parse_pattern(item)]
    cells: list[tuple[str, dict, dict]] = []
    for name_pattern, params in selected:
        regex = re.escape(name_pattern).replace(r"\*", ".*")
        names = [name for name in classes if re.fullmatch(regex, name, flags=re.IGNORECASE)]
        if not names:
            raise ValueError(f"{kind} {name_pattern!r} matches none of {sorted(classes)}")
        for name in names:
            defaults = classes[name]
            known = {p.strip() for key in defaults for p in key.split(",")}
            for update in _product(params):
                unknown = sorted(set(update) - known)
                if unknown:
                    raise ValueError(f"{kind} {name}: unknown parameter(s) {unknown}; known: {sorted(known)}")
                for default in _product(defaults):
                    full = {**default, **update}
                    if all(full != c[1] or name != c[0] for c in cells):
                        cells.append((name, full, update))
    return cells


# -- the benchmark's classes ---------------------------------------------------------------
@dataclass
class Classes:
    """Names and default parameters of a benchmark's objective, datasets and solvers."""

    objectives: dict[str, dict] = field(default_factory=dict)
    datasets: dict[str, dict] = field(default_factory=dict)
    solvers: dict[str, dict] = field(default_factory=dict)
    solver_classes: dict[str, type] = field(default_factory=dict)
    """Each solver's class (its ``check_cell`` says whether a cell can run)."""
    slurm_params: dict[str, dict] = field(default_factory=dict)
    """Each solver's static ``slurm_params`` (benchopt merges them between the parallel
    config and the solver's ``slurm_*`` parameters)."""


def _load(path: Path, attr: str) -> Any:
    name = f"_scopebench_preflight_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        return getattr(module, attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot read the {attr} class of {path}: {err}") from None
    finally:
        sys.modules.pop(name, None)


def load_classes(benchmark: str | Path) -> Classes:
    """Read ``name`` and ``parameters`` of every class of a benchmark folder (no data)."""
    root = Path(benchmark)
    if not (root / "objective.py").is_file():
        raise ValueError(f"{root} is not a benchmark folder (no objective.py)")
    classes = Classes()
    objective = _load(root / "objective.py", "Objective")
    classes.objectives[objective.name] = dict(objective.parameters)
    for path in sorted((root / "datasets").glob("*.py")):
        dataset = _load(path, "Dataset")
        classes.datasets[dataset.name] = dict(dataset.parameters)
    for path in sorted((root / "solvers").glob("*.py")):
        solver = _load(path, "Solver")
        classes.solvers[solver.name] = dict(solver.parameters)
        classes.solver_classes[solver.name] = solver
        classes.slurm_params[solver.name] = dict(getattr(solver, "slurm_params", {}) or {})
    return classes
