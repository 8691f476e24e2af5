"""The run harness: one rank's run lifecycle and the solver side that drives it (never imports benchopt).

* :mod:`~scopebench.harness.run`: :class:`RankRun`, the base of every benchmark's run object
  (ranks, device, profiler, set-up barrier, teardown; docs/design.md, "One run object per
  benchmark");
* :mod:`~scopebench.harness.solver`: :class:`ProfiledSolverMixin`, the one solver lifecycle
  and its ``check_cell``, with the reason a cell is declined for on this machine only
  (:class:`MachineReason`).

It sits above :mod:`scopebench.distributed` (ranks, process groups), :mod:`scopebench.profiler`
and :mod:`scopebench.host`, which never import it; the benchmarks' libraries
(:mod:`scopebench.imaging`, :mod:`scopebench.policy`) build on it.
"""

from scopebench.harness.run import RankRun
from scopebench.harness.solver import MachineReason, ProfiledSolverMixin

__all__ = ["MachineReason", "ProfiledSolverMixin", "RankRun"]
