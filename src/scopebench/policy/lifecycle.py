"""The context-manager plumbing the policy run objects share.

A run object builds everything it must undo into one :class:`contextlib.ExitStack` in
``_start``; leaving the ``with`` block (or :meth:`RunLifecycle.close`) unwinds that stack
in reverse order, also when ``_start`` or the loop failed, and the object can then be
started again (benchopt starts a solver's run once per repetition).

Starting applies :func:`scopebench.allocator.keep_freed_memory`, as the imaging run object
does: whoever drives a run (solver, launched rank, tool, benchmark script) gets the same
allocator. Without it a ``small`` training step faulted in about 50 000 fresh pages
(its freed activations and matmul outputs returned to the kernel and mapped again).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

__all__ = ["RunLifecycle"]


class RunLifecycle:
    """Subclasses implement ``_start(*args)`` and register every teardown on ``self._stack``."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._started = False

    def _start(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def start(self, *args: Any, **kwargs: Any):
        """Build the run (no-op when already started); on failure, undo what was built."""
        from scopebench.allocator import keep_freed_memory

        if self._started:
            return self
        keep_freed_memory()
        self._started = True
        try:
            self._start(*args, **kwargs)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._stack.__exit__(exc_type, exc, tb)
        finally:
            self._stack = contextlib.ExitStack()
            self._started = False

    def close(self, failed: bool = False) -> None:
        """Tear down what :meth:`start` built (``failed``: as after an error)."""
        if failed:
            self.__exit__(RuntimeError, RuntimeError(f"{type(self).__name__} failed"), None)
        else:
            self.__exit__(None, None, None)
