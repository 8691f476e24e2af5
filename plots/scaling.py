"""BenchOpt dashboard: speed-up and parallel efficiency against processes (code in scopebench.report.dashboard)."""

from benchopt import BasePlot

from scopebench.report.dashboard import Scaling


class Plot(Scaling, BasePlot):
    pass
