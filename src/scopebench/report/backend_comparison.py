"""Backend comparison: training-step configurations that differ only in ``backend``.

Configurations of one benchmark and dataset whose parameters differ only in ``backend``
(the backends of :mod:`scopebench.train.backends`) form a :class:`BackendComparison` (:func:`backend_comparisons`,
grouped by the same :func:`~scopebench.report.figures.sweep_groups` as the scaling
picture): per backend the median step (``step_time_sec``, without the scoring callback),
its ratio to the fastest backend and, per phase, the median and its difference to the
fastest. Its table is printed after the phase tables, and the ``backend-comparison`` rule
of :mod:`scopebench.report.diagnosis` gives each backend slower than the fastest one line
(:attr:`BackendComparison.explanations`) that names the phases behind the difference and
what they hold under that backend (``PHASE_CONTENTS`` of :mod:`scopebench.policy.phases`, what each
backend of :mod:`scopebench.train.backends` says).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from scopebench import stats
from scopebench.report.figures import sweep_groups
from scopebench.report.results import Configuration
from scopebench.report.tables import config_kind, phase_rows

__all__ = ["BACKEND_EXPLAINED_PCT", "BackendComparison", "backend_comparisons", "config_backend"]

#: The phases named are the largest slow-downs that together make up this share of the step difference (%).
BACKEND_EXPLAINED_PCT = 80.0


def _backend_pairs() -> tuple[tuple[str, str], ...]:
    """Ratios printed when both backends are present (first / second): each backend against
    those it names in ``compared_with``."""
    from scopebench.train.backends import all_backends

    return tuple((b.name, other) for b in reversed(all_backends()) for other in b.compared_with)


@dataclass(frozen=True)
class BackendComparison:
    """Training-step configurations that differ only in ``backend``: median step and phases per backend.

    Every figure is a median over the recorded iterations (:func:`scopebench.stats.median`,
    through the phase tables); a difference is ``median(backend) - median(fastest)``.
    """

    benchmark: str
    dataset: str
    label: str
    """The group: the solver's base name and the parameters that tell it from other groups."""
    backends: tuple[str, ...]
    """In the sweep's order (sorted by name)."""
    configs: dict[str, str]
    """Backend -> the configuration's label."""
    solvers: dict[str, str]
    """Backend -> benchopt's ``solver_name``."""
    fastest: str
    step_ms: dict[str, float]
    """Backend -> median step (``step_time_sec``: total - callback), ms."""
    ratio: dict[str, float]
    """Backend -> its median step over the fastest backend's."""
    pairs: dict[str, float]
    """``"zero3/zero2"`` -> ratio of the median steps, for each backend against those it is
    ``compared_with`` (:mod:`scopebench.train.backends`), where both are present."""
    phases: tuple[str, ...]
    median_ms: dict[str, dict[str, float]]
    """Backend -> phase -> median ms, for the phases it reports (regions, composites, ``untracked``)."""
    delta_ms: dict[str, dict[str, float | None]]
    """Backend -> phase -> median minus the fastest's (``None`` where either lacks the phase)."""
    named: dict[str, list[str]]
    """Backend slower than the fastest -> the phases its explanation names (step order)."""
    explanations: dict[str, str]
    """Backend slower than the fastest -> one line: ratio, named phases, what they hold under it."""

    def backend_of(self, config: Configuration) -> str | None:
        """The backend of ``config`` in this comparison, else ``None``."""
        if (config.benchmark, config.dataset) != (self.benchmark, self.dataset):
            return None
        return next((b for b, solver in self.solvers.items() if solver == config.solver), None)

    def row(self, backend: str) -> list[str]:
        """Cells of one backend's row: median step, ratio to the fastest, then per phase (``n/a`` when missing)."""
        fastest = backend == self.fastest
        values = self.median_ms[backend] if fastest else self.delta_ms[backend]
        cells = [
            f"{values[p]:{'.3f' if fastest else '+.3f'}}" if values.get(p) is not None else "n/a" for p in self.phases
        ]
        return [f"{self.step_ms[backend]:.3f}", "fastest" if fastest else f"{self.ratio[backend]:.2f}x", *cells]

    def text(self) -> str:
        """The table: per backend the median step, its ratio to the fastest and per phase the difference."""
        widths = [10, 12, *(max(len(p), 8) + 2 for p in self.phases)]
        lines = [
            f"backend comparison: {self.label} ({self.dataset}), median ms, step = total - callback; "
            "phase columns: the fastest backend's median, the others' difference to it",
            f"{'backend':<12}" + "".join(f"{h:>{w}}" for h, w in zip(("step", "vs fastest", *self.phases), widths)),
        ]
        for b in self.backends:
            lines.append(f"{b:<12}" + "".join(f"{c:>{w}}" for c, w in zip(self.row(b), widths)))
        if self.pairs:
            lines.append("; ".join(f"{pair.replace('/', ' / ')} = {r:.2f}x" for pair, r in self.pairs.items()))
        if self.explanations:
            lines.append("why: the [backend-comparison] lines of the diagnosis")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_backend(config: Configuration) -> str | None:
    """The ``backend`` parameter of a training-step configuration; ``None`` for any other."""
    value = config.param("backend")
    return None if value is None or config_kind(config) != "training_step" else str(value)


def _phase_contents(backend: str) -> tuple[str, dict[str, str]]:
    """``(name, {phase: "phase = what it holds"})`` of one backend, from its
    ``phase_contents`` (:mod:`scopebench.train.backends`; a backend it does not know holds nothing extra)."""
    from scopebench.train.backends import find_backend

    known = find_backend(backend)
    if known is None:
        return backend, {}
    return known.title, {phase: f"{phase} = {what}" for phase, what in known.phase_contents.items()}


def _named_phases(delta: dict[str, float | None], step_delta: float) -> list[str]:
    """The largest positive differences, until they make up :data:`BACKEND_EXPLAINED_PCT` of the step's.

    :Examples:
        >>> _named_phases({"forward": 4.0, "bwd": 6.0, "optim_step": 0.5, "untracked": -0.2}, 10.0)
        ['bwd', 'forward']
    """
    named, total = [], 0.0
    for phase, value in sorted(((p, d) for p, d in delta.items() if d is not None and d > 0), key=lambda x: -x[1]):
        named.append(phase)
        total += value
        if total >= step_delta * BACKEND_EXPLAINED_PCT / 100.0:
            break
    return named


def _explain(backend: str, fastest: str, step: dict[str, float], delta: dict[str, float | None], named: list[str]):
    diff = step[backend] - step[fastest]
    line = (
        f"{backend} is {step[backend] / step[fastest]:.2f}x slower than {fastest} "
        f"(median step {step[backend]:.3f} ms vs {step[fastest]:.3f} ms, {diff:+.3f} ms)"
    )
    if not named:
        return line + ": no phase is slower in median (the phases' medians do not add up to the step's)"
    together = sum(delta[p] for p in named)
    # Named phases can add up to more than the step's difference when other phases got faster.
    share = (
        f"{together / diff * 100:.0f}% of the difference"
        if together <= diff
        else f"other phases {diff - together:+.3f} ms"
    )
    line += ": " + ", ".join(f"{p} {delta[p]:+.3f} ms" for p in named) + f" ({share})"
    name, contents = _phase_contents(backend)
    held = [contents[p] for p in named if p in contents]
    if held:
        return line + f" — under {name}: " + "; ".join(held)
    return line + f" — {name} holds no backend-specific work in these phases (PHASE_CONTENTS)"


def _comparison(group: dict[str, Any]) -> BackendComparison:
    members: list[Configuration] = group["configs"]
    backends = tuple(group["values"])
    rows = {b: {r["phase"]: r for r in phase_rows(c)} for b, c in zip(backends, members)}
    step = {b: rows[b]["step"]["median_ms"] for b in backends}
    fastest = min(backends, key=lambda b: step[b])
    kinds = ("region", "composite", "untracked")
    phases: list[str] = []
    for b in (fastest, *backends):
        phases += [p for p, r in rows[b].items() if r["kind"] in kinds and p not in phases]
    median = {b: {p: rows[b][p]["median_ms"] for p in phases if p in rows[b]} for b in backends}
    delta = {
        b: {p: median[b][p] - median[fastest][p] if p in median[b] and p in median[fastest] else None for p in phases}
        for b in backends
    }
    # Composites (backward_step) are sums of regions: naming one would count its regions twice.
    composites = {p for b in backends for p, r in rows[b].items() if r["kind"] == "composite"}
    named, explanations = {}, {}
    for b in backends:
        if b != fastest and step[b] > step[fastest]:
            candidates = {p: d for p, d in delta[b].items() if p not in composites}
            named[b] = [p for p in phases if p in _named_phases(candidates, step[b] - step[fastest])]
            explanations[b] = _explain(b, fastest, step, delta[b], named[b])
    first = members[0]
    return BackendComparison(
        benchmark=first.benchmark,
        dataset=first.dataset,
        label=group["label"],
        backends=backends,
        configs={b: c.label for b, c in zip(backends, members)},
        solvers={b: c.solver for b, c in zip(backends, members)},
        fastest=fastest,
        step_ms=step,
        ratio={b: step[b] / step[fastest] for b in backends},
        pairs={f"{x}/{y}": step[x] / step[y] for x, y in _backend_pairs() if x in step and y in step},
        phases=tuple(phases),
        median_ms=median,
        delta_ms=delta,
        named=named,
        explanations=explanations,
    )


def backend_comparisons(configs: list[Configuration]) -> list[BackendComparison]:
    """One :class:`BackendComparison` per group of profiled training steps that differ only in ``backend``."""
    profiled = [c for c in configs if not c.recorded.empty and config_backend(c) is not None]
    out = []
    for group in sweep_groups(profiled, config_backend, ignore={"backend"}):
        # A backend twice in one group, or an empty step, leaves no fastest backend to compare with.
        distinct = len(set(group["values"])) == len(group["values"])
        if distinct and all(stats.median(c.step_values()) > 0 for c in group["configs"]):
            out.append(_comparison(group))
    return out
