"""BenchOpt dashboard: a region's time per iteration, warm-up visible (code in scopebench.report.dashboard)."""

from benchopt import BasePlot

from scopebench.report.dashboard import RegionTimes


class Plot(RegionTimes, BasePlot):
    pass
