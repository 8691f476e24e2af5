"""What every matplotlib picture of the reports shares: the headless pyplot and short labels.

:mod:`scopebench.report.plots` and :mod:`scopebench.report.memory_figures` both draw with
these, so neither imports the other's private helpers. matplotlib is imported only when a
picture is drawn (docs/style.md rule 10).
"""

from __future__ import annotations

__all__ = ["LABEL_CHARS", "pyplot", "short_label"]

#: Longest label drawn on an axis or in a legend; longer ones are cut with an ellipsis.
LABEL_CHARS = 70


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed), unless one was chosen."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def short_label(label: str) -> str:
    """``label`` cut to :data:`LABEL_CHARS` characters, the last one an ellipsis.

    :Examples:
        >>> short_label("PnP[denoiser=tv]")
        'PnP[denoiser=tv]'
        >>> len(short_label("x" * 100))
        70
    """
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"
