"""``--backend`` and ``--accelerate-config``, the policy tools' shared backend options: a backend
and a file that disagree are refused in one line before any work, whichever tool is given them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scopebench.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "policy" / "tiny.yml")
DDP_FILE = str(REPO / "configs" / "accelerate" / "ddp.yaml")
#: Every tool with the backend options, with what else it needs to reach its work.
TOOLS = {
    "train": ["--steps", "1"],
    "profile-step": ["--steps", "1", "--warmup", "0"],
    "estimate-memory": [],
    "find-max-batch": ["--memory-gb", "4"],
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_backend_the_accelerate_file_does_not_select_is_refused_in_one_line(tool, tmp_path, capsys):
    """Before, the file won silently: ``--backend=zero3 --accelerate-config ddp.yaml`` ran DDP and
    only the header said so."""
    extra = ["--output_dir", str(tmp_path / "out")] if tool == "train" else []
    code = main([tool, "--config", TINY, "--backend=zero3", "--accelerate-config", DDP_FILE, *TOOLS[tool], *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert re.fullmatch(
        rf"scopebench {tool}: --backend zero3 and --accelerate-config {re.escape(DDP_FILE)} disagree: the file "
        r"selects backend ddp; drop one, or pass zero3's file \(configs/accelerate/deepspeed_zero3.yaml\)\n",
        err,
    ), err
    assert not (tmp_path / "out").exists()  # nothing was started


def test_a_backend_and_the_file_that_selects_it_agree(capsys):
    code = main(["estimate-memory", "--config", TINY, "--backend", "ddp", "--accelerate-config", DDP_FILE])
    out = capsys.readouterr().out
    assert code == 0 and "backend=ddp" in out


def test_an_unknown_backend_is_refused_naming_the_option_and_the_backends(capsys):
    from scopebench.train.backends import backend_names

    code = main(["estimate-memory", "--config", TINY, "--backend", "zero9"])
    err = capsys.readouterr().err
    allowed = ", ".join(repr(name) for name in backend_names())
    assert code == 2 and err == f"scopebench estimate-memory: --backend must be one of {allowed}, got 'zero9'\n"


def test_the_accelerate_file_read_by_the_command_is_the_one_the_run_is_handed(monkeypatch, tmp_path, capsys):
    """``scopebench train`` reads the file once and hands it, with its backend, to the run."""
    from scopebench.policy.run import trainer

    seen = {}

    def train_policy(config, resume_from=None, accelerate_file=None):
        seen.update(backend=config.train.backend, file=accelerate_file)
        raise ValueError("stopped here")

    monkeypatch.setattr(trainer, "train_policy", train_policy)
    args = ["train", "--config", TINY, "--accelerate-config", DDP_FILE, "--nproc-per-node", "1"]
    assert main([*args, "--output_dir", str(tmp_path / "out")]) == 2
    assert seen["backend"] == "ddp" and seen["file"].path == DDP_FILE
    assert seen["file"].backend.name == "ddp"
