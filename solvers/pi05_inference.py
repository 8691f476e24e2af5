"""Pi05Inference: one ``sample_actions`` call per iteration, at batch 1.

Regions ``preprocess`` (host: tokenize, resize, normalize), ``prefill``, ``denoise``,
``postprocess``; with ``compile_mode`` (``none``, ``default``, ``reduce-overhead``,
``max-autotune``...) ``torch.compile`` wraps prefill and denoise, the ``n_warmup`` calls
of ``pre_run_hook`` pay for it, and ``compile_time_sec`` / ``first_call_ratio`` are
reported apart. With ``control_hz`` (None: off) each row also carries the control-rate
figures of the timed calls so far (``objective_control_*``, :mod:`scopebench.policy.control.figures`),
with ``n_action_steps`` (None: the whole chunk) actions executed per chunk. Every parameter is a field of
``scopebench.policy.settings.InferenceSettings`` (documented there).
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.policy.run.solver import InferenceSolverMixin
from scopebench.policy.settings import InferenceSettings, solver_parameters


class Solver(InferenceSolverMixin, BaseSolver):
    name = "Pi05Inference"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    parameters = {
        **InferenceSolverMixin.parameters,  # the eight profiler_*
        # every run setting, with its default, from scopebench.policy.settings (seed: the dataset's)
        **solver_parameters(InferenceSettings),
    }
    test_config = {"n_warmup": 1}
