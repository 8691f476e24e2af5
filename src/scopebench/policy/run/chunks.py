"""What an inference call returned, checked outside its clock: the chunk's shape and its values.

The inference tools (``bench-inference``, ``decompose-latency``, ``Pi05Inference``) time a
policy's calls; a call that returns garbage is timed as readily as a good one. So each call's
output (after ``postprocess``: what :attr:`InferenceRun.actions` keeps) is checked by
:class:`ChunkCheck`, after the call's clock has stopped (in the loop, in callback time):

* **its shape**: the first call at a ``num_steps`` fixes the shape of that ``num_steps``'s
  chunks; a later call that returns another is refused (:class:`~scopebench.policy.user.PolicyError`)
  naming both. A call of ``B`` chunks (``--chunks-per-call``) must return ``(B, ...)`` when a call
  of one returns ``(1, ...)``: chunks per second are counted from it.
* **the actions of a chunk**: a tensor of three dims or more is read as ``(batch, actions,
  action dims...)``; ``n_action_steps`` above its actions is refused at the first such call,
  naming both (the run config's ``chunk_size`` is pi05's; a policy of your own returns what it
  returns). Another output (``(batch, action_dim)``: one action a call, or generated tokens)
  says nothing of its actions: the config's ``chunk_size`` stands for them.
* **its values**: a floating-point tensor holding NaN or inf fails the run with
  :class:`NonFiniteActionsError`, naming the call and its ``num_steps``.

Also the memory a call of ``B`` chunks needs for its inputs (:func:`check_chunks_memory`),
checked before any such call: ``B`` times the bytes of one observation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

__all__ = ["ChunkCheck", "NonFiniteActionsError", "batch_bytes", "check_chunks_memory", "output_shape"]


class NonFiniteActionsError(FloatingPointError):
    """An inference call returned NaN or infinite actions: the run fails (exit status 1)."""


def output_shape(output: Any) -> Any:
    """A call's output by shape: a tensor's shape as a tuple; dicts, lists and tuples of them
    alike (sequences as lists); anything else by its type's name.

    :Examples:

    >>> output_shape({"actions": torch.zeros(1, 8, 4), "text": "go"})
    {'actions': (1, 8, 4), 'text': 'str'}
    """
    if isinstance(output, torch.Tensor):
        return tuple(output.shape)
    if isinstance(output, Mapping):
        return {k: output_shape(v) for k, v in output.items()}
    if isinstance(output, (list, tuple)):
        return [output_shape(v) for v in output]
    return type(output).__name__


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, Mapping):
        for value in output.values():
            yield from _tensors(value)
    elif isinstance(output, (list, tuple)):
        for value in output:
            yield from _tensors(value)


def batch_bytes(batch: Any) -> int:
    """Bytes of the tensors of ``batch`` (dicts, lists and tuples of tensors), as if each were
    contiguous (an expanded tensor counts every element it shows).

    :Examples:

    >>> batch_bytes({"image": torch.zeros(1, 3, 4, 4), "state": [torch.zeros(2, dtype=torch.float64)]})
    208
    """
    return sum(t.numel() * t.element_size() for t in _tensors(batch))


class ChunkCheck:
    """The checks of the module docstring, one object per run (it remembers the first shapes).

    Args:
        who: How errors name the policy (``policy mypkg:make: ``).
        n_action_steps: Actions executed per chunk (None: the whole chunk).
        key: How errors name ``n_action_steps`` (``--n-action-steps``).
    """

    def __init__(self, who: str, n_action_steps: int | None, key: str = "n_action_steps") -> None:
        self.who, self.n_action_steps, self.key = who, n_action_steps, key
        #: ``(num_steps, chunks) -> shape`` of the first output (:func:`output_shape`).
        self.shapes: dict[tuple[int, int], Any] = {}
        #: ``num_steps -> actions`` of a one-chunk call whose output is ``(batch, actions, action dims...)``.
        self.actions: dict[int, int] = {}

    def __call__(self, output: Any, *, call: str, num_steps: int, chunks: int = 1) -> None:
        """Check ``output`` of ``call`` (``timed call 3``) at ``num_steps``, a call of ``chunks`` chunks.

        Raises:
            PolicyError: a shape other than the expected one (naming both).
            ValueError: ``n_action_steps`` above the chunk's actions.
            NonFiniteActionsError: NaN or inf values.
        """
        from scopebench.policy.user import PolicyError

        shape = output_shape(output)
        expected, why = self._expected(num_steps, chunks)
        if expected is None:
            self.shapes[num_steps, chunks] = shape
            if chunks == 1 and isinstance(shape, tuple) and len(shape) >= 3:
                self._first_chunk(shape, num_steps)
        elif shape != expected:
            raise PolicyError(f"{self.who}{call} (num_steps={num_steps}) returned {_shown(shape)}, expected {why}")
        self._values(output, call, num_steps)

    def _expected(self, num_steps: int, chunks: int) -> tuple[Any, str]:
        seen = self.shapes.get((num_steps, chunks))
        if seen is not None:
            return seen, f"{_shown(seen)} as its first call at num_steps={num_steps} returned"
        one = self.shapes.get((num_steps, 1))
        if chunks != 1 and isinstance(one, tuple) and one[:1] == (1,):
            return (chunks, *one[1:]), f"{_shown((chunks, *one[1:]))}: {chunks} chunks of {_shown(one)}"
        return None, ""

    def _first_chunk(self, shape: tuple, num_steps: int) -> None:
        self.actions[num_steps] = actions = shape[1]
        if self.n_action_steps is not None and self.n_action_steps > actions:
            raise ValueError(
                f"{self.who}{self.key} must be at most the {actions} actions of a chunk, got {self.n_action_steps} "
                f"(its first call at num_steps={num_steps} returned shape {shape}, read as (batch, actions, action dims...))"
            )

    def _values(self, output: Any, call: str, num_steps: int) -> None:
        bad = [t for t in _tensors(output) if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if not bad:
            return
        nan = sum(int(torch.isnan(t).sum()) for t in bad)
        inf = sum(int(torch.isinf(t).sum()) for t in bad)
        total = sum(t.numel() for t in _tensors(output) if t.is_floating_point())
        raise NonFiniteActionsError(
            f"{self.who}{call} (num_steps={num_steps}) returned non-finite actions: {nan} NaN and {inf} inf "
            f"of {total} values"
        )


def _shown(shape: Any) -> str:
    return f"shape {shape}" if isinstance(shape, tuple) else f"an output shaped {shape}"


def check_chunks_memory(key: str, sizes: Sequence[int], observation: Any, device: torch.device) -> None:
    """Refuse chunks per call whose largest call's inputs alone exceed the memory available on
    ``device``: ``B`` times :func:`batch_bytes` of one observation (activations come on top), before
    any such call, naming ``key``, the size, what it needs and the most chunks that fit.

    Raises:
        ValueError: ``--chunks-per-call 1000000: a call of 1000000 chunks needs 24.6 GB ...``.
    """
    from scopebench.train.memory import available_memory_bytes

    per_chunk, largest = batch_bytes(observation), max(sizes)
    if per_chunk == 0:  # no tensor to count: nothing to bound
        return
    available = available_memory_bytes(device)
    if largest * per_chunk > available:
        raise ValueError(
            f"{key} {largest}: a call of {largest} chunks needs {largest * per_chunk / 1e9:.1f} GB on {device} "
            f"for its inputs alone ({largest} x the {per_chunk / 1e3:.1f} kB of one observation) but "
            f"{available / 1e9:.1f} GB are available: at most {available // per_chunk} chunks a call fit"
        )
