"""The head and tail every command shares (``scopebench.commands._common``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from scopebench.cli import COMMANDS, main
from scopebench.commands._common import finish, print_json, refuses

MISSING = "/nonexistent/scopebench-missing"

#: A refused input of each command: exit 2 with one line ``scopebench <command>: ...``.
REFUSED = {
    "check-config": [".", "--config", f"{MISSING}.yml"],
    "summary": [MISSING],
    "report": [MISSING],
    "compare": [MISSING, MISSING],
    "profile-step": ["--config", f"{MISSING}.yml"],
    "trace-ledger": [MISSING],
    "profile-dataloader": ["--config", f"{MISSING}.yml"],
    "find-unused-params": ["--config", f"{MISSING}.yml"],
    "bench-inference": ["--config", f"{MISSING}.yml"],
    "decompose-latency": ["--config", f"{MISSING}.yml"],
    "train": ["--config", f"{MISSING}.yml"],
    "convert-checkpoint": [MISSING],
    "estimate-memory": ["--config", f"{MISSING}.yml"],
    "find-max-batch": ["--config", f"{MISSING}.yml"],
}


def test_every_command_but_info_has_a_refusal_here():
    assert sorted(REFUSED) == sorted(set(COMMANDS) - {"info"})


@pytest.mark.parametrize("command", sorted(REFUSED))
def test_a_refused_input_is_one_line_and_exit_2(command, capsys):
    assert main([command, *REFUSED[command]]) == 2
    err = capsys.readouterr().err  # (stdout may hold a library's import chatter: DeepSpeed's)
    assert err.startswith(f"scopebench {command}: ") and err.count("\n") == 1, err
    assert MISSING in err


@pytest.mark.parametrize(
    "command", ["check-config", "summary", "report", "compare", "estimate-memory", "find-max-batch", "profile-step"]
)
def test_the_commands_use_the_shared_head(command):
    import importlib

    module = importlib.import_module(f"scopebench.commands.{command.replace('-', '_')}")
    assert hasattr(module.run, "__wrapped__"), f"{command}: run is not decorated with refuses"


def test_refuses_turns_the_named_errors_into_one_line_and_lets_others_through(capsys):
    @refuses("demo", errors=(OSError,))
    def run(error):
        raise error

    assert run(PermissionError("no access to x")) == 2
    assert capsys.readouterr().err == "scopebench demo: no access to x\n"
    with pytest.raises(RuntimeError):  # a failure, not a refused input: the caller sees it
        run(RuntimeError("rank 1 died"))


def test_finish_prints_then_writes_the_json_atomically(tmp_path, capsys):
    path = tmp_path / "out" / "summary.json"
    path.parent.mkdir()
    assert finish("the report", {"tool": "demo", "path": tmp_path}, str(path)) == 0
    assert capsys.readouterr().out == f"the report\nwrote {path}\n"
    assert json.loads(path.read_text()) == {"tool": "demo", "path": str(tmp_path)}
    assert path.read_text().endswith("}\n") and [p.name for p in path.parent.iterdir()] == ["summary.json"]
    assert finish(None, {"tool": "demo"}, None) == 0  # nothing to print, no --json
    assert capsys.readouterr().out == ""


def test_print_json_prints_what_write_json_writes(tmp_path, capsys):
    from scopebench.policy.tools import write_json

    payload = {"a": [1, 2.5, None], "path": tmp_path}
    print_json(payload)
    assert capsys.readouterr().out == write_json(tmp_path / "x.json", payload).read_text()


#: (command, old spelling, new spelling, the Namespace attribute both fill)
ALIASES = [
    ("estimate-memory", "--nproc", "--nproc-per-node", "nproc_per_node"),
    ("estimate-memory", "--device-memory-gb", "--memory-gb", "memory_gb"),
    ("find-max-batch", "--nproc", "--nproc-per-node", "nproc_per_node"),
]


@pytest.mark.parametrize(("command", "old", "new", "dest"), ALIASES)
def test_an_old_flag_spelling_fills_the_new_one_and_prints_one_deprecation_line(command, old, new, dest, capsys):
    from scopebench.cli import build_parser

    parser = build_parser()
    args = parser.parse_args([command, "--config", "c.yml", old, "2"])
    assert (
        getattr(args, dest) == 2
        and capsys.readouterr().err == f"scopebench {command}: {old} is deprecated, use {new}\n"
    )
    assert getattr(parser.parse_args([command, "--config", "c.yml", new, "2"]), dest) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ("report", ["--memory-gb"]),
        ("find-max-batch", ["--memory-gb", "--nproc-per-node"]),
        ("estimate-memory", ["--memory-gb", "--nproc-per-node"]),
        ("profile-step", ["--nproc-per-node"]),
        ("profile-dataloader", ["--nproc-per-node"]),
        ("train", ["--nproc-per-node"]),
    ],
)
def test_one_spelling_of_memory_and_ranks_in_every_command(command, flags):
    from scopebench.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    shown = {s for a in sub._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
    assert set(flags) <= shown
    assert not shown & {"--nproc", "--device-memory-gb", "--memory", "--nproc-per-rank"}


# -- two runs, one output file --------------------------------------------------------------------
TINY = str(Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml")
#: ``estimate-memory --json argv[1]`` that says ``holding`` once it has validated (and claimed)
#: its outputs, and waits for its stdin to close before it estimates and writes.
PAUSED = (
    "import sys\n"
    "import scopebench.commands.estimate_memory as command\n"
    "estimate = command._estimate\n"
    "def paused(*args, **kwargs):\n"
    "    print('holding', flush=True)\n"
    "    sys.stdin.read()\n"
    "    return estimate(*args, **kwargs)\n"
    "command._estimate = paused\n"
    "from scopebench.cli import main\n"
    f"sys.exit(main(['estimate-memory', '--config', {TINY!r}, '--json', sys.argv[1]]))\n"
)

#: A second run given the first one's file: (command, its arguments, the key it names).
SECOND_RUNS = {
    "profile-step": (["--config", TINY, "--steps", "1", "--warmup", "0", "--json"], "--json"),
    "find-max-batch": (["--config", TINY, "--memory-gb", "1", "--png"], "--png"),
    "train": (["--config", TINY, "--steps", "1", "--output_dir", "{tmp}/run", "--json"], "--json"),
    "convert-checkpoint": (["{tmp}/run", "--json"], "--json"),
    "estimate-memory": (["--config", TINY, "--json"], "--json"),
}


def test_a_second_run_writing_the_same_output_is_refused_at_once_naming_the_first(tmp_path, capsys):
    """The first run (another process) holds ``out.json`` from its validation to its write;
    every command given that file meanwhile exits 2 before any work, then the first writes its
    own file and leaves no lock behind."""
    import socket
    import subprocess
    import sys

    path = tmp_path / "out.json"
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = first.stdout.readline()  # the event: it has claimed its outputs
        assert line == "holding\n", line + first.stderr.read()
        for command, (args, key) in sorted(SECOND_RUNS.items()):
            assert main([command, *(a.format(tmp=tmp_path) for a in args), str(path)]) == 2, command
            captured = capsys.readouterr()
            assert captured.err == (
                f"scopebench {command}: {key} {path} is being written by another run (pid {first.pid} on host "
                f"{socket.gethostname()}); choose another path or wait\n"
            )
            assert "wrote" not in captured.out and not (tmp_path / "run").exists()
        first.stdin.close()
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
        first.wait()
    assert first.stdout.read().endswith(f"wrote {path}\n")
    assert json.loads(path.read_text())["tool"] == "estimate-memory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_json_path_into_a_missing_folder_is_refused_not_created(tmp_path, capsys):
    path = tmp_path / "missing" / "m.json"
    assert main(["estimate-memory", "--config", TINY, "--json", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"scopebench estimate-memory: --json {str(path)!r}: folder {str(path.parent)!r} does not exist; create it "
        "first\n"
    )
    assert list(tmp_path.iterdir()) == []
