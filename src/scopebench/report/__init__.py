"""Turning benchopt results into tables (more views come with later issues)."""

from scopebench.report.summary import phase_table, read_results

__all__ = ["phase_table", "read_results"]
