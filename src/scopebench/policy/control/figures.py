"""Does the policy keep up with the control loop? Control-rate figures from call latencies.

A robot executes ``n_action_steps`` actions of each chunk at ``control_hz`` while the next
chunk is computed, so one call has the time those actions last, the **deadline**
``n_action_steps / control_hz``. From the timed calls of ``bench-inference``,
``decompose-latency`` and the ``Pi05Inference`` solver, :class:`ControlFigures` gives:

* the share of calls that **miss** the deadline (latency > deadline);
* **p99.9**, only from :data:`P999_MIN_CALLS` calls or more (below, "not estimable"
  and ``None``: a 99.9th percentile of 200 calls is the maximum under another name);
* the **jitter**: the standard deviation and ``p99 - p50``;
* the **real-time-chunking delay** ``d = ceil(latency / dt)``, ``dt = 1 / control_hz``:
  the control steps that pass before a chunk is ready, which real-time chunking must
  cover; its histogram (d -> calls) and the worst d;
* a one-line verdict (:meth:`ControlFigures.line`).

Pure (the standard library and :mod:`scopebench.stats`): one home for these formulas,
so the text report, the JSON ``control`` object and the parquet ``objective_control_*``
columns cannot disagree.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import InitVar, dataclass
from typing import Any

from scopebench.stats import percentile, std
from scopebench.validate import integer, number, optional

__all__ = [
    "FLAGS",
    "P999_MIN_CALLS",
    "ControlFigures",
    "ControlRate",
    "check_config_control",
    "check_control",
    "control_figures",
    "control_lines",
    "delay_ticks",
]

#: Timed calls needed before p99.9 is reported: one call in a thousand must exist to be measured.
P999_MIN_CALLS = 1000
#: The command-line spelling of the control rate and of the actions executed per chunk.
FLAGS = ("--control-hz", "--n-action-steps")


def check_control(
    control_hz: Any,
    n_action_steps: Any,
    chunk_size: int | None = None,
    *,
    keys: tuple[str, str] = ("control_hz", "n_action_steps"),
) -> tuple[float | None, int | None]:
    """Validate a control rate and the actions executed per chunk (each may be None: not given).

    Args:
        control_hz: The control rate in Hz: a finite number > 0.
        n_action_steps: Actions executed per chunk: an integer >= 1, at most ``chunk_size``.
        chunk_size: The actions one call predicts (None: not checked).
        keys: How the errors name the two values (``--control-hz``, ``--n-action-steps``).

    :Examples:

    >>> check_control(30, 4, 8)
    (30.0, 4)
    >>> check_control(0, None, keys=("--control-hz", "--n-action-steps"))
    Traceback (most recent call last):
    ...
    ValueError: --control-hz must be a finite number > 0, got 0
    >>> check_control(30, 9, 8)
    Traceback (most recent call last):
    ...
    ValueError: n_action_steps must be at most the chunk size 8, got 9
    """
    hz = optional(number, keys[0], control_hz, low=0, low_open=True)
    if n_action_steps is None:
        return hz, None
    steps = integer(keys[1], n_action_steps, low=1)
    if chunk_size is not None and steps > chunk_size:
        raise ValueError(f"{keys[1]} must be at most the chunk size {chunk_size}, got {steps}")
    return hz, steps


@dataclass(frozen=True)
class ControlRate:
    """A control rate and the actions executed per chunk, validated once, when built.

    What :func:`control_figures`, :func:`~scopebench.policy.control.replay.predict` and
    :func:`~scopebench.policy.control.replay.replay` take: they validate nothing more, so a
    command checks its values at its edge and every figure of the run reads the same object.

    :Examples:

    >>> ControlRate(30, 4).deadline_sec
    0.13333333333333333
    >>> ControlRate(0, 4, keys=("--control-hz", "--n-action-steps"))
    Traceback (most recent call last):
    ...
    ValueError: --control-hz must be a finite number > 0, got 0
    """

    control_hz: float
    """The control rate (Hz); one control step lasts ``dt = 1 / control_hz``."""
    n_action_steps: int
    """Actions executed per chunk."""
    keys: InitVar[tuple[str, str]] = ("control_hz", "n_action_steps")
    """How the errors name the two values (not stored)."""

    def __post_init__(self, keys: tuple[str, str]) -> None:
        hz, steps = check_control(self.control_hz, self.n_action_steps, keys=keys)
        if hz is None or steps is None:
            missing = keys[0] if hz is None else keys[1]
            raise ValueError(f"{missing} must be given for the control-rate figures, got None")
        object.__setattr__(self, "control_hz", hz)
        object.__setattr__(self, "n_action_steps", steps)

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def cached(control_hz: float, n_action_steps: int, keys: tuple[str, str] = ("control_hz", "n_action_steps")):
        """The :class:`ControlRate` of these values, built (validated) once: a run that asks for
        its figures at every row (``Pi05Inference``) gets the same object back."""
        return ControlRate(control_hz, n_action_steps, keys=keys)

    @property
    def dt_sec(self) -> float:
        """One control step, ``1 / control_hz``."""
        return 1.0 / self.control_hz

    @property
    def deadline_sec(self) -> float:
        """How long the executed part of a chunk lasts, ``n_action_steps / control_hz``."""
        return self.n_action_steps / self.control_hz


def check_config_control(config: Any, control_hz: Any = None, n_action_steps: Any = None) -> dict[str, str]:
    """A command's ``--control-hz`` / ``--n-action-steps`` (:data:`FLAGS`, None: not given)
    and its run config's ``policy.control_hz`` / ``policy.n_action_steps``, checked before any
    work; an error names the flag when it was given, else the config key. (The command checks
    its flags as typed first, ``check_control(..., keys=FLAGS)``: loading the config with them
    would name the config key.)

    The chunk size is pi05's, the run's (``policy.chunk_size``, else ``dataset.chunk_size``); a
    policy of your own is checked against the chunk its first call returns
    (:class:`~scopebench.policy.run.chunks.ChunkCheck`).

    Returns:
        How later errors name the two settings (``{"n_action_steps": "--n-action-steps"}``), the
        ``keys`` of :class:`~scopebench.policy.run.inference.InferenceRun`.
    """
    s = config.inference  # its values validated when it was built: here only the chunk bound
    keys = tuple(flag if given is not None else f"policy.{key}" for flag, given, key in zip(
        FLAGS, (control_hz, n_action_steps), ("control_hz", "n_action_steps")
    ))  # fmt: skip
    chunk = s.chunk_size or config.dataset.chunk_size if s.policy == "pi05" else None
    if chunk is not None and s.n_action_steps is not None and s.n_action_steps > chunk:
        raise ValueError(f"{keys[1]} must be at most the chunk size {chunk}, got {s.n_action_steps}")
    return dict(zip(("control_hz", "n_action_steps"), keys))


@dataclass(frozen=True)
class ControlFigures:
    """The control-rate figures of a list of call latencies (:func:`control_figures` builds it)."""

    control_hz: float
    """Control rate (Hz); one control step lasts ``dt = 1 / control_hz``."""
    n_action_steps: int
    """Actions executed per chunk."""
    calls: int
    """Timed calls."""
    deadline_sec: float
    """``n_action_steps / control_hz``: how long the executed part of a chunk lasts."""
    missed: int
    """Calls whose latency is above the deadline."""
    p999_sec: float | None
    """99.9th percentile of the latency; None below :data:`P999_MIN_CALLS` calls."""
    std_sec: float
    """Sample standard deviation of the latency."""
    p99_minus_p50_sec: float
    """``p99 - p50`` of the latency (the tail's spread)."""
    delay_steps: dict[int, int]
    """``d = ceil(latency * control_hz)`` -> calls, ascending d."""

    @property
    def missed_share(self) -> float:
        """``missed / calls``."""
        return self.missed / self.calls

    @property
    def worst_delay_steps(self) -> int:
        """The largest d."""
        return max(self.delay_steps)

    @property
    def keeps_up(self) -> bool:
        """No call missed the deadline."""
        return self.missed == 0

    def p999_text(self) -> str:
        """p99.9 in ms, or why not (``not estimable (200 calls; needs 1000)``)."""
        if self.p999_sec is None:
            return f"not estimable ({self.calls} calls; needs {P999_MIN_CALLS})"
        return f"{self.p999_sec * 1e3:.2f} ms"

    def line(self) -> str:
        """The verdict in one line.

        :Examples:

        >>> control_figures([0.02] * 9 + [0.06], ControlRate(30, 1)).line()
        'misses the deadline at 30 Hz with 1 action a chunk: 10.0% of 10 calls over 33.3 ms, worst d = 2'
        >>> control_figures([0.02] * 10, ControlRate(30, 10)).line()
        'keeps up at 30 Hz with 10 actions a chunk: 0.0% missed, worst d = 1'
        """
        at = f"at {self.control_hz:g} Hz with {self.n_action_steps} action{'s' if self.n_action_steps != 1 else ''} a chunk"
        worst = f"worst d = {self.worst_delay_steps}"
        if self.keeps_up:
            return f"keeps up {at}: 0.0% missed, {worst}"
        return (
            f"misses the deadline {at}: {self.missed_share * 100:.1f}% of {self.calls} calls over "
            f"{self.deadline_sec * 1e3:.1f} ms, {worst}"
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON ``control`` object (seconds; ``delay_steps`` keys are strings, as JSON's are).

        :Examples:

        >>> control_figures([0.02, 0.06], ControlRate(30, 1)).as_dict()["delay_steps"]
        {'1': 1, '2': 1}
        """
        return {
            "control_hz": self.control_hz,
            "n_action_steps": self.n_action_steps,
            "calls": self.calls,
            "deadline_sec": self.deadline_sec,
            "missed": self.missed,
            "missed_share": self.missed_share,
            "p999_sec": self.p999_sec,
            "p999_note": None if self.p999_sec is not None else self.p999_text(),
            "std_sec": self.std_sec,
            "p99_minus_p50_sec": self.p99_minus_p50_sec,
            "delay_steps": {str(d): n for d, n in self.delay_steps.items()},
            "worst_delay_steps": self.worst_delay_steps,
            "keeps_up": self.keeps_up,
            "verdict": self.line(),
        }

    def metrics(self) -> dict[str, Any]:
        """Flat ``control_*`` metrics for a benchopt row (the parquet's ``objective_control_*``;
        the histogram as a JSON string, as a parquet cell holds one value).

        :Examples:

        >>> sorted(control_figures([0.02, 0.06], ControlRate(30, 1)).metrics())[:4]
        ['control_calls', 'control_deadline_sec', 'control_delay_steps_json', 'control_hz']
        """
        import json

        d = self.as_dict()
        out = {("" if k == "control_hz" else "control_") + k: v for k, v in d.items()}
        out["control_delay_steps_json"] = json.dumps(out.pop("control_delay_steps"))
        out["control_missed_pct"] = out.pop("control_missed_share") * 100
        del out["control_p999_note"]  # the p999 column is null, which says it
        return out


def control_lines(control: dict[str, Any] | None) -> list[str]:
    """The verdict and the figures of a JSON ``control`` object (:meth:`ControlFigures.as_dict`),
    for a text report; none without one.

    :Examples:

    >>> for line in control_lines(control_figures([0.02] * 9 + [0.06], ControlRate(30, 1)).as_dict()):
    ...     print(line)
    control: misses the deadline at 30 Hz with 1 action a chunk: 10.0% of 10 calls over 33.3 ms, worst d = 2
      deadline 33.33 ms (1 / 30 Hz), missed 1/10 (10.0%), p99.9 not estimable (10 calls; needs 1000), jitter std 12.65 ms, p99-p50 36.40 ms
      delay d = ceil(latency / dt), dt = 33.33 ms (d: calls): 1: 9, 2: 1
    """
    if control is None:
        return []
    c = control
    p999 = c["p999_note"] if c["p999_sec"] is None else f"{c['p999_sec'] * 1e3:.2f} ms"
    hist = ", ".join(f"{d}: {n}" for d, n in c["delay_steps"].items())
    return [
        f"control: {c['verdict']}",
        f"  deadline {c['deadline_sec'] * 1e3:.2f} ms ({c['n_action_steps']} / {c['control_hz']:g} Hz), "
        f"missed {c['missed']}/{c['calls']} ({c['missed_share'] * 100:.1f}%), p99.9 {p999}, "
        f"jitter std {c['std_sec'] * 1e3:.2f} ms, p99-p50 {c['p99_minus_p50_sec'] * 1e3:.2f} ms",
        f"  delay d = ceil(latency / dt), dt = {1e3 / c['control_hz']:.2f} ms (d: calls): {hist}",
    ]


def delay_ticks(latency_sec: float, control_hz: float) -> int:
    """The real-time-chunking delay ``d = ceil(latency * control_hz)``: the control ticks a
    call of ``latency_sec`` spans (a latency on a tick boundary is that many ticks, not one more).

    :Examples:

    >>> delay_ticks(0.02, 30), delay_ticks(0.06, 30), delay_ticks(0.5, 2)
    (1, 2, 1)
    """
    return math.ceil(latency_sec * control_hz)


def control_figures(latencies: Iterable[float], rate: ControlRate) -> ControlFigures:
    """The :class:`ControlFigures` of ``latencies`` (seconds, one per call) at ``rate``'s
    ``control_hz`` with its ``n_action_steps`` actions executed per chunk.

    Formulas: deadline ``= n_action_steps / control_hz``; missed ``= #{latency > deadline}``;
    ``d = ceil(latency * control_hz)``; p99.9, p99, p50 by :func:`scopebench.stats.percentile`.

    Raises:
        ValueError: no latency.

    :Examples:

    >>> f = control_figures([0.02] * 9 + [0.06], ControlRate(30, 1))
    >>> f.missed, f.delay_steps, f.p999_sec
    (1, {1: 9, 2: 1}, None)
    """
    hz, steps = rate.control_hz, rate.n_action_steps
    values = [float(t) for t in latencies]
    if not values:
        raise ValueError("latencies must hold one call or more, got none")
    deadline = rate.deadline_sec
    delays: dict[int, int] = {}
    for t in values:
        d = delay_ticks(t, hz)
        delays[d] = delays.get(d, 0) + 1
    return ControlFigures(
        control_hz=hz,
        n_action_steps=steps,
        calls=len(values),
        deadline_sec=deadline,
        missed=sum(t > deadline for t in values),
        p999_sec=percentile(values, 99.9) if len(values) >= P999_MIN_CALLS else None,
        std_sec=std(values),
        p99_minus_p50_sec=percentile(values, 99) - percentile(values, 50),
        delay_steps=dict(sorted(delays.items())),
    )
