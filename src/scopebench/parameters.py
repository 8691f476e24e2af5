"""BenchOpt parameter grids built from the library's settings dataclasses.

A solver's default is the default of the library's dataclass that validates it
(:class:`~scopebench.policy.settings.TrainSettings`,
:class:`~scopebench.imaging.inference.engine.ReconstructionConfig`,
:class:`~scopebench.imaging.training.trainer.TrainConfig`, ...), so ``benchopt run`` and
the library, the command-line tools and the scripts cannot drift apart: until issue 34
the imaging solvers declared ``denoiser_sigma: [0.01]`` while the library defaulted to
0.05. Stdlib only: the solver files import it at module level.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["defaults", "solver_parameters"]


def defaults(cls) -> dict[str, Any]:
    """Every field of the dataclass ``cls`` with its default (a factory's value), in field order.

    :Examples:

    >>> from scopebench.cluster import CellLayout
    >>> defaults(CellLayout)
    {'nproc_per_node': 1, 'slurm_nodes': 1, 'slurm_ntasks_per_node': None, 'slurm_gres': None}
    """
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
    }


def solver_parameters(cls, *names: str, exclude: tuple[str, ...] = ("seed",)) -> dict[str, list[Any]]:
    """A benchopt parameter grid of one value per field: the settings dataclass's defaults.

    The solvers and the policy's dataset build their ``parameters`` with it, so a default
    lives in one place (``seed`` comes from the dataset in every benchmark, hence excluded
    by default).

    Args:
        cls: A settings dataclass (``TrainSettings``, ``ReconstructionConfig``, ...).
        *names: The fields to include, in the dataclass's order (default: all).
        exclude: Fields left out.

    Raises:
        ValueError: a name that is not a field of ``cls``.

    :Examples:

    >>> from scopebench.cluster import CellLayout
    >>> solver_parameters(CellLayout, "nproc_per_node", "slurm_nodes")
    {'nproc_per_node': [1], 'slurm_nodes': [1]}
    """
    fields = defaults(cls)
    unknown = sorted(set(names) - set(fields))
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}; its fields are {sorted(fields)}")
    return {name: [default] for name, default in fields.items() if (not names or name in names) and name not in exclude}
