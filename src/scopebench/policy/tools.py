"""Shared plumbing of the policy command-line tools (``scopebench profile-step`` ...).

The tools read a policy run config (:func:`scopebench.policy.settings.load_run_config`)
and apply, in this order of precedence (:data:`PRECEDENCE`): a command-line flag or
``--key=value`` > the upstream scripts' environment variable > the YAML file > the
default, drive the run objects of
:mod:`scopebench.policy.run.train` / :mod:`~scopebench.policy.run.inference`, show a
progress bar on a terminal (tqdm on stderr, only when it is a TTY, only on rank 0) and
write their JSON atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PRECEDENCE",
    "StepCounter",
    "check_json_path",
    "env_bool",
    "env_int",
    "environment_info",
    "data_root",
    "format_ms_stats",
    "load_config",
    "policy_label",
    "progress_bar",
    "summary_sec",
    "write_json",
]

#: Which value of a setting wins (every policy tool's ``--help`` says so).
PRECEDENCE = "command-line flag or --key=value > environment variable > YAML file > default"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def env_bool(name: str, default: bool | None = None, environ=None) -> bool | None:
    """An environment variable as a boolean (``1``/``true``/``yes``/``on`` or their opposites).

    :Examples:

    >>> env_bool("PROFILE_NO_OPTIM", False, {"PROFILE_NO_OPTIM": "1"})
    True
    >>> env_bool("PROFILE_NO_OPTIM", False, {"PROFILE_NO_OPTIM": "maybe"})
    Traceback (most recent call last):
    ...
    ValueError: environment variable PROFILE_NO_OPTIM must be true or false (1/0), got 'maybe'
    """
    value = (os.environ if environ is None else environ).get(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ValueError(f"environment variable {name} must be true or false (1/0), got {value!r}")


def env_int(name: str, default: int, low: int = 1, environ=None) -> int:
    """An environment variable as an integer >= ``low``.

    :Examples:

    >>> env_int("PROFILE_STEPS", 200, environ={})
    200
    >>> env_int("PROFILE_STEPS", 200, environ={"PROFILE_STEPS": "0"})
    Traceback (most recent call last):
    ...
    ValueError: environment variable PROFILE_STEPS must be an integer >= 1, got '0'
    """
    value = (os.environ if environ is None else environ).get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if number < low:
        raise ValueError(f"environment variable {name} must be an integer >= {low}, got {value!r}")
    return number


def load_config(args: argparse.Namespace, *, env: dict[str, Any] | None = None, flags: dict[str, Any] | None = None):
    """The run config of ``args.config`` under :data:`PRECEDENCE`.

    Applied over the YAML file in order, later values winning: ``env`` (settings read
    from environment variables), then ``args.overrides`` (``--key=value``), then
    ``flags`` (the tool's own options). ``None`` values are skipped (not given).
    """
    from scopebench.policy.settings import load_run_config, parse_overrides

    given = [(key, value) for key, value in (env or {}).items() if value is not None]
    given += parse_overrides(list(args.overrides or []))
    given += [(key, value) for key, value in (flags or {}).items() if value is not None]
    given += policy_flags(getattr(args, "policy", None), getattr(args, "policy_arg", None) or [])
    return load_run_config(args.config, given)


def policy_flags(policy: str | None, policy_args: list[str]) -> list[tuple[str, Any]]:
    """``--policy`` and ``--policy-arg key=value`` as overrides (``policy``, ``policy_args.<key>``).

    :Examples:

    >>> policy_flags("mypkg:make", ["hidden=64", "name=big"])
    [('policy', 'mypkg:make'), ('policy_args.hidden', 64), ('policy_args.name', 'big')]
    """
    from scopebench.policy.settings import parse_overrides

    pairs = [] if policy is None else [("policy", policy)]
    for text in policy_args:
        key, sep, value = text.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--policy-arg expects key=value with an identifier key, got {text!r}")
        pairs += [(f"policy_args.{k}", v) for k, v in parse_overrides([f"--{key}={value}"])]
    return pairs


def data_root(config) -> str:
    """The folder of the synthetic robot dataset, written if not cached, when the policy is pi05;
    ``""`` for a user policy, which reads its own dataset (nothing is written)."""
    return str(config.dataset.materialize()) if config.train.policy == "pi05" else ""


def policy_label(settings: Any) -> str:
    """``preset=tiny`` for pi05, ``policy=<factory>`` for a user policy (a settings object or its dict).

    :Examples:

    >>> policy_label({"policy": "mypkg:make", "preset": "tiny"})
    'policy=mypkg:make'
    """
    get = settings.get if isinstance(settings, dict) else lambda key: getattr(settings, key)
    return f"preset={get('preset')}" if get("policy") == "pi05" else f"policy={get('policy')}"


def progress_bar(total: int, desc: str, enabled: bool = True, stream=None):
    """A tqdm bar on ``stream`` (stderr) when it is a terminal; a silent one otherwise."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", lambda: False)
    return tqdm(total=total, desc=desc, file=stream, disable=not (enabled and isatty()), leave=False)


class StepCounter:
    """A benchopt-style callback: True for ``total`` iterations, then False.

    Each call also hands the metrics of the iteration that just ended to ``collect``
    (none before the first) and advances the progress bar.
    """

    def __init__(self, total: int, collect: Callable[[], None] | None = None, bar=None) -> None:
        self.total = total
        self.calls = 0
        self.collect = collect
        self.bar = bar

    def __call__(self) -> bool:
        if self.calls and self.collect is not None:
            self.collect()
        if self.calls and self.bar is not None:
            self.bar.update(1)
        self.calls += 1
        return self.calls <= self.total


def summary_sec(samples: Sequence[float]) -> dict[str, float]:
    """Mean, median and p95 of samples in seconds (:mod:`scopebench.stats`)."""
    from scopebench.stats import summarize

    s = summarize(samples)
    return {"mean_sec": s.mean, "median_sec": s.median, "p95_sec": s.p95}


def format_ms_stats(stats: dict[str, float]) -> str:
    """``mean=  1.24ms  median=   1.18ms  p95=   1.60ms`` (the upstream layout)."""
    return (
        f"mean={stats['mean_sec'] * 1e3:8.2f}ms  median={stats['median_sec'] * 1e3:8.2f}ms  "
        f"p95={stats['p95_sec'] * 1e3:8.2f}ms"
    )


def environment_info(device: Any = "cpu") -> dict[str, Any]:
    """Host, device, driver and library versions of this process.

    ``host_record`` is :func:`scopebench.host.host_record` (machine state: governors,
    cgroup quota, load, GPU clocks and neighbours); ``host`` stays the hostname.
    """
    import torch

    from scopebench.environment import device_name, package_version
    from scopebench.host import host_record

    driver = None
    if torch.cuda.is_available():
        try:
            import ctypes

            lib = ctypes.CDLL("libcuda.so.1")
            version = ctypes.c_int()
            lib.cuDriverGetVersion(ctypes.byref(version))
            driver = f"{version.value // 1000}.{version.value % 1000 // 10}"
        except OSError:
            driver = None
    return {
        "host": socket.gethostname(),
        "device": device_name(device),
        "cuda_driver": driver,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerate": package_version("accelerate"),
        "scopebench": package_version("scopebench"),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "host_record": host_record(device),
    }


def settings_dict(settings: Any) -> dict[str, Any]:
    """A settings dataclass as a JSON-able dict."""
    return dataclasses.asdict(settings)


def check_json_path(key: str, path: str | Path | None) -> None:
    """Refuse, before any work, an output path :func:`write_json` could not write or another
    run is writing (None passes); then hold it for this run.

    The path's folder must exist (a mistyped folder is refused, not created), and the file
    is claimed (:func:`scopebench.atomic.claim_output`): a second run given the same path
    while this one runs is refused at once, naming this one. The claim is released when the
    command ends (:func:`scopebench.commands._common.refuses`). Only the process that writes
    the reports claims it (rank 0, :func:`scopebench.distributed.writes_reports`). Also
    used for ``find-max-batch``'s ``--png``.

    Args:
        key: How the user gave the path (``--json``, ``PROFILE_STEP_JSON``), for the message.
        path: The file to write.

    Raises:
        ValueError: ``path`` is a folder, its folder does not exist or is not writable
            (:func:`scopebench.profiler.config.check_writable_dir`'s reason, after ``key``), or
            another run is writing it (its pid named).
    """
    from scopebench.atomic import claim_output
    from scopebench.distributed import writes_reports
    from scopebench.profiler.config import check_writable_dir

    if path is None or not str(path):
        return
    target = Path(path).expanduser()
    if target.is_dir():
        raise ValueError(f"{key}={str(path)!r} is a directory, not a file path")
    check_writable_dir(f"{key} {str(path)!r}: folder", target.parent)
    if not target.parent.is_dir():
        raise ValueError(f"{key} {str(path)!r}: folder {str(target.parent)!r} does not exist; create it first")
    if writes_reports():
        claim_output(key, path)


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically (:func:`scopebench.atomic.atomic_write`)."""
    from scopebench.atomic import atomic_write

    path = Path(path)
    with atomic_write(path) as fh:
        json.dump(payload, fh, indent=2, default=str)
        fh.write("\n")
    return path
