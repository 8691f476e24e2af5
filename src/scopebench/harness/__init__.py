"""The run harness: one rank's run lifecycle and the solver side that drives it (never imports benchopt).

* :mod:`~scopebench.harness.run`: :class:`RankRun`, the base of every benchmark's run object
  (ranks, device, profiler, set-up barrier, teardown; docs/design.md, "One run object per
  benchmark");
* :mod:`~scopebench.harness.solver`: :class:`ProfiledSolverMixin`, the one solver lifecycle
  (``skip``, ``set_objective``, ``get_next``, ``pre_run_hook``, ``run``) and its one skip
  rule, ``check_cell``, and the kinds of reason a cell is declined for
  (:class:`MachineReason`, :class:`LayoutReason`).

It sits above :mod:`scopebench.distributed` (ranks, process groups), :mod:`scopebench.profiler`
and :mod:`scopebench.host`, which never import it; the benchmarks' libraries
(:mod:`scopebench.imaging`, :mod:`scopebench.policy`) build on it.
"""

from scopebench.harness.run import RankRun
from scopebench.harness.solver import LayoutReason, MachineReason, ProfiledSolverMixin

__all__ = ["LayoutReason", "MachineReason", "ProfiledSolverMixin", "RankRun"]
