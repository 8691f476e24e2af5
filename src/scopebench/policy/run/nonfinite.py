"""A training loss that is no longer a number: what was found, and the one line that says it.

A loss that turns NaN or infinite does not stop PyTorch: the backward spreads it into every
gradient, the optimizer into every weight, and each later step computes on NaN. A checkpoint
saved after it holds NaN weights, and a ``checkpoints/last`` pointing there makes a resume
start from nothing. So :class:`~scopebench.policy.run.steps.TrainStep` checks the loss of
every step when it gathers the losses (every ``gather_every`` steps, before a checkpoint is
saved, and when the loop ends) and keeps the first one that is not finite as a
:class:`NonFiniteLoss`, naming the loss term that is not finite either (the cause), if any. The
check is made on the host, on values every rank gathered: every rank finds the same record at
the same step, and the ranks decide alike without another collective or any device work.

What each driver does with it: ``scopebench train`` stops, saves nothing of that step or later
and exits 1; ``profile-step`` finishes its measured steps, says it on stderr and in its JSON
and exits 1; ``Pi05Train`` stops every rank and raises :class:`NonFiniteLossError` on rank 0,
which benchopt records as the cell's error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["NonFiniteLoss", "NonFiniteLossError"]


class NonFiniteLossError(FloatingPointError):
    """A training run stopped at a non-finite loss (``Pi05Train``: benchopt records it)."""


@dataclass(frozen=True)
class NonFiniteLoss:
    """The first non-finite loss of a run: which step, which term, on which rank.

    ``term`` is the first term of the policy's loss (in name order) that is not finite at that
    step on that rank (the cause), else ``train_loss`` itself.
    """

    step: int
    """The optimizer step whose loss was non-finite, counted from 1 (a resumed run counts on)."""
    term: str
    """``train_loss``, or the loss term that was non-finite (``mse_loss``)."""
    value: float
    """Its value on that rank: NaN, +inf or -inf."""
    train_loss: float
    """The step's loss on that rank."""
    rank: int
    """The first rank (in rank order) where it was non-finite."""
    world_size: int
    """Ranks of the run."""
    checked_at: int
    """The step at which the losses were checked and it was found (``step`` or later)."""
    gather_every: int
    """The run's ``gather_every``: losses are checked every this many steps and before a save."""

    def describe(self, found_at: bool = True) -> str:
        """The one line that names the step and the term (and, when the check came later
        than the step and ``found_at``, where it was found: a driver that stops on it says why
        it stopped later; ``profile-step`` stops on nothing and leaves it out).

        :Examples:

        >>> NonFiniteLoss(3, "mse_loss", float("nan"), float("nan"), 0, 1, 3, 1).describe()
        "step 3: loss term 'mse_loss' is nan (train_loss nan)"
        >>> NonFiniteLoss(3, "train_loss", float("inf"), float("inf"), 1, 2, 4, 3).describe()
        'step 3: train_loss is inf on rank 1 (found at step 4: gather_every=3 checks the losses every 3 steps)'
        """
        where = f" on rank {self.rank}" if self.world_size > 1 else ""
        name = "train_loss" if self.term == "train_loss" else f"loss term {self.term!r}"
        notes = [] if self.term == "train_loss" else [f"train_loss {self.train_loss:.4g}"]
        if found_at and self.checked_at != self.step:
            notes.append(
                f"found at step {self.checked_at}: gather_every={self.gather_every} checks the losses "
                f"every {self.gather_every} steps"
            )
        return f"step {self.step}: {name} is {self.value:g}{where}" + (f" ({'; '.join(notes)})" if notes else "")

    def record(self, found_at: bool = True) -> dict[str, Any]:
        """The fields and :meth:`describe`'s line as ``message``, for a JSON report."""
        return {**asdict(self), "message": self.describe(found_at)}
