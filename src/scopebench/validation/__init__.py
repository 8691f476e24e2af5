"""The validation benchmark's library: known faults injected, the suite's findings scored (docs/validation.md).

- :mod:`~scopebench.validation.faults`: :class:`FaultSpec` (the dataset ``injected``'s parameters)
  and :func:`fault_policy`, the :class:`~scopebench.policy.UserPolicy` that injects it on every
  backend; :class:`CpuHogs` (the ``contention`` fault's other processes).
- :mod:`~scopebench.validation.run`: :class:`DetectRun`, the policy training run with an
  unprofiled step beside each profiled one (the overhead column).
- :mod:`~scopebench.validation.score`: :func:`score`, the objective columns of one run.
- :mod:`~scopebench.validation.solver`: the solver ``Detect``'s mixin.
- :mod:`~scopebench.validation.page`: the results page (docs/validation.md) and its matrix.

It sits above :mod:`scopebench.report` (whose rules it scores) and :mod:`scopebench.policy`
(whose run it drives), and never imports benchopt.
"""

from scopebench.validation.faults import FAULTS, PHASES, RULES, CpuHogs, FaultSpec, fault_policy
from scopebench.validation.score import RunRecord, score

__all__ = ["FAULTS", "PHASES", "RULES", "CpuHogs", "FaultSpec", "RunRecord", "fault_policy", "score"]
