"""Solver-side glue: the seven ``profiler_*`` parameters, without importing benchopt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from scopebench.profiler.config import PROFILER_DEFAULTS, ProfilerConfig

__all__ = ["ProfiledSolverMixin"]


class ProfiledSolverMixin:
    """Mix into a benchopt ``BaseSolver`` to get the profiler parameters and builders.

    ``class Solver(ProfiledSolverMixin, BaseSolver)`` with
    ``parameters = {**ProfiledSolverMixin.parameters, ...}``. Call
    :meth:`validate_profiler` in ``set_objective`` so bad values fail before any work.
    """

    parameters: dict[str, list[Any]] = {key: [value] for key, value in PROFILER_DEFAULTS.items()}

    def profiler_kwargs(self) -> dict[str, Any]:
        """The seven ``profiler_*`` values of this solver, as plain keyword arguments."""
        return {key: getattr(self, key, default) for key, default in PROFILER_DEFAULTS.items()}

    def validate_profiler(self) -> ProfilerConfig:
        """Validated :class:`ProfilerConfig` of this solver (``ValueError`` if invalid).

        Every solver calls this first in ``set_objective``, so it is also where the solver's
        process gets the allocator settings of :func:`scopebench.allocator.keep_freed_memory`.
        """
        from scopebench.allocator import keep_freed_memory

        keep_freed_memory()
        self.profiler_config = ProfilerConfig.from_params(**self.profiler_kwargs())
        return self.profiler_config

    def build_profiler(self, device: Any = "cpu", name: str = "run", output_dir: str | Path = "outputs"):
        """A fresh profiler for one run of this solver."""
        from scopebench.profiler import profiler_from_config

        config = getattr(self, "profiler_config", None) or self.validate_profiler()
        return profiler_from_config(config, device=device, name=name, output_dir=output_dir)

    def run_profiled(
        self,
        callback: Callable[[], bool] | None,
        step: Callable[[Any], Any],
        *,
        device: Any = "cpu",
        name: str = "run",
        output_dir: str | Path = "outputs",
    ) -> None:
        """The whole ``Solver.run``: ``step(profiler)`` once per iteration until told to stop.

        The profiler stays reachable as ``self.profiler`` so that ``get_result`` can
        return :meth:`current_metrics`; its files are written when the loop ends.
        """
        with self.build_profiler(device=device, name=name, output_dir=output_dir) as prof:
            self.profiler = prof
            for _ in prof.iterate(callback):
                step(prof)

    def current_metrics(self) -> dict[str, Any]:
        """Metrics of the last finished iteration (``{}`` before the first or outside the window)."""
        prof = getattr(self, "profiler", None)
        return prof.get_current_metrics() if prof is not None else {}
