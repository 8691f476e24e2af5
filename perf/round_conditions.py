"""How busy the machine was during each round of a ``perf/`` script: one helper for all of them.

Every script interleaves its measurements in rounds (A, B, A, B...) so that background
load hits each side alike; this module says how much load there was. Around each round
it reads the counters of :mod:`scopebench.host_load` — the share of this process's CPUs
taken by *other* processes (not this script nor the subprocesses it waited for: its
``benchopt run`` and spawned ranks, :func:`~scopebench.host_load.self_and_waited_ticks`;
a subprocess still running at a round's end is counted as other) and steal time — the same figures the profiler's sampler stores
(``host_other_cpu_pct``, ``host_steal_pct``), with the thresholds of the ``contended``
diagnosis (:mod:`scopebench.report.contention`).

Policy: rounds taken under contention are **flagged, not dropped**: their per-round line
ends in ``CONTENDED``, the summary line counts them, and the JSON carries
``conditions = {"per_round": [{"other_cpu_pct", "steal_pct", "contended"}],
"contended_rounds": [...], "other_cpu_pct_max", "thresholds": {...}, "summary": line}``, so a figure
copied into the docs keeps its conditions. Dropping them would bias the figures towards
whatever ran in the quiet moments; ``quiet(values)`` gives the uncontended rounds' values
for a reader who wants them.

Use::

    from round_conditions import RoundConditions      # perf/ is the script's folder

    conditions = RoundConditions()
    for r in range(rounds):
        with conditions.round():
            ...                                        # one A and one B
        print(f"round {r}: ratio {ratio:.3f} {conditions.tag(r)}")
    print(conditions.summary_line())
    result["conditions"] = conditions.as_dict()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from scopebench.host_load import read_cpu_times, self_and_waited_ticks, shares, usable_cpus
from scopebench.report.contention import OTHER_CPU_PCT, STEAL_PCT, iteration_ranges

__all__ = ["RoundConditions"]


class RoundConditions:
    """Other processes' CPU share and steal of each round, and whether it was contended."""

    def __init__(self) -> None:
        self.cpus = usable_cpus()
        self.rounds: list[dict[str, Any]] = []

    def _read(self):
        return read_cpu_times(self.cpus), self_and_waited_ticks()

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """Measure the conditions of the round run inside the ``with`` block."""
        start = self._read()
        yield
        end = self._read()
        found = shares(start, end) if start[0] is not None and end[0] is not None else {}
        other, steal = found.get("host_other_cpu_pct"), found.get("host_steal_pct")
        contended = (other is not None and other > OTHER_CPU_PCT) or (steal is not None and steal > STEAL_PCT)
        self.rounds.append({"other_cpu_pct": other, "steal_pct": steal, "contended": contended})

    def tag(self, index: int = -1) -> str:
        """``[other 2.1%, steal 0.0%]`` for one round, ending in ``CONTENDED`` when it was."""
        r = self.rounds[index]
        if r["other_cpu_pct"] is None:
            return "[conditions unknown: no /proc/stat]"
        text = f"[other {r['other_cpu_pct']:.1f}%, steal {r['steal_pct']:.1f}%"
        return text + ("] CONTENDED" if r["contended"] else "]")

    def contended_rounds(self) -> list[int]:
        return [i for i, r in enumerate(self.rounds) if r["contended"]]

    def quiet(self, values: Sequence[Any]) -> list[Any]:
        """The values of the rounds that were not contended (one value per round, in order)."""
        if len(values) != len(self.rounds):
            raise ValueError(f"quiet: {len(values)} values for {len(self.rounds)} rounds")
        return [v for v, r in zip(values, self.rounds) if not r["contended"]]

    def summary_line(self) -> str:
        """One line: how many rounds were contended and the other share's range."""
        others = [r["other_cpu_pct"] for r in self.rounds if r["other_cpu_pct"] is not None]
        if not others:
            return "conditions: unknown (no /proc/stat)"
        flagged = self.contended_rounds()
        head = f"conditions: other processes took {min(others):.1f}..{max(others):.1f}% of the CPUs per round; "
        if not flagged:
            return head + f"no round contended (> {OTHER_CPU_PCT:g}% other or > {STEAL_PCT:g}% steal)"
        return head + (
            f"{len(flagged)} of {len(self.rounds)} rounds CONTENDED (rounds {iteration_ranges(flagged)}): "
            "their figures include other processes' work; rerun on a quiet machine before quoting them"
        )

    def as_dict(self) -> dict[str, Any]:
        others = [r["other_cpu_pct"] for r in self.rounds if r["other_cpu_pct"] is not None]
        return {
            "per_round": self.rounds,
            "contended_rounds": self.contended_rounds(),
            "other_cpu_pct_max": max(others) if others else None,
            "thresholds": {"other_cpu_pct": OTHER_CPU_PCT, "steal_pct": STEAL_PCT},
            "summary": self.summary_line(),
        }
