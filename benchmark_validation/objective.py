"""Validation benchmark: how often the suite's findings are right, how close, and what watching costs.

Each dataset ``injected`` is one fault with a known answer (``scopebench.validation.faults``);
the solver ``Detect`` runs it and returns what the suite found. Every row scores the run so far
(``scopebench.validation.score``): ``detected`` (the fault's rule fired), ``named_right`` (the
right rank and phase), ``error_pct`` (reported magnitude against the injected one),
``false_positive`` (a finding of another kind; on a ``none`` run, any), ``steps_to_detect``,
``overhead_pct`` (the profiled step against the unprofiled step beside it, with its 95 %
interval ``overhead_low_pct`` / ``overhead_high_pct``), and every profiler metric of the step.
``value`` is 0 when the run was scored right, else 1. Columns: docs/validation.md.
"""

from benchopt import BaseObjective
from benchopt.benchmark import Benchmark

from scopebench.runs import own_job_folder

# A Submitit folder of this run's own: a plain `benchopt run` never reads another run's result.
own_job_folder(Benchmark)


class Objective(BaseObjective):
    name = "validation"
    url = "https://github.com/benchopt/benchopt"
    min_benchopt_version = "1.10"
    requirements = []
    parameters = {}

    def set_data(self, spec, seed):
        self.spec, self.seed = spec, seed

    def get_objective(self):
        return dict(spec=self.spec, seed=self.seed)

    def evaluate_result(self, record, **metrics):
        from scopebench.validation import score

        return dict(**score(self.spec, record), **metrics)

    def get_one_result(self):
        from scopebench.validation import RunRecord

        return dict(record=RunRecord())
