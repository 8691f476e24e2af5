"""House-style rules that are cheap to enforce mechanically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_heavy_packages_are_not_imported_at_module_level():
    ruff = Path(sys.executable).parent / "ruff"
    proc = subprocess.run(
        [str(ruff), "check", "--select", "TID253", "--no-cache", "src", "benchmarks", "scripts"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_run_config_at_benchopt_settings_path():
    for bench in (REPO, REPO / "benchmark_inference", REPO / "benchmark_training"):
        assert not (bench / "config.yml").exists(), f"{bench}/config.yml is BenchOpt's own settings file"


def test_src_never_imports_benchopt():
    offenders = [
        str(p.relative_to(REPO))
        for p in (REPO / "src").rglob("*.py")
        if any(line.lstrip().startswith(("import benchopt", "from benchopt")) for line in p.read_text().splitlines())
    ]
    assert offenders == []
