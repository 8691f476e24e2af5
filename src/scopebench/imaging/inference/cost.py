"""Count what one call costs: floating-point operations and bytes moved.

``flops`` come from ``torch.utils.flop_counter.FlopCounterMode``, which knows the
matrix-style operators (convolutions, matmuls, attention) and counts
``2 * multiply-adds`` for them; element-wise work is not counted, so a denoiser made only
of element-wise operators (TV, median) reports 0 FLOPs, which :func:`count_cost` turns
into ``None`` — unknown, not free.

``bytes`` is an operator-level traffic model: for every ATen operator that produces
data (views and aliases excluded), the sizes of its tensor inputs plus its tensor
outputs. It assumes nothing stays in cache between operators, so it is an upper bound
on DRAM traffic, suitable for an arithmetic-intensity (roofline) estimate, not a
hardware counter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["ByteCounterMode", "count_cost"]


def _is_view(func: Any) -> bool:
    returns = getattr(func, "_schema", None)
    if returns is None or not returns.returns:
        return False
    alias = returns.returns[0].alias_info
    return alias is not None and not alias.is_write


class ByteCounterMode(TorchDispatchMode):
    """Sum ``nbytes`` of the tensor inputs and outputs of every data-producing operator.

    :Examples:
        >>> with ByteCounterMode() as counter:
        ...     _ = torch.ones(4) + torch.ones(4)
        >>> counter.total_bytes  # ones: 16 + 16 written; add: 32 read + 16 written
        80
    """

    def __init__(self) -> None:
        super().__init__()
        self.total_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not _is_view(func):
            for leaf in tree_leaves((args, kwargs or {}, out)):
                if isinstance(leaf, torch.Tensor):
                    self.total_bytes += leaf.numel() * leaf.element_size()
        return out


def count_cost(fn: Callable[[], Any]) -> dict[str, int | None]:
    """Run ``fn()`` once and return ``{"flops": int | None, "bytes": int}``."""
    from torch.utils.flop_counter import FlopCounterMode

    flops = FlopCounterMode(display=False)
    with torch.no_grad(), flops, ByteCounterMode() as moved:
        fn()
    total = int(flops.get_total_flops())
    return {"flops": total if total > 0 else None, "bytes": int(moved.total_bytes)}
