"""``scopebench train`` and ``convert-checkpoint``: refusals before any work, logs, checkpoints,
resume from a saved config, several ranks started by the command itself, ranks that die or hang."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import psutil
import pytest

from .helpers import train_tool as train

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "policy" / "tiny.yml")
ACCELERATE = REPO / "configs" / "accelerate"

NUM = {"type": "number"}
TRAIN_SCHEMA = {
    "type": "object",
    "required": ["tool", "config", "start_step", "steps", "checkpoints", "world_size", "backend", "log"],
    "properties": {
        "tool": {"const": "train"},
        "start_step": {"type": "integer", "minimum": 0},
        "steps": {"type": "integer", "minimum": 1},
        "checkpoints": {"type": "array", "items": {"type": "string"}},
        "backend": {"enum": ["ddp", "zero2", "zero3"]},
        "log": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["step", "train_loss", "samples_per_sec", "phases_mean_sec"],
                "properties": {"step": {"type": "integer"}, "samples_per_sec": NUM},
            },
        },
    },
}


def test_gradient_checkpointing_with_zero3_is_refused_before_anything_starts(data_args, tmp_path, capsys, started):
    code, _, err = train(
        [*data_args, "--accelerate-config", str(ACCELERATE / "deepspeed_zero3.yaml"), "--gradient_checkpointing=true"]
        + ["--output_dir", str(tmp_path / "run")],
        capsys,
    )
    assert code == 2 and "gradient_checkpointing=true cannot run with backend=zero3" in err and "zero2" in err
    assert not (tmp_path / "run").exists() and started == []  # no process, no folder


@pytest.mark.parametrize(
    ("make", "missing"),
    [
        (lambda ckpt: (ckpt / "model.safetensors").write_bytes(b"x"), "training_step.json is missing"),
        (lambda ckpt: (ckpt / "training_step.json").write_text('{"step": 2, "backend": "ddp"}'), "model.safetensors"),
    ],
)
def test_resuming_from_an_unfinished_checkpoint_names_the_missing_file(data_args, tmp_path, capsys, make, missing):
    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / "000002").mkdir(parents=True)
    make(checkpoints / "000002")
    (checkpoints / "last").symlink_to("000002")
    code, _, err = train([*data_args, "--output_dir", str(tmp_path / "run"), "--resume", "true"], capsys)
    assert code == 2 and missing in err, err


def test_a_new_run_refuses_a_folder_with_checkpoints(data_args, tmp_path, capsys):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "last").symlink_to("000004")
    code, _, err = train([*data_args, "--output_dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "--resume true" in err and "already holds checkpoints" in err


@pytest.mark.slow
def test_train_logs_saves_and_resumes_from_the_saved_config(data_args, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["--output_dir", str(run), "--steps", "4", "--log_freq", "2", "--save_freq", "2"]
    code, out, err = train([*data_args, *args, "--json", str(tmp_path / "a.json")], capsys)
    assert code == 0, err
    first = json.loads((tmp_path / "a.json").read_text())
    jsonschema.validate(first, TRAIN_SCHEMA)
    assert first["start_step"] == 0 and first["steps"] == 4 and [r["step"] for r in first["log"]] == [2, 4]
    assert [Path(p).name for p in first["checkpoints"]] == ["000002", "000004"]
    assert "in force: precision=fp32 (the training config; ddp.yaml says mixed_precision=bf16)" in out
    assert any(
        line.startswith("step 2/4 loss=") and "samples/s" in line and "bwd=" in line for line in out.splitlines()
    )
    assert (run / "checkpoints" / "last").resolve().name == "000004"

    saved = run / "checkpoints" / "000002" / "train_config.yaml"
    code, out, err = train(
        ["--config", str(saved), "--resume", "true", "--steps", "6", "--json", str(tmp_path / "b.json")], capsys
    )
    assert code == 0, err
    second = json.loads((tmp_path / "b.json").read_text())
    jsonschema.validate(second, TRAIN_SCHEMA)
    assert second["start_step"] == 2 and second["steps"] == 6
    assert [Path(p).name for p in second["checkpoints"]] == ["000004", "000006"]  # 000004 rewritten
    assert "resumed from" in out and "at step 2 (epoch 0, batch 2" in out
    assert json.loads((run / "checkpoints" / "000004" / "training_step.json").read_text())["step"] == 4
    assert (run / "checkpoints" / "last").resolve().name == "000006"


def _scopebench(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scopebench.cli", *args], capture_output=True, text=True, timeout=600, **kwargs
    )


@pytest.mark.slow
def test_two_ranks_go_through_the_local_launcher_and_convert(data_args, tmp_path):
    from scopebench.policy.checkpoint import load_policy

    run = tmp_path / "z2"
    proc = _scopebench(
        "train", *data_args, "--accelerate-config", str(ACCELERATE / "deepspeed_zero2.yaml"),
        "--output_dir", str(run), "--steps", "3", "--log_freq", "3", "--find_unused_params=false",
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "2 local ranks started by this process" in log and "ranks=2 backend=zero2" in log
    assert "optim_step = engine.step" in log  # the phases' contents under ZeRO-2
    checkpoint = run / "checkpoints" / "000003"
    assert (checkpoint / "random_states_1.pkl").is_file() and not (checkpoint / "model.safetensors").exists()
    script = subprocess.run(
        [str(REPO / "scripts" / "convert_checkpoint.sh"), str(checkpoint)], capture_output=True, text=True
    )
    assert script.returncode == 0 and "wrote" in script.stdout, script.stderr
    model = load_policy(checkpoint)
    assert model.num_params() == sum(p.numel() for p in model.parameters()) > 0


def _signal_rank_1(proc: subprocess.Popen, sig: int, after_line: str) -> tuple[list[str], float]:
    """Read ``proc``'s output until ``after_line`` starts a line, then send ``sig`` to its rank 1."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(after_line):
            break
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            rank = child.environ().get("SCOPEBENCH_RANK")  # a rank the command spawned
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if rank == "1" and "scopebench.cli" in cmdline:
            os.kill(child.pid, sig)
            return lines, time.monotonic()
    raise AssertionError("rank 1 not found:\n" + "".join(lines))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "expected", "limit"),
    [
        (signal.SIGKILL, "rank 1 died after iteration", 60),
        (signal.SIGSTOP, "rank 1 is stopped (SIGSTOP or a debugger) after iteration", 5 + 45),
    ],
)
def test_a_rank_that_dies_or_hangs_fails_the_run_naming_it(data_args, tmp_path, sig, expected, limit):
    proc = subprocess.Popen(
        [sys.executable, "-m", "scopebench.cli", "train", *data_args, "--nproc-per-node", "2"]
        + ["--output_dir", str(tmp_path / "run"), "--steps", "2000", "--log_freq", "2", "--group_timeout_sec=5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines, sent = _signal_rank_1(proc, sig, "step 4/")
        rest = proc.communicate(timeout=limit + 30)[0]
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    log = "".join(lines) + rest
    assert proc.returncode != 0 and elapsed < limit, (elapsed, log[-4000:])
    assert expected in log, log[-4000:]
    if sig == signal.SIGKILL:  # the launcher (the top-level process) gives the signal
        assert re.search(r"scopebench train: rank 1 died with SIGKILL after iteration \d+", log), log[-4000:]
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
def test_the_ranks_the_command_starts_write_the_json_it_holds_for_them(data_args, tmp_path, capsys):
    """The command claims ``--json`` before it starts its ranks; its rank 0, which writes the
    file, is not refused by that claim (scopebench.atomic.OUTPUTS_ENV)."""
    path = tmp_path / "t.json"
    args = ["--nproc-per-node", "2", "--output_dir", str(tmp_path / "run"), "--steps", "1", "--json", str(path)]
    code, _, err = train([*data_args, *args], capsys)
    assert code == 0, err
    assert json.loads(path.read_text())["world_size"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "t.json"]  # no lock file left


def test_sigterm_waits_while_rank_0_names_the_failed_rank(data_args, tmp_path, monkeypatch, capsys):
    """The launcher sends SIGTERM within 0.05 s of seeing a rank die, often while rank 0
    is still writing the report that names it (seen in CI: rank 0 ended by the signal, no report).
    Here the SIGTERM arrives during the report of a real session's failed close."""
    import scopebench.policy.run.trainer as trainer
    from scopebench.distributed import DistSession, RankFailure

    def fail_during_the_report(config, resume_from=None, accelerate_file=None):
        session = DistSession()
        session.start()
        session.close(failed=True)  # the diagnosis has begun
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here: it must not end the report
        raise RankFailure("rank 1 died after iteration 3 (its launcher reports the exit code or signal)")

    monkeypatch.setattr(trainer, "train_policy", fail_during_the_report)
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = train([*data_args, "--output_dir", str(tmp_path / "run")], capsys)
    assert code == 1 and "the run failed:\nrank 1 died after iteration 3" in err, err
    assert signal.getsignal(signal.SIGTERM) is before

    def stopped_mid_step(config, resume_from=None, accelerate_file=None):
        DistSession().start()  # a new session: no failure being reported
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(trainer, "train_policy", stopped_mid_step)
    with pytest.raises(SystemExit) as stopped:
        train([*data_args, "--output_dir", str(tmp_path / "run2")], capsys)
    assert stopped.value.code == 128 + signal.SIGTERM
