"""BenchOpt dashboard: the validation matrix, one row per fault x backend x profiler mode (code in scopebench.validation.page)."""

from benchopt import BasePlot

from scopebench.validation.page import MatrixTable


class Plot(MatrixTable, BasePlot):
    pass
