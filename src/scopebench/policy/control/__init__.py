"""Control-rate inference: does the policy keep up with the robot's control loop?

* :mod:`~scopebench.policy.control.figures`: deadline misses, p99.9, jitter and the
  real-time-chunking delay, derived from a list of call latencies (:class:`ControlFigures`);
* :mod:`~scopebench.policy.control.replay`: the closed loop measured: actions executed at the
  control rate while the next chunk is inferred (:func:`replay`), and predicted (:func:`predict`).
"""

from scopebench.policy.control.figures import ControlFigures, check_control, control_figures
from scopebench.policy.control.replay import ReplayFigures, predict, replay

__all__ = ["ControlFigures", "ReplayFigures", "check_control", "control_figures", "predict", "replay"]
