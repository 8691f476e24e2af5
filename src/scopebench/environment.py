"""The process's environment: what a result was measured with (package versions, the device's
name), and the ``SCOPEBENCH_*`` settings a user may set.

Each setting of :data:`SETTINGS` is read through :func:`env_setting` alone, which parses it and
refuses a value it does not allow in one line naming the variable and what it allows::

    environment variable SCOPEBENCH_CLOCK_ALIGN must be 'auto' or 'estimate', got 'estmate'

:func:`check_environment` reads every one of them: ``scopebench`` does before any command runs,
and a recording profiler when its configuration is built, so a bad value stops a run before
any work (an unknown value was ignored before, and an infinite sampler period killed the
sampler's thread in the middle of a report). :data:`INTERNAL` names the variables scopebench
sets for the processes it starts (ranks, the launcher's record); they are not settings, and
their readers check them.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "INTERNAL",
    "SETTINGS",
    "EnvSetting",
    "check_environment",
    "device_name",
    "env_setting",
    "environment_metrics",
    "package_version",
]


def package_version(name: str) -> str | None:
    """Installed version of ``name``, ``None`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def device_name(device: Any = "cpu") -> str:
    """The GPU's name for a CUDA device, else ``cpu (<processor>)``."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


@functools.lru_cache(maxsize=8)
def _environment(device: str) -> tuple[tuple[str, str], ...]:
    import torch

    return (
        ("torch_version", torch.__version__),
        ("deepinv_version", package_version("deepinv") or "unknown"),
        ("scopebench_version", package_version("scopebench") or "unknown"),
        ("device_name", device_name(device)),
    )


def environment_metrics(device: Any = "cpu") -> dict[str, str]:
    """Versions of torch, deepinv and scopebench and the device name, as string metrics.

    Looked up once per device: objectives call this at every evaluation.
    """
    return dict(_environment(str(device)))


# -- SCOPEBENCH_* settings ------------------------------------------------------------------------
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
#: The longest sampler period (s): a longer one leaves every iteration of any real run without a
#: sample, and past about 292 years Python's ``Event.wait`` raises ``OverflowError`` in the thread.
MAX_SAMPLER_PERIOD_SEC = 3600.0


@dataclass(frozen=True)
class EnvSetting:
    """One ``SCOPEBENCH_*`` variable a user may set."""

    name: str
    default: str
    """The value when the variable is unset or empty."""
    allowed: str
    """What the refusal says is allowed (``"1 or 0 (also true/false, yes/no, on/off)"``)."""
    parse: Callable[[str], Any]
    """The value's meaning; raises ``ValueError`` when it is not allowed."""
    doc: str
    """What it does, for the docs and ``--help``."""


def _flag(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(text)


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip().lower() not in allowed:
            raise ValueError(text)
        return text.strip().lower()

    return parse


def _sampler_period(text: str) -> float:
    value = float(text)  # "fast": ValueError
    if not (value == 0 or 0.01 <= value <= MAX_SAMPLER_PERIOD_SEC):  # nan and inf fail both
        raise ValueError(text)
    return value


_FLAG = "1 or 0 (also true/false, yes/no, on/off)"

#: Every ``SCOPEBENCH_*`` variable a user may set, by name.
SETTINGS: dict[str, EnvSetting] = {
    s.name: s
    for s in (
        EnvSetting(
            "SCOPEBENCH_SAMPLER_PERIOD_SEC",
            "0.1",
            f"0 (off) or seconds from 0.01 to {MAX_SAMPLER_PERIOD_SEC:g}",
            _sampler_period,
            "Seconds between the host sampler's readings (CPU taken by others, steal, GPU clocks); 0 turns "
            "the sampler off.",
        ),
        EnvSetting(
            "SCOPEBENCH_LEDGER",
            "1",
            _FLAG,
            _flag,
            "0 turns off the per-rank ledger of collectives (waits, transfers, the late rank).",
        ),
        EnvSetting(
            "SCOPEBENCH_CLOCK_ALIGN",
            "auto",
            "'auto' or 'estimate'",
            _choice("auto", "estimate"),
            "How the ledger aligns the ranks' clocks: auto (one shared clock on one machine, else an "
            "offset estimated at start-up) or estimate (always estimated).",
        ),
        EnvSetting(
            "SCOPEBENCH_KEEP_FREED_MEMORY",
            "1",
            _FLAG,
            _flag,
            "0 lets glibc return freed memory to the kernel at once (for A/B measurements of the allocator "
            "settings of scopebench.allocator).",
        ),
    )
}

#: Variables scopebench sets for the processes it starts, never settings: their readers (the
#: module named) check them.
INTERNAL: dict[str, str] = {
    "SCOPEBENCH_RANK": "scopebench.distributed.info (a spawned rank's rank)",
    "SCOPEBENCH_WORLD_SIZE": "scopebench.distributed.info",
    "SCOPEBENCH_STORE_ADDR": "scopebench.distributed.info (the rendezvous)",
    "SCOPEBENCH_STORE_PORT": "scopebench.distributed.info",
    "SCOPEBENCH_STORE_FILE": "scopebench.distributed.launch (the FileStore of a local spawn)",
    "SCOPEBENCH_RUN_DIR": "scopebench.distributed.worker (the spawn's private folder)",
    "SCOPEBENCH_LIFELINE_FD": "scopebench.distributed.worker (the pipe rank 0 holds)",
    "SCOPEBENCH_GROUP_TIMEOUT_SEC": "scopebench.distributed.launch (the process-group timeout)",
    "SCOPEBENCH_WORKER_TARGET": "scopebench.distributed.worker (the function a worker runs)",
    "SCOPEBENCH_WORKER_KWARGS": "scopebench.distributed.worker (its JSON arguments)",
    "SCOPEBENCH_TRAIN_LAUNCHER_PID": "scopebench.distributed.orphans (the scopebench train that started a rank)",
    "SCOPEBENCH_TRAIN_LAUNCH_DIR": "scopebench.distributed.orphans",
    "SCOPEBENCH_TRAIN_RUN_OWNER": "scopebench.train.run_folder (the run folder's owner)",
    "SCOPEBENCH_CLAIMED_OUTPUTS": "scopebench.atomic (output files the parent claimed)",
}


def env_setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the setting ``name`` of :data:`SETTINGS` (its default when unset or empty).

    :Examples:
        >>> env_setting("SCOPEBENCH_LEDGER", {}), env_setting("SCOPEBENCH_LEDGER", {"SCOPEBENCH_LEDGER": "off"})
        (True, False)
        >>> env_setting("SCOPEBENCH_CLOCK_ALIGN", {"SCOPEBENCH_CLOCK_ALIGN": "estmate"})
        Traceback (most recent call last):
        ...
        ValueError: environment variable SCOPEBENCH_CLOCK_ALIGN must be 'auto' or 'estimate', got 'estmate'

    Raises:
        ValueError: a value the setting does not allow, naming the variable, what it allows and
            the value (its first 100 characters).
    """
    setting = SETTINGS[name]
    raw = (os.environ if environ is None else environ).get(name)
    text = setting.default if raw is None or not raw.strip() else raw
    try:
        return setting.parse(text)
    except ValueError:
        shown = repr(raw) if len(raw) <= 100 else f"{raw[:100]!r}... ({len(raw)} characters)"
        raise ValueError(f"environment variable {name} must be {setting.allowed}, got {shown}") from None


def check_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting of :data:`SETTINGS` by name, read by :func:`env_setting` (the check made
    before any work); the first value not allowed raises its ``ValueError``."""
    return {name: env_setting(name, environ) for name in SETTINGS}
