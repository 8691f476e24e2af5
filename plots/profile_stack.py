"""BenchOpt dashboard: stacked region time per solver configuration (code in scopebench.report.dashboard)."""

from benchopt import BasePlot

from scopebench.report.dashboard import ProfileStack


class Plot(ProfileStack, BasePlot):
    pass
