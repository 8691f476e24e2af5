"""Unused-parameter audit: which parameters a forward+backward leaves without a gradient.

DDP with ``find_unused_parameters=False`` fails on a parameter that requires a gradient
but gets none; with ``True`` it walks the autograd graph every step to find them. Run
this audit once on a real batch: if ``unused`` is empty, the flag can be turned off.
Typical findings: on pi05, with ``ce_weight=0`` the discrete head, the prefix's final norm
and the last prefix layer's output path are unused, because only the prefix keys and
values feed the action expert; on Hugging Face's PaliGemma, the SigLIP vision tower's pooling
head (``vision_tower.head``), which PaliGemma never calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn


@dataclass
class ParameterAudit:
    """Parameter names by category after one forward+backward."""

    unused: list[str] = field(default_factory=list)
    """``requires_grad`` but ``grad is None``: what DDP would reject."""
    frozen: list[str] = field(default_factory=list)
    """``requires_grad`` is False."""
    used: list[str] = field(default_factory=list)
    """Received a gradient (including all-zero ones)."""
    zero_grad: list[str] = field(default_factory=list)
    """Subset of ``used`` whose gradient is exactly zero (only when asked for)."""
    numel: dict[str, int] = field(default_factory=dict)
    """Elements per parameter name."""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Shape per parameter name."""
    include_zero_grad: bool = False
    """Whether ``zero_grad`` was filled."""

    def count(self, category: str) -> int:
        """Elements in a category (``unused``, ``frozen``, ``used``, ``zero_grad``)."""
        return sum(self.numel[name] for name in getattr(self, category))

    @property
    def safe_without_find_unused(self) -> bool:
        """True when DDP can run with ``find_unused_parameters=False`` (nothing unused)."""
        return not self.unused

    def by_module(self, category: str) -> dict[str, list[str]]:
        """Names of a category grouped by their module (the name without its last part).

        :Examples:

        >>> audit = ParameterAudit(unused=["head.weight", "head.bias", "norm.weight"])
        >>> audit.by_module("unused")
        {'head': ['head.weight', 'head.bias'], 'norm': ['norm.weight']}
        """
        groups: dict[str, list[str]] = {}
        for name in getattr(self, category):
            groups.setdefault(name.rpartition(".")[0] or name, []).append(name)
        return groups

    def format(self) -> str:
        """A readable report: one section per category, grouped by module (upstream layout)."""
        titles = {
            "unused": "UNUSED (requires_grad=True, grad is None) - DDP refuses these without find_unused_parameters=True",
            "frozen": "FROZEN (requires_grad=False) - context",
            "zero_grad": "ZERO GRAD (grad exists but is all zeros on this batch)",
        }
        lines = [
            "#" + "=" * 78,
            "# parameter audit - single forward + backward, single device",
            f"# include_zero_grad={self.include_zero_grad}",
            "#" + "=" * 78,
        ]
        for category in ("unused", "frozen") + (("zero_grad",) if self.include_zero_grad else ()):
            names = getattr(self, category)
            lines += [
                "",
                f"{'=' * 10} {titles[category]} ({len(names)} tensors, {self.count(category):,} params) {'=' * 10}",
            ]
            for module, members in self.by_module(category).items():
                count = sum(self.numel[n] for n in members)
                lines.append(f"  [{module}]  ({len(members)} tensors, {count:,} params)")
                lines += [f"    - {n}  shape={tuple(self.shapes.get(n, ()))}" for n in members]
        used = [n for n in self.used if n not in set(self.zero_grad)]
        lines += ["", f"# USED (requires_grad=True, grad is non-trivial): {len(used)} tensors"]
        if self.safe_without_find_unused:
            lines.append("# UNUSED is empty: DDP can run with find_unused_parameters=False (FIND_UNUSED_PARAMS=false).")
        else:
            lines.append(
                f"# {len(self.unused)} tensors get no gradient: keep find_unused_parameters=True, or freeze or "
                "remove them (or give them an unconditional graph edge)."
            )
        return "\n".join(lines)


def find_unused_parameters(
    model: nn.Module, batch: Any, include_zero_grad: bool = False, loss: Callable | None = None
) -> ParameterAudit:
    """Run one forward+backward of ``model(batch)`` and sort parameters by gradient.

    Args:
        model: a module whose ``forward(batch)`` returns ``loss`` or ``(loss, ...)``.
        batch: a preprocessed training batch.
        include_zero_grad: also list used parameters whose gradient is all zeros
            (reached by the graph but given no learning signal on this batch).
        loss: ``loss(model, batch) -> scalar`` in place of ``model(batch)`` (a policy's loss).

    Returns:
        A :class:`ParameterAudit`. Gradients are cleared again afterwards.
    """
    model.zero_grad(set_to_none=True)
    out = model(batch) if loss is None else loss(model, batch)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        raise TypeError(f"expected model(batch) to return a scalar loss, got {type(loss).__name__}")
    loss.backward()
    audit = ParameterAudit(include_zero_grad=include_zero_grad)
    for name, param in model.named_parameters():
        audit.numel[name] = param.numel()
        audit.shapes[name] = tuple(param.shape)
        if not param.requires_grad:
            audit.frozen.append(name)
        elif param.grad is None:
            audit.unused.append(name)
        else:
            audit.used.append(name)
            if include_zero_grad and not bool(param.grad.any()):
                audit.zero_grad.append(name)
    model.zero_grad(set_to_none=True)
    return audit
