"""The latency of the timed calls against the control loop's deadline, as one PNG.

``scopebench bench-inference --control-hz`` writes it next to its JSON: on the left the
histogram of the call latencies, on the right their empirical CDF, both with the deadline
``n_action_steps / control_hz`` drawn (:mod:`scopebench.policy.control.figures`), so the calls that
miss it are the bars right of the line and the CDF's height at the line is the share that
keeps up. Drawn with :func:`scopebench.report.drawing.pyplot` (matplotlib imported only here).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["draw_control_figure"]


def draw_control_figure(latencies_sec: Sequence[float], control: dict[str, Any], path: str | Path) -> Path:
    """Histogram and CDF of ``latencies_sec`` (milliseconds on the axes) with the deadline.

    Args:
        latencies_sec: Every timed call's latency, in seconds.
        control: The JSON ``control`` object of the same calls
            (:meth:`scopebench.policy.control.figures.ControlFigures.as_dict`).
        path: The PNG to write (atomically).

    Returns:
        ``path``.

    Raises:
        ValueError: no latency.
    """
    from scopebench.atomic import atomic_write
    from scopebench.report.drawing import pyplot

    values = sorted(t * 1e3 for t in latencies_sec)
    if not values:
        raise ValueError("latencies_sec must hold one call or more, got none")
    deadline = control["deadline_sec"] * 1e3
    plt = pyplot()
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(10, 3.8))
    hist.hist(values, bins=min(50, max(5, len(values) // 4)), color="tab:blue", alpha=0.8)
    hist.set_xlabel("latency of one call (ms)")
    hist.set_ylabel("calls")
    n = len(values)
    cdf.step(values, [(i + 1) / n for i in range(n)], where="post", color="tab:blue")
    cdf.set_xlabel("latency of one call (ms)")
    cdf.set_ylabel("share of calls at or below")
    cdf.set_ylim(0, 1.02)
    label = f"deadline {deadline:.1f} ms ({control['n_action_steps']} / {control['control_hz']:g} Hz)"
    for ax in (hist, cdf):
        ax.axvline(deadline, color="tab:red", linestyle="--", label=label)
        ax.grid(alpha=0.3)
    cdf.legend(loc="lower right", fontsize=8)
    fig.suptitle(control["verdict"], fontsize=9)
    fig.tight_layout()
    path = Path(path)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=90)
    plt.close(fig)
    return path
