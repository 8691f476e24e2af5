"""The regions :meth:`scopebench.profiler.base.Profiler.track_step` returns.

A region reads the profiler's clock around its body and adds the interval to the iteration's
``<region>`` time; around that, the backend's region hooks and memory tracking, timed into
``profiler_inside_sec`` (:mod:`scopebench.profiler.base`). Plain classes: a generator-based
``contextmanager`` costs several microseconds per region. Where the backend's hooks have nothing
to do (the ``custom`` backend off CUDA), each name gets one :class:`IdleRegion` after its first
occurrence, reused by the later ones: the clock and the bookkeeping, nothing else (issue 47; its
cost is ``perf/profiler_overhead.py`` item 6).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["IdleRegion", "Region", "clock"]

#: The profiler's clock (``time.perf_counter``, STYLE.md rule 13), bound once: the hot path reads it
#: a dozen times per iteration.
clock = time.perf_counter


class Region:
    """A region of the current iteration: the backend's hooks (and memory tracking) around it,
    timed into ``profiler_inside_sec``, and its clock."""

    __slots__ = ("prof", "name", "token", "start")

    def __init__(self, prof: Any, name: str) -> None:
        self.prof = prof
        self.name = name
        self.start = None

    def __enter__(self) -> None:
        prof = self.prof
        if prof._recording:
            if prof._sync_regions:
                prof.ops.synchronize()  # the work queued before the region: not the region's, nor the profiler's
            begin = clock()
            self.token = prof._enter_region(self.name)
            if prof._memory is not None:
                prof._memory.enter_region(self.name)
            self.start = start = clock()
            prof._inside_sec += start - begin

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        start = self.start
        if start is not None:
            prof = self.prof
            if prof._sync_regions:
                prof.ops.synchronize()  # the region's own queued work: region time, not the profiler's
            begin = clock()
            name = self.name
            prof._exit_region(name, self.token)
            end = clock()
            wall = prof._region_wall
            if name in wall:  # a region run again in the iteration
                wall[name] += end - start
            else:
                wall[name] = end - start
            if prof._spans is not None:
                prof._spans.append((name, start, end))
            if prof._memory is not None:  # an OOM (exc): the snapshot, then a named error
                prof._memory.exit_region(name, exc)
            elif prof._idle_hooks and exc_type is None:  # the name passed the backend's checks
                prof._fast_regions.setdefault(name, IdleRegion(prof, name))
            prof._inside_sec += clock() - begin


class IdleRegion:
    """A region whose backend hooks have nothing to do (``Profiler._region_hooks_idle``) once its
    name passed them: its clock and the wall-time bookkeeping, nothing else. One per name, reused
    by every later ``track_step`` of that name that finds it closed (a region nested in itself
    gets a :class:`Region`)."""

    __slots__ = ("prof", "name", "start")

    def __init__(self, prof: Any, name: str) -> None:
        self.prof = prof
        self.name = name
        self.start = None

    def __enter__(self) -> None:
        if self.prof._recording:
            self.start = clock()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        start = self.start
        if start is not None:
            end = clock()
            self.start = None
            prof = self.prof
            name = self.name
            wall = prof._region_wall
            if name in wall:  # a region run again in the iteration
                wall[name] += end - start
            else:
                wall[name] = end - start
            if prof._spans is not None:
                prof._spans.append((name, start, end))
            prof._inside_sec += clock() - end
