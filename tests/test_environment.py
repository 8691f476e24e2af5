"""Versions and device name recorded with every result; the ``SCOPEBENCH_*`` settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scopebench.cli import main
from scopebench.environment import (
    INTERNAL,
    SETTINGS,
    check_environment,
    env_setting,
    environment_metrics,
    package_version,
)


def test_environment_metrics():
    env = environment_metrics("cpu")
    assert env["torch_version"] == torch.__version__
    assert env["scopebench_version"] == package_version("scopebench") != "unknown"
    assert env["device_name"].startswith("cpu")
    assert environment_metrics(torch.device("cpu")) == env
    assert package_version("surely-not-an-installed-package") is None


def test_info_command(capsys):
    import json

    assert main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["versions"]["torch"] == torch.__version__


# -- SCOPEBENCH_* settings (issue 44): one reader, refused in one line before any work ------------
REPO = Path(__file__).resolve().parents[1]
_FLAG = r"1 or 0 \(also true/false, yes/no, on/off\)"
BAD = {
    "SCOPEBENCH_CLOCK_ALIGN": (["estmate", "shared", "1"], r"'auto' or 'estimate'"),
    "SCOPEBENCH_LEDGER": (["maybe", "2", "of"], _FLAG),
    "SCOPEBENCH_KEEP_FREED_MEMORY": (["no!", "-1"], _FLAG),
    "SCOPEBENCH_SAMPLER_PERIOD_SEC": (
        ["inf", "nan", "-1", "1e9", "3601", "0.001", "fast", "-inf"],
        r"0 \(off\) or seconds from 0\.01 to 3600",
    ),
}


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, (values, _) in BAD.items() for v in values])
def test_a_value_a_setting_does_not_allow_is_refused_naming_it_and_what_it_allows(name, value):
    allowed = BAD[name][1]
    with pytest.raises(
        ValueError, match=rf"^environment variable {name} must be {allowed}, got {re.escape(repr(value))}$"
    ):
        env_setting(name, {name: value})
    with pytest.raises(ValueError, match=rf"^environment variable {name} must be"):
        check_environment({name: value})


def test_allowed_values_and_defaults():
    assert check_environment({}) == {
        "SCOPEBENCH_SAMPLER_PERIOD_SEC": 0.1,
        "SCOPEBENCH_LEDGER": True,
        "SCOPEBENCH_CLOCK_ALIGN": "auto",
        "SCOPEBENCH_KEEP_FREED_MEMORY": True,
    }
    assert env_setting("SCOPEBENCH_CLOCK_ALIGN", {"SCOPEBENCH_CLOCK_ALIGN": "Estimate"}) == "estimate"
    assert env_setting("SCOPEBENCH_CLOCK_ALIGN", {"SCOPEBENCH_CLOCK_ALIGN": ""}) == "auto"  # empty: unset
    assert [env_setting("SCOPEBENCH_LEDGER", {"SCOPEBENCH_LEDGER": v}) for v in ("0", "false", "off", "1", "yes")] == [
        False,
        False,
        False,
        True,
        True,
    ]
    period = "SCOPEBENCH_SAMPLER_PERIOD_SEC"
    assert [env_setting(period, {period: v}) for v in ("0", "0.01", "3600", " 0.5 ")] == [0.0, 0.01, 3600.0, 0.5]


def test_a_huge_value_is_quoted_short():
    with pytest.raises(ValueError, match=r"got 'xxxx+'\.\.\. \(100000 characters\)$") as err:
        env_setting("SCOPEBENCH_LEDGER", {"SCOPEBENCH_LEDGER": "x" * 100_000})
    assert len(str(err.value)) < 300


@pytest.mark.parametrize(
    ("name", "value"), [("SCOPEBENCH_CLOCK_ALIGN", "estmate"), ("SCOPEBENCH_SAMPLER_PERIOD_SEC", "inf")]
)
def test_a_recording_profiler_refuses_a_bad_setting_when_it_is_built(monkeypatch, name, value):
    """Before any iteration: ``estmate`` was ignored (the shared clock used), ``inf`` started a
    sampler thread whose first wait raised ``OverflowError`` in the middle of the report."""
    from scopebench.profiler import create_profiler

    monkeypatch.setenv(name, value)
    for mode in ("custom", "torch"):
        with pytest.raises(ValueError, match=rf"^environment variable {name} must be "):
            create_profiler(mode, "cpu")


def test_every_command_refuses_a_bad_setting_in_one_line_before_it_runs(monkeypatch, capsys):
    monkeypatch.setenv("SCOPEBENCH_CLOCK_ALIGN", "estmate")
    assert main(["info"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "scopebench: environment variable SCOPEBENCH_CLOCK_ALIGN must be 'auto' or 'estimate', got 'estmate'\n"
    )


def test_the_allocator_reads_its_setting_through_the_one_reader():
    """``SCOPEBENCH_KEEP_FREED_MEMORY=off`` kept the settings on (only ``0`` counted); ``2`` was
    taken as on. Both now mean what they say, or are refused."""
    code = (
        "from scopebench.allocator import allocator_env, keep_freed_memory; print(keep_freed_memory(), allocator_env())"
    )
    for value, out in (("off", "False {}"), ("0", "False {}")):
        env = dict(os.environ, SCOPEBENCH_KEEP_FREED_MEMORY=value)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.stdout.strip() == out, proc.stderr[-500:]
    env = dict(os.environ, SCOPEBENCH_KEEP_FREED_MEMORY="2")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "ValueError: environment variable SCOPEBENCH_KEEP_FREED_MEMORY must be 1 or 0" in proc.stderr


def test_every_variable_the_code_reads_is_a_setting_or_internal_and_the_settings_are_documented():
    """A new ``SCOPEBENCH_*`` variable joins :data:`SETTINGS` (read by ``env_setting``, refused in
    one line, in docs/profiler.md's table) or :data:`INTERNAL` (set by scopebench for its children)."""
    named = set()
    for path in (REPO / "src" / "scopebench").rglob("*.py"):
        named |= set(re.findall(r"\bSCOPEBENCH_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    assert named - set(SETTINGS) - set(INTERNAL) == set()
    assert set(SETTINGS).isdisjoint(INTERNAL) and set(SETTINGS) | set(INTERNAL) <= named
    docs = (REPO / "docs" / "profiler.md").read_text()
    table = docs[docs.index("## Environment settings") :]
    for name in (*SETTINGS, *INTERNAL):
        assert f"`{name}`" in table, name
