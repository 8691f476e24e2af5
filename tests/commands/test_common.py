"""The head and tail every command shares (``scopebench.commands._common``)."""

from __future__ import annotations

import json

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
