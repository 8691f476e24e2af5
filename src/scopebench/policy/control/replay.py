"""Closed-loop replay: actions executed at the control rate while the next chunk is inferred.

:mod:`scopebench.policy.control.figures` derives figures from a list of latencies; this module
**measures** them: :func:`replay` runs an executor (the calling thread) that ticks at
``control_hz`` on absolute deadlines ``t0 + k * dt`` (``dt = 1 / control_hz``, so lateness
never accumulates into drift) while a worker thread calls ``infer()``, one chunk a call.
A chunk holds ``n_action_steps`` executable actions, indices ``0 .. n - 1``; action ``j`` of
a chunk whose observation was taken at tick ``s`` is due at tick ``s + j``. The first chunk
is inferred before ``t0`` (in the worker's thread, as every other) and handed over at tick 0.

Hand-over modes:

* ``sync``: inference of the next chunk starts when a chunk is handed over (its
  observation is that tick); the arrived chunk waits until the current one has run out,
  then is handed over at index 0. A tick with no action left is a **stall**. With
  ``d = ceil(latency * control_hz)`` (:class:`~scopebench.policy.control.figures.ControlFigures`'
  delay), a chunk costs ``max(0, d - n)`` stalls and the next hand-over comes
  ``max(n, d)`` ticks later.
* ``async``: inference likewise starts when a chunk is handed over, but the arrived
  chunk **replaces** the current one at the first tick ``s + d`` at or after its arrival,
  following real-time chunking's convention: its first ``d`` actions belong to ticks
  already elapsed (counted as ``skipped``) and execution resumes at index ``d``. The
  current chunk's actions still due at ticks ``>= s + d`` are **discarded**. A chunk that
  arrives with ``d >= n`` has no action left (``stale``); the next inference starts at once.

Per tick the executor records its actual time; ``lateness = actual - (t0 + k * dt)``
gives the clock's max lateness and its **drift** (mean lateness of the last tenth of
ticks minus that of the first tenth; bounded when deadlines are absolute).

The clock is injected (:class:`RealClock`: ``time.perf_counter``; :class:`VirtualClock`:
simulated time that advances only when every thread waits, so the tests are exact).
:func:`predict` is the distribution-based estimate: the same hand-over rules applied to a
list of latencies, without a clock. Standard library only.

A replay on the real clock lasts ``ticks / control_hz`` seconds, whatever the machine:
:func:`check_duration` refuses one over :data:`MAX_REPLAY_SEC` (an hour) unless the caller
raises the bound (``--closed-loop-max-sec``), and says how long it will take.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scopebench.policy.control.figures import ControlRate, delay_ticks
from scopebench.validate import integer

__all__ = [
    "MAX_REPLAY_SEC",
    "MODES",
    "RealClock",
    "ReplayFigures",
    "VirtualClock",
    "check_duration",
    "duration_text",
    "predict",
    "replay",
]

#: The hand-over modes (``--closed-loop``).
MODES = ("sync", "async")
#: The longest replay run unless asked for more (``--closed-loop-max-sec``): an hour. A replay
#: waits on the real clock, so 10^9 ticks, or 300 at 0.001 Hz, would hold the machine for a
#: year or three days, saying nothing; an hour of ticks is already 10^5 chunks at 30 Hz.
MAX_REPLAY_SEC = 3600.0


def duration_text(seconds: float) -> str:
    """A duration as a person reads it.

    :Examples:

    >>> duration_text(10), duration_text(4000), duration_text(300000), duration_text(1e9 / 30)
    ('10 s', '1.1 h', '3.5 days', '1.1 years')
    """
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.2g} {unit}" if seconds < 10 * size else f"{seconds / size:.0f} {unit}"
    return f"{seconds:.3g} s"


def check_duration(
    ticks: int,
    control_hz: float,
    max_sec: float = MAX_REPLAY_SEC,
    *,
    keys: Sequence[str] = ("ticks", "control_hz", "max_sec"),
) -> float:
    """The seconds a replay of ``ticks`` at ``control_hz`` (both validated already) lasts on the
    real clock, ``ticks / control_hz``; refused over ``max_sec``, naming the three ``keys``.

    :Examples:

    >>> check_duration(300, 30.0)
    10.0
    >>> check_duration(300, 0.001)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ticks=300 at control_hz=0.001 would run the closed loop for 3.5 days (300000 s), over max_sec=3600 ...
    """
    seconds = ticks / control_hz
    if seconds > max_sec:
        tick, hz, bound = keys
        raise ValueError(
            f"{tick}={ticks} at {hz}={control_hz:g} would run the closed loop for {duration_text(seconds)} "
            f"({seconds:.0f} s), over {bound}={max_sec:g} ({duration_text(max_sec)}): fewer ticks, a higher "
            f"{hz}, or a larger {bound}"
        )
    return seconds


class RealClock:
    """Wall time (``time.perf_counter``); threads wait on plain events."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep_until(self, t: float) -> None:
        while (left := t - time.perf_counter()) > 0:
            time.sleep(left)

    def event(self) -> threading.Event:
        return threading.Event()

    def wait(self, event: threading.Event) -> None:
        event.wait()

    def attach(self) -> None:
        """A thread joins (nothing to do on wall time)."""

    def detach(self) -> None:
        """A thread leaves (nothing to do on wall time)."""


class _VirtualEvent:
    def __init__(self, clock: VirtualClock) -> None:
        self._clock, self._flag, self._waiters = clock, False, 0

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._clock._cv:
            self._flag = True
            self._clock._blocked -= self._waiters  # the waiters are runnable from now on
            self._waiters = 0
            self._clock._cv.notify_all()

    def clear(self) -> None:
        with self._clock._cv:
            self._flag = False


class VirtualClock:
    """Simulated time for exact tests: time jumps to the earliest wake-up only when every
    attached thread sleeps or waits on an unset event, so no figure depends on the machine.

    :Examples:

    >>> c = VirtualClock(); c.attach(); c.sleep_until(2.5); c.now()
    2.5
    """

    def __init__(self, start: float = 0.0) -> None:
        self._t = start
        self._cv = threading.Condition()
        self._threads = self._blocked = 0
        self._wakeups: list[float] = []
        self._error: str | None = None

    def now(self) -> float:
        with self._cv:
            return self._t

    def attach(self) -> None:
        with self._cv:
            self._threads += 1

    def detach(self) -> None:
        with self._cv:
            self._threads -= 1
            self._advance()

    def event(self) -> _VirtualEvent:
        return _VirtualEvent(self)

    def sleep_until(self, t: float) -> None:
        with self._cv:
            if t <= self._t:
                return
            self._blocked += 1
            heapq.heappush(self._wakeups, t)
            self._advance()
            while self._t < t and self._error is None:
                self._cv.wait()
            self._raise()

    def wait(self, event: _VirtualEvent) -> None:
        with self._cv:
            if event._flag:
                return
            self._blocked += 1
            event._waiters += 1
            self._advance()
            while not event._flag and self._error is None:
                self._cv.wait()
            self._raise()

    def _advance(self) -> None:  # under the lock
        if self._threads == 0 or self._blocked < self._threads:
            return
        if not self._wakeups:
            self._error = "virtual clock: every thread waits on an event (deadlock)"
        else:
            self._t = self._wakeups[0]
            while self._wakeups and self._wakeups[0] <= self._t:
                heapq.heappop(self._wakeups)
                self._blocked -= 1
        self._cv.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(self._error)


@dataclass(frozen=True)
class ReplayFigures:
    """What one closed-loop replay measured (:func:`replay`) or predicted (:func:`predict`)."""

    mode: str
    """``sync`` or ``async`` (module docstring)."""
    control_hz: float
    """Control rate (Hz); ``dt = 1 / control_hz``."""
    n_action_steps: int
    """Executable actions per chunk."""
    ticks: int
    """Control ticks run."""
    chunks: int
    """Chunks handed over (the first, inferred before ``t0``, included)."""
    stalls: int
    """Ticks without an action."""
    stall_sec: float
    """Measured: for each run of stalled ticks, the time from its first tick's deadline to the
    arrival of the chunk that ended it (a run still open at the end: to the last tick's
    deadline); predicted alike, from the latencies."""
    discarded: int
    """Actions of a current chunk superseded by an arrived one (async; 0 in sync)."""
    skipped: int
    """Actions of arrived chunks that belong to elapsed ticks, ``d`` a chunk (async)."""
    stale: int
    """Chunks that arrived with ``d >= n_action_steps`` (async)."""
    latencies_sec: tuple[float, ...]
    """The calls' latencies in order (the worker's clock around ``infer()``)."""
    max_lateness_sec: float | None = None
    """Largest ``actual - (t0 + k * dt)`` over the ticks (None: predicted)."""
    mean_lateness_sec: float | None = None
    """Mean lateness (None: predicted)."""
    drift_sec: float | None = None
    """Mean lateness of the last tenth of the ticks minus the first tenth's (None: predicted)."""

    @property
    def stall_share(self) -> float:
        """``stalls / ticks``."""
        return self.stalls / self.ticks

    def as_dict(self) -> dict[str, Any]:
        """The JSON object (seconds; latencies left out, the command's ``closed_loop`` has them)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "latencies_sec"}
        d["stall_share"] = self.stall_share
        d["calls"] = len(self.latencies_sec)
        return d

    def line(self) -> str:
        """One line: ``sync at 30 Hz, 1 action a chunk: 10/110 ticks stalled (9.1%), ...``."""
        n = self.n_action_steps
        text = (
            f"{self.mode} at {self.control_hz:g} Hz, {n} action{'s' if n != 1 else ''} a chunk: "
            f"{self.stalls}/{self.ticks} ticks stalled ({self.stall_share * 100:.1f}%, {self.stall_sec * 1e3:.1f} ms), "
            f"{self.discarded} actions discarded, {self.skipped} skipped, {self.stale} stale chunks, {self.chunks} chunks"
        )
        if self.max_lateness_sec is not None:
            text += f"; clock: max lateness {self.max_lateness_sec * 1e3:.2f} ms, drift {self.drift_sec * 1e3:.2f} ms"
        return text


def _check(mode: str, rate: ControlRate, ticks: int) -> tuple[float, int]:
    """The mode and the tick count (the rate was validated when built)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(rate, ControlRate):
        raise TypeError(f"rate must be a ControlRate, got {type(rate).__name__}")
    integer("ticks", ticks, low=1)
    return rate.control_hz, rate.n_action_steps


class _Tally:
    """The hand-over rules, shared by :func:`replay` and :func:`predict` (one home)."""

    def __init__(self, mode: str, n: int) -> None:
        self.mode, self.n = mode, n
        self.index = 0  # next action of the current chunk (n: run out)
        self.queued: int | None = None  # sync: arrived chunk's observation tick
        self.chunks, self.stalls, self.discarded, self.skipped, self.stale = 1, 0, 0, 0, 0

    def tick(self, k: int, arrived: int | None) -> tuple[bool, bool]:
        """Tick ``k``, with the observation tick of a chunk arrived since the last tick (None:
        none). Returns (an action was executed, an inference starts now with observation ``k``)."""
        request = False
        if arrived is not None:
            if self.mode == "sync":
                self.queued = arrived
            else:
                d = k - arrived
                self.discarded += self.n - self.index
                self.skipped += min(d, self.n)
                self.chunks += 1
                self.index = min(d, self.n)
                if d >= self.n:
                    self.stale += 1
                request = True
        if self.mode == "sync" and self.index >= self.n and self.queued is not None:
            self.queued, self.index = None, 0
            self.chunks += 1
            request = True
        if self.index < self.n:
            self.index += 1
            return True, request
        self.stalls += 1
        return False, request


def predict(latencies: Sequence[float], mode: str, rate: ControlRate, ticks: int) -> ReplayFigures:
    """The distribution-based estimate: :func:`replay`'s hand-over rules over ``latencies``
    (cycled, in order) at ``rate``, chunk ready ``d = ceil(latency * control_hz)`` ticks after
    its observation, no clock. For ``sync`` this is the analytic count ``sum max(0, d - n)``
    over the chunks that fit in ``ticks``.

    :Examples:

    >>> f = predict([0.02] * 9 + [0.06], "sync", ControlRate(30, 1), 110)
    >>> f.stalls, f.chunks
    (10, 100)
    >>> predict([0.02] * 9 + [0.06], "sync", ControlRate(30, 4), 110).stalls
    0
    """
    hz, n = _check(mode, rate, ticks)
    values = [float(t) for t in latencies]
    if not values:
        raise ValueError("latencies must hold one call or more, got none")
    calls = [values[0], values[1 % len(values)]]  # the first chunk before t0; the next from tick 0
    tally, obs, stall_ticks, stall_from = _Tally(mode, n), 0, 0.0, None
    ready: int | None = delay_ticks(calls[1], hz)
    for k in range(ticks):
        arrived = None
        if ready is not None and ready <= k:
            arrived, ready = obs, None
            if stall_from is not None:  # from the first stalled tick to the arrival, as measured
                stall_ticks += obs + calls[-1] * hz - stall_from
                stall_from = None
        acted, request = tally.tick(k, arrived)
        if not acted and stall_from is None:
            stall_from = k
        if request:
            calls.append(values[len(calls) % len(values)])
            obs, ready = k, k + delay_ticks(calls[-1], hz)
    if stall_from is not None:
        stall_ticks += ticks - 1 - stall_from
    return ReplayFigures(
        mode, hz, n, ticks, tally.chunks, tally.stalls, stall_ticks / hz,
        tally.discarded, tally.skipped, tally.stale, tuple(calls),
    )  # fmt: skip


def replay(
    infer: Callable[[], Any],
    mode: str,
    rate: ControlRate,
    ticks: int,
    *,
    clock: Any = None,
    execute: Callable[[Any, int], None] | None = None,
    check: Callable[[Any], None] | None = None,
) -> ReplayFigures:
    """Run the closed loop for ``ticks`` control ticks (module docstring) and measure it.

    Args:
        infer: One inference call; returns the chunk (passed to ``execute``).
        mode: ``sync`` or ``async``.
        rate: The control rate and the executable actions per chunk (validated).
        ticks: Control ticks to run.
        clock: :class:`RealClock` (default) or :class:`VirtualClock`.
        execute: Called with (chunk, action index) for each executed action (default: nothing).
        check: Called with each chunk in the worker, after its latency is taken (default:
            nothing); what it raises ends the replay as an exception of ``infer`` does.

    Raises:
        ValueError: a bad mode or tick count (naming it).
        Exception: what ``infer`` or ``check`` raised, as it was raised (in the worker thread),
            at the executor's next tick (the replay stops there), or once the call in flight at
            the last tick has ended.
    """
    hz, n = _check(mode, rate, ticks)
    clock = clock or RealClock()
    dt = 1.0 / hz
    clock.attach()  # the executor (this thread)
    lock, request, errors = threading.Lock(), clock.event(), []
    latencies: list[float] = []
    state: dict[str, Any] = {"obs": 0, "stop": False, "arrived": None}

    def call() -> Any:
        start = clock.now()
        chunk = infer()
        end = clock.now()
        latencies.append(end - start)
        if check is not None:
            check(chunk)
        return chunk, end

    def worker() -> None:
        try:
            while True:
                clock.wait(request)
                request.clear()
                if state["stop"]:
                    return
                obs = state["obs"]
                chunk, end = call()
                with lock:
                    state["arrived"] = (obs, chunk, end)
                first.set()
        except BaseException as exc:  # noqa: BLE001 - handed to the executor, which re-raises
            errors.append(exc)
        finally:
            first.set()
            clock.detach()

    first = clock.event()
    clock.attach()  # the worker, attached before it starts so simulated time waits for it
    thread = threading.Thread(target=worker, name="scopebench-replay-infer", daemon=True)
    tally, queued = _Tally(mode, n), None
    lateness: list[float] = []
    stall_sec, stall_from = 0.0, None
    try:
        thread.start()
        # the first chunk, before t0, in the worker's thread: what a call keeps per thread
        # (torch.compile's CUDA graphs, thread pools) is set up outside the timed loop
        request.set()
        clock.wait(first)
        if errors:
            raise errors[0]
        with lock:
            (_, current, _), state["arrived"] = state["arrived"], None
        t0 = clock.now()
        state["obs"] = 0
        request.set()
        for k in range(ticks):
            due = t0 + k * dt
            clock.sleep_until(due)
            lateness.append(clock.now() - due)
            if errors:
                raise errors[0]
            with lock:
                arrival, state["arrived"] = state["arrived"], None
            obs = None
            if arrival is not None:
                obs, chunk, end = arrival
                if stall_from is not None:
                    stall_sec += max(0.0, end - stall_from)
                    stall_from = None
                if mode == "async":
                    current = chunk
                else:
                    queued = chunk
            if mode == "sync" and tally.index >= n and queued is not None:
                current, queued = queued, None
            acted, start = tally.tick(k, obs)
            if acted:
                if execute is not None:
                    execute(current, tally.index - 1)
            elif stall_from is None:
                stall_from = due
            if start:
                state["obs"] = k
                request.set()
        if stall_from is not None:
            stall_sec += max(0.0, t0 + (ticks - 1) * dt - stall_from)
    finally:
        state["stop"] = True
        request.set()
        clock.detach()
        if thread.ident is not None:  # started
            thread.join()
    if errors:  # a call still in flight at the last tick raised: the policy failed all the same
        raise errors[0]
    tenth = max(1, ticks // 10)
    return ReplayFigures(
        mode, hz, n, ticks, tally.chunks, tally.stalls, stall_sec, tally.discarded, tally.skipped, tally.stale,
        tuple(latencies), max(lateness), sum(lateness) / ticks,
        sum(lateness[-tenth:]) / tenth - sum(lateness[:tenth]) / tenth,
    )  # fmt: skip
