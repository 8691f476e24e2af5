"""BenchOpt dashboard: the phase table of every configuration (code in scopebench.report.dashboard)."""

from benchopt import BasePlot

from scopebench.report.dashboard import PhaseTable


class Plot(PhaseTable, BasePlot):
    pass
