"""Hostile run configs stop with one line naming the file, without the memory they ask for.

Each load runs in a fresh interpreter: ``ru_maxrss`` is a high-water mark, so only a
process of its own shows what one load cost. A regression would expand about 4 * 10**8
nodes; the address-space limit turns that into a failure here instead of a machine that
swaps.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GROWTH_LIMIT_MB = 200

#: Runs ``CALL`` (an expression) with the address space capped at 2 GiB above what the
#: imports took, then prints what it raised or returned and how far ``ru_maxrss`` grew.
_MEASURE = """
import contextlib, io, json, resource, sys
{imports}
with open("/proc/self/status") as status:
    vm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm_kb * 1024 + 2 * 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
stderr = io.StringIO()
try:
    with contextlib.redirect_stderr(stderr):
        result = repr({call})
except Exception as err:
    result = f"{{type(err).__name__}}: {{err}}"
growth_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({{"result": result, "stderr": stderr.getvalue(), "growth_mb": growth_kb / 1024}}))
"""


def _measure(imports: str, call: str) -> dict:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to cap the address space")
    script = _MEASURE.format(imports=imports, call=call)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _bomb_under(key: str, levels: int = 9, width: int = 9) -> str:
    """``key`` holding a "billion laughs" list: each anchor is ``width`` aliases of the one before."""
    items = ["  - &a0 [" + ", ".join(["x"] * width) + "]"]
    items += [f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return f"{key}:\n" + "\n".join(items) + "\n"


def test_an_alias_bomb_in_a_policy_run_config_is_refused_without_memory_growth(tmp_path):
    bomb = tmp_path / "bomb.yml"
    bomb.write_text("preset: tiny\n" + _bomb_under("batch_size"))  # batch_size is validated: its value is quoted
    assert len(bomb.read_bytes()) < 600
    out = _measure("from scopebench.policy.settings import load_run_config", f"load_run_config({str(bomb)!r})")
    assert out["result"].startswith(f"ValueError: {bomb}: its YAML aliases add at least ")
    assert "\n" not in out["result"] and len(out["result"]) < 300
    assert out["growth_mb"] < GROWTH_LIMIT_MB, out


def test_an_alias_bomb_in_a_benchopt_run_config_is_refused_by_check_config(tmp_path):
    bomb = tmp_path / "bomb.yml"
    bomb.write_text(_bomb_under("dataset"))
    argv = ["check-config", "benchmark_inference", "--config", str(bomb)]
    # torch first: its libraries' mappings count in the address space the cap starts from, and
    # the benchmark's solvers (read after the config) import it.
    out = _measure("import torch\nfrom scopebench.cli import main", f"main({argv!r})")
    assert out["result"] == "2", out
    assert out["stderr"].startswith(f"scopebench check-config: {bomb}: its YAML aliases add at least ")
    assert out["stderr"].count("\n") == 1 and len(out["stderr"]) < 300
    assert out["growth_mb"] < GROWTH_LIMIT_MB, out


def test_a_1_mb_string_for_a_validated_key_gives_a_short_message(tmp_path):
    from scopebench.policy.settings import load_run_config

    config = tmp_path / "huge.yml"
    config.write_text(textwrap.dedent(f"""\
        preset: tiny
        learning_rate: "{'x' * 1_000_000}"
        """))
    with pytest.raises(ValueError) as err:
        load_run_config(config)
    message = str(err.value)
    assert len(message) < 1000, message[:300]
    assert message.startswith("learning_rate must be a finite number > 0, got 'xxx")
    assert message.endswith("...' (str, 1000000 characters)")


HOSTILE_RUN_CONFIGS = {  # issue 44: each was taken silently or ended in a traceback
    "duplicate key": (
        b"preset: tiny\nseed: 1\nseed: 2\n",
        r"key 'seed' appears twice in one mapping, at line 2 and line 3",
    ),
    "section of the wrong type": (b"preset: tiny\ntraining: 5\n", r"section 'training' must be a mapping of settings"),
    "not UTF-8": (b"preset: tiny\n# \xe9t\xe9\n", r"is not UTF-8 text \(byte 0xe9 at offset 15\)"),
    "2**64 seed": (b"preset: tiny\nseed: 18446744073709551616\n", r"seed must be an integer from 0 to 2\*\*63 - 1"),
}


@pytest.mark.parametrize("case", list(HOSTILE_RUN_CONFIGS))
def test_scopebench_train_refuses_a_hostile_run_config_in_one_line(tmp_path, capsys, case):
    from scopebench.cli import main

    text, message = HOSTILE_RUN_CONFIGS[case]
    config = tmp_path / "run.yml"
    config.write_bytes(text)
    code = main(["train", "--config", str(config), "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("scopebench train: "), err
    assert re.search(message, err) and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
