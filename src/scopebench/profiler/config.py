"""Validated profiler settings and the eight ``profiler_*`` solver parameters."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scopebench.parameters import defaults
from scopebench.validate import flag, integer

__all__ = ["MODES", "ProfilerConfig", "PROFILER_DEFAULTS", "check_writable_dir", "normalize_mode"]

#: Accepted spellings of each backend. YAML ``null`` arrives as ``None``.
MODES = ("null", "custom", "torch", "nvidia")
_NULL_ALIASES = (None, "null", "none", "None", "off")


def normalize_mode(mode: Any) -> str:
    """Canonical backend name.

    :Examples:
        >>> normalize_mode(None), normalize_mode("Custom")
        ('null', 'custom')
    """
    if mode in _NULL_ALIASES:
        return "null"
    if isinstance(mode, str) and mode.lower() in MODES:
        return mode.lower()
    raise ValueError(f"profiler_mode must be one of null, custom, torch, nvidia, got {mode!r}")


def check_writable_dir(key: str, value: Any) -> Path:
    """``value`` as a path whose folder exists and is writable, or can be created.

    Nothing is created: the nearest existing ancestor must be a writable folder (so a
    configuration that is validated and then skipped leaves no empty folders behind).
    Raises ``ValueError`` naming ``key`` and the path.
    """
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"{key} must be a directory path, got {value!r}")
    path = Path(value).expanduser()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe != path and not probe.is_dir():
        raise ValueError(f"{key}={str(value)!r} cannot be created: {str(probe)!r} is not a directory")
    if not probe.is_dir():  # the path itself is a file: "read-only" would send the user looking at permissions
        raise ValueError(f"{key}={str(value)!r} is a file, not a directory")
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{key}={str(value)!r} is not a writable directory ({str(probe)!r} is read-only)")
    return path


@dataclass(frozen=True, kw_only=True)
class ProfilerConfig:
    """What to record, when, and where to write it. Validated when built."""

    mode: str = "custom"
    """Backend: ``null`` (no-op), ``custom`` (wall clock + peak memory), ``torch``
    (torch.profiler), ``nvidia`` (NVTX ranges + CUDA profiler capture range)."""
    warmup: int = 0
    """Iterations run before recording starts."""
    active: int = 0
    """Iterations recorded after warm-up; 0 records every remaining iteration."""
    save_file: bool = False
    """Write each rank's rows to ``<output_dir>/<run-name>_gpu_metrics.csv``."""
    per_step: bool = True
    """torch backend: one profiler cycle per iteration (True) or one scheduled cycle
    over the window (False)."""
    repeat: int = 1
    """torch scheduled mode: number of ``active``-long cycles, 0 = forever (with
    ``trace_dir``, only the traces of the last
    :data:`scopebench.profiler.torch_backend.KEPT_TRACES` (3) cycles are kept)."""
    trace_dir: Path | None = field(default=None)
    """torch scheduled mode: directory of the gzipped Chrome traces, one folder per run and
    cycle: ``<name>_<run-id>/cycle<k>/<run-name>.pt.trace.json.gz`` (``<run-name>`` as in the
    CSV names, ``<name>_<run-id>_rank<r>``: unique per run and rank; every rank of a run shares
    the run id, so a cycle folder holds every rank's trace of that cycle)."""
    memory: bool = False
    """Memory by category at each region's peak, per rank (:mod:`scopebench.profiler.memory`);
    on CUDA also the allocator's peaks and a memory snapshot per rank. Off by default: the
    tracking has a cost, reported as ``profiler_memory_overhead_sec``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", normalize_mode(self.mode))
        integer("profiler_warmup", self.warmup, low=0)
        integer("profiler_active", self.active, low=0)
        integer("profiler_repeat", self.repeat, low=0)
        flag("profiler_save_file", self.save_file)
        flag("profiler_per_step", self.per_step)
        if self.mode != "null":  # the SCOPEBENCH_* settings (sampler period, ledger), refused before any work
            from scopebench.environment import check_environment

            check_environment()
        flag("profiler_memory", self.memory)
        if self.memory and self.mode == "null":
            raise ValueError(
                "profiler_memory=true needs a recording profiler_mode (custom, torch or nvidia), got profiler_mode='null'"
            )
        if self.trace_dir is not None:
            if self.mode != "torch":
                raise ValueError(
                    f"profiler_trace_dir is only used by profiler_mode=torch, got profiler_mode={self.mode!r}"
                )
            if self.per_step:
                raise ValueError(
                    "profiler_trace_dir needs profiler_per_step=false: per-step mode resets "
                    "the torch profiler every iteration, so there is no single trace to export"
                )
            object.__setattr__(self, "trace_dir", check_writable_dir("profiler_trace_dir", self.trace_dir))

    def check_outputs(self, output_dir: str | Path | None) -> None:
        """Refuse, before any work, a run whose files could not be written at the end.

        Checks ``output_dir`` when ``save_file`` is on (the error names
        ``profiler_save_file``) and ``trace_dir`` (named ``profiler_trace_dir``).
        """
        if self.save_file and output_dir is not None:
            check_writable_dir("profiler_save_file", output_dir)
        if self.trace_dir is not None:
            check_writable_dir("profiler_trace_dir", self.trace_dir)

    @classmethod
    def from_params(cls, **params: Any) -> ProfilerConfig:
        """Build from solver parameters named ``profiler_*`` (unknown keys rejected)."""
        unknown = sorted(set(params) - set(PROFILER_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown profiler parameter(s) {unknown}; expected {sorted(PROFILER_DEFAULTS)}")
        merged = {**PROFILER_DEFAULTS, **params}
        return cls(**{key.removeprefix("profiler_"): value for key, value in merged.items()})

    def to_params(self) -> dict[str, Any]:
        """The solver parameters of this config (``profiler_*`` keys, paths as strings):
        the inverse of :meth:`from_params`, JSON-serialisable for a spawned rank.

        :Examples:
            >>> cfg = ProfilerConfig(mode="torch", warmup=2)
            >>> ProfilerConfig.from_params(**cfg.to_params()) == cfg
            True
            >>> sorted(cfg.to_params()) == sorted(PROFILER_DEFAULTS)
            True
        """
        return {
            f"profiler_{key}": (str(value) if isinstance(value, Path) else value) for key, value in vars(self).items()
        }

    def in_window(self, iteration: int) -> bool:
        """Whether 0-based ``iteration`` is recorded.

        Recorded when ``iteration >= warmup`` and (``active == 0`` or
        ``iteration < warmup + active``); the torch scheduled mode extends the window to
        ``repeat`` back-to-back cycles (``repeat == 0``: forever).

        :Examples:
            >>> cfg = ProfilerConfig(warmup=2, active=3)
            >>> [i for i in range(8) if cfg.in_window(i)]
            [2, 3, 4]
        """
        first, end = self.window()
        return first <= iteration < end

    def window(self) -> tuple[int, float]:
        """The recorded iterations as ``(first, end)``: ``first <= iteration < end`` (``end``
        infinite for an open window; ``(0, 0)`` under ``null``), what :meth:`in_window` tests.

        :Examples:
            >>> ProfilerConfig(warmup=2, active=3).window()
            (2, 5)
        """
        if self.mode == "null":
            return 0, 0
        cycles = self.repeat if (self.mode == "torch" and not self.per_step) else 1
        if self.active == 0 or cycles == 0:
            return self.warmup, math.inf
        return self.warmup, self.warmup + self.active * cycles


#: Solver parameter name -> default (docs/design.md, "Profiler contract"): the fields of
#: :class:`ProfilerConfig`, their one source, named ``profiler_<field>``.
PROFILER_DEFAULTS: dict[str, Any] = {f"profiler_{name}": value for name, value in defaults(ProfilerConfig).items()}
