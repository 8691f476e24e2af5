"""One fault with a known answer (``scopebench.validation.faults.FaultSpec``, docs/validation.md).

``fault``: ``none``, ``late_rank`` (rank ``rank`` busy-waits ``delay_ms`` in ``phase``),
``slow_input`` (every rank's input waits ``delay_ms``), ``contention`` (``magnitude`` CPU hog
processes beside the run), ``memory_growth`` (``magnitude`` MB kept alive per step),
``nonfinite`` (rank ``rank``'s loss is NaN at iteration ``step``), ``comm_heavy`` (``magnitude``
million parameters reduced every step); ``every``: the fault hits one step in ``every``;
``work_ms``: every rank's own work in forward and in backward per step.
"""

from benchopt import BaseDataset


class Dataset(BaseDataset):
    name = "injected"
    parameters = {
        "fault": ["none"],
        "rank": [1],
        "phase": ["bwd"],
        "delay_ms": [100.0],
        "every": [1],
        "magnitude": [None],
        "step": [3],
        "work_ms": [40.0],
        "seed": [0],
    }
    test_parameters = {"fault": ["none", "late_rank"], "delay_ms": [50.0], "work_ms": [20.0]}

    def get_data(self):
        from scopebench.validation import FaultSpec

        spec = FaultSpec(**{key: getattr(self, key) for key in self.parameters if key != "seed"})
        return dict(spec=spec, seed=self.seed)
