"""The ``scopebench`` entry point itself (each command has its own tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: ``scopebench info`` in a process that says whether its exit handlers ran.
PROGRAM = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('exit handlers ran', flush=True))\n"
    "from scopebench.cli import main\n"
    "sys.exit(main(['info']))\n"
)


@pytest.mark.parametrize("launched", [True, False])
def test_a_rank_started_by_torchrun_leaves_without_interpreter_teardown(launched):
    """A launched rank's command returns, then the process ends with os._exit and the same
    status: the interpreter's teardown, where about one launched rank in fifteen aborted,
    never runs. A plain process (no RANK/WORLD_SIZE) tears down as usual."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    if launched:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "versions" in json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])  # the command's output got out
    assert ("exit handlers ran" in proc.stdout) is (not launched), proc.stdout[-500:]
