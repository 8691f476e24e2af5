"""Inference with a policy of your own: its errors in one line naming the policy and the call, its
chunks checked (shape, actions, values) off the clock, and chunks per call bounded before any call.

Each test policy counts its own calls in a closure (a fresh count per build), so which call
fails is decided by the count, never by time: nothing here depends on how busy the machine is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from scopebench.cli import main
from scopebench.policy.run.inference import InferenceRun
from scopebench.policy.settings import InferenceSettings
from scopebench.policy.user import PolicyError

from .conftest import TINY

POLICIES = """
import torch
from scopebench.policy import UserPolicy


def _policy(sample, **extra):
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    extra.setdefault("observation", lambda batch_size: torch.randn(batch_size, 4))
    return UserPolicy(model=torch.nn.Linear(4, 4), loss=lambda model, batch: model(batch[0]).sum(), dataset=data,
                      sample=sample, **extra)


def _counted(chunk):
    # sample(model, obs, num_steps) -> chunk(call number from 1, batch size)
    calls = [0]

    def sample(model, obs, num_steps):
        calls[0] += 1
        return chunk(calls[0], len(obs))

    return sample


def one_tensor():  # stateful, but returns the chunk without the state
    return _policy(lambda model, obs, num_steps, state: torch.zeros(2, 8, 4), reset=lambda model: 0)


def reset_raises(kind="KeyError"):
    def reset(model):
        raise {"KeyError": KeyError, "ValueError": ValueError}[kind]("no episode")

    return _policy(lambda model, obs, num_steps, state: (obs, state), reset=reset)


def raises_in(phase="sample", after=0):
    calls = [0]

    def boom(*args):
        calls[0] += 1
        if calls[0] > after:
            raise RuntimeError(f"{phase} failed\\nsecond line")
        return args[-1] if phase == "observation" else torch.zeros(1, 8, 4)

    if phase == "sample":
        return _policy(lambda model, obs, num_steps: boom(obs))
    if phase == "observation":
        return _policy(lambda model, obs, num_steps: torch.zeros(1, 8, 4), observation=boom)
    return _policy(lambda model, obs, num_steps: torch.zeros(1, 8, 4), **{phase: boom})


def nan_from(call=1):  # the actions of this call and later ones hold a NaN
    def chunk(n, batch):
        out = torch.zeros(batch, 8, 4)
        out[0, 3, 1] = float("nan") if n >= call else 0.0
        return out

    return _policy(_counted(chunk))


def shape_changes(call=3):
    return _policy(_counted(lambda n, batch: torch.zeros(batch, 5 if n >= call else 8, 4)))


def chunk_of(actions=2):
    return _policy(_counted(lambda n, batch: torch.zeros(batch, actions, 4)))


def ignores_the_batch():  # one chunk whatever the observation's batch
    return _policy(_counted(lambda n, batch: torch.zeros(1, 8, 4)))


def out_of_memory_above(chunks=2):
    def chunk(n, batch):
        if batch > chunks:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return torch.zeros(batch, 8, 4)

    return _policy(_counted(chunk))


def marks_its_calls(marker=""):  # each call touches ``marker``: whether any call ran
    def sample(model, obs, num_steps):
        open(marker, "a").close()
        return torch.zeros(len(obs), 8, 4)

    return _policy(sample, observation=lambda batch_size: torch.zeros(batch_size, 3, 224, 224))
"""


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policies") / "inference_check_policies.py"
    path.write_text(POLICIES)
    return str(path)


def _bench(policies: str, factory: str, tmp_path: Path, capsys, *extra: str) -> tuple[int, str, str, dict | None]:
    """``bench-inference`` of ``factory`` (1 warm-up call, 4 timed): exit status, stdout, stderr, its JSON."""
    out = tmp_path / "b.json"
    args = ["bench-inference", "--config", TINY, "--policy", f"{policies}:{factory}", "--n-warmup", "1"]
    code = main([*args, "--n-timed", "4", "--output-dir", str(tmp_path / "out"), "--json", str(out), *extra])
    text = capsys.readouterr()
    return code, text.out, text.err, json.loads(out.read_text()) if out.exists() else None


def _one_line(err: str, tool: str = "bench-inference") -> str:
    assert err.count("\n") == 1 and err.startswith(f"scopebench {tool}: "), err
    return err.strip()


# -- the policy's own code, named -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "args", "line"),
    [
        (
            "one_tensor",
            [],
            r"policy .*:one_tensor: sample returned a Tensor of shape \(2, 8, 4\); a stateful policy "
            r"\(UserPolicy\.reset\) returns a pair \(output, new_state\)$",
        ),
        ("reset_raises", [], r"policy .*:reset_raises: reset raised KeyError: 'no episode'$"),
        # a ValueError of the policy's own code was printed bare, without the policy or the call
        ("reset_raises", ["--policy-arg", "kind=ValueError"], r"policy .*:reset_raises: reset raised ValueError: no"),
        ("raises_in", [], r"policy .*:raises_in: sample raised RuntimeError: sample failed \.\.\.$"),
        *[
            ("raises_in", ["--policy-arg", f"phase={phase}"], rf"policy .*:raises_in: {phase} raised RuntimeError")
            for phase in ("observation", "preprocess", "prefill", "postprocess")
        ],
    ],
)
def test_an_error_of_the_policy_s_code_names_the_policy_and_the_call(policies, factory, args, line, tmp_path, capsys):
    code, out, err, report = _bench(policies, factory, tmp_path, capsys, *args)
    assert code == 2 and report is None
    assert re.search(line, _one_line(err)), err


def test_the_error_is_chained_for_its_traceback(policies):
    settings = InferenceSettings(policy=f"{policies}:raises_in", n_warmup=1)
    with pytest.raises(PolicyError, match=r"^policy .*: sample raised RuntimeError: sample failed \.\.\.$") as info:
        with InferenceRun(settings, dataset_root="", chunk_size=8):
            pass
    assert isinstance(info.value.__cause__, RuntimeError) and "second line" in str(info.value.__cause__)


def test_sample_raising_in_the_closed_loop_reports_the_timed_calls_first(policies, tmp_path, capsys):
    # 1 warm-up + 4 timed calls: the replay's first call raises (in its worker thread, before t0; one
    # that raises later is tests/policy/control/test_replay.py's, on the simulated clock)
    args = ["--policy-arg", "after=5", "--control-hz", "100", "--closed-loop", "sync", "--closed-loop-ticks", "20"]
    code, out, err, report = _bench(policies, "raises_in", tmp_path, capsys, *args)
    line = _one_line(err)
    assert code == 2 and re.search(r"policy .*:raises_in: sample raised RuntimeError: sample failed \.\.\.$", line)
    assert "4 timed calls (ms): mean=" in out and "control: keeps up at 100 Hz" in out  # reported, then the line
    assert len(report["samples_sec"]) == 4 and report["closed_loop"] is None
    assert report["failure"] == line.removeprefix("scopebench bench-inference: ")


# -- the chunks the calls return --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "call"),
    [([], "warm-up call 1 of 1"), (["--policy-arg", "call=4"], "timed call 3"), (["--n-warmup", "0"], "timed call 1")],
)
def test_non_finite_actions_fail_the_run_naming_the_call_and_its_num_steps(policies, args, call, tmp_path, capsys):
    code, out, err, report = _bench(policies, "nan_from", tmp_path, capsys, *args)
    line = _one_line(err)
    assert code == 1 and report is None and "timed calls (ms)" not in out
    assert line.endswith(f"{call} (num_steps=10) returned non-finite actions: 1 NaN and 0 inf of 32 values"), line


def test_non_finite_actions_fail_decompose_latency_too(policies, capsys):
    args = ["decompose-latency", "--config", TINY, "--policy", f"{policies}:nan_from", "--policy-arg", "call=4"]
    code = main([*args, "--num-steps", "1,2", "--repeats", "2", "--policy.n_warmup=1"])
    line = _one_line(capsys.readouterr().err, "decompose-latency")
    # warm-up: calls 1 (N=1) and 2 (N=2); timed: 3 (N=1), 4 (N=2)
    assert code == 1 and line.endswith(
        "timed call 2 (num_steps=2) returned non-finite actions: 1 NaN and 0 inf of 32 values"
    )


def test_a_chunk_of_another_shape_is_refused_naming_both(policies, tmp_path, capsys):
    code, _, err, report = _bench(policies, "shape_changes", tmp_path, capsys)
    assert code == 2 and report is None
    assert _one_line(err).endswith(
        "timed call 2 (num_steps=10) returned shape (1, 5, 4), expected shape (1, 8, 4) as its first call at "
        "num_steps=10 returned"
    )


def test_n_action_steps_is_checked_against_the_chunk_the_policy_returns(policies, tmp_path, capsys):
    code, _, err, _ = _bench(policies, "chunk_of", tmp_path, capsys, "--n-action-steps", "4", "--control-hz", "30")
    assert code == 2 and _one_line(err).endswith(
        "policy "
        + f"{policies}:chunk_of: --n-action-steps must be at most the 2 actions of a chunk, got 4 (its first call at "
        "num_steps=10 returned shape (1, 2, 4), read as (batch, actions, action dims...))"
    )
    # the run config's chunk size (8) is pi05's: a policy's own chunk of 16 takes 12, and the whole of it by default
    extra = ["--policy-arg", "actions=16", "--control-hz", "30"]
    code, _, err, report = _bench(policies, "chunk_of", tmp_path, capsys, *extra, "--n-action-steps", "12")
    assert code == 0, err
    assert report["control"]["n_action_steps"] == 12
    code, _, err, report = _bench(policies, "chunk_of", tmp_path, capsys, *extra)
    assert code == 0 and report["control"]["n_action_steps"] == 16, err


def test_a_call_of_b_chunks_must_return_b_chunks_reported_after_the_timed_calls(policies, tmp_path, capsys):
    code, out, err, report = _bench(policies, "ignores_the_batch", tmp_path, capsys, "--chunks-per-call", "1,4")
    assert code == 2 and "4 timed calls (ms)" in out and report["chunks_per_call"] is None
    assert _one_line(err).endswith(
        "warm-up call 1 of 4 chunks (num_steps=10) returned shape (1, 8, 4), expected shape (4, 8, 4): 4 chunks "
        "of shape (1, 8, 4)"
    )
    assert report["failure"] == _one_line(err).removeprefix("scopebench bench-inference: ")


def test_a_call_of_b_chunks_out_of_memory_is_named(policies, tmp_path, capsys):
    code, out, err, report = _bench(policies, "out_of_memory_above", tmp_path, capsys, "--chunks-per-call", "1,2,4")
    assert code == 2 and "4 timed calls (ms)" in out
    assert _one_line(err).endswith(
        "--chunks-per-call 4: a call of 4 chunks ran out of memory on cpu (CUDA out of memory. Tried to allocate "
        "20.00 GiB)"
    )


def test_chunks_per_call_whose_inputs_cannot_fit_are_refused_before_any_call(policies, tmp_path, capsys):
    marker = tmp_path / "called"
    # 10^9 observations of 3 x 224 x 224 floats: 602 TB
    args = ["--policy-arg", f"marker={marker}", "--chunks-per-call", "1,1000000000"]
    code, out, err, report = _bench(policies, "marks_its_calls", tmp_path, capsys, *args)
    assert code == 2 and out == "" and report is None and not marker.exists()
    line = _one_line(err)
    assert re.search(
        r"--chunks-per-call 1000000000: a call of 1000000000 chunks needs 602112\.0 GB on cpu for its inputs alone "
        r"\(1000000000 x the 602\.1 kB of one observation\) but [\d.]+ GB are available: at most \d+ chunks a call "
        r"fit$",
        line,
    ), line


# -- the check itself ------------------------------------------------------------------------------


def test_the_check_counts_nan_and_inf_in_every_floating_tensor_and_ignores_integers():
    from scopebench.policy.run.chunks import ChunkCheck, NonFiniteActionsError, batch_bytes

    check = ChunkCheck("policy p: ", None)
    output = {"actions": torch.tensor([[[1.0, float("inf")]]]), "ids": torch.tensor([[1, 2]]), "text": "go"}
    output["actions"][0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteActionsError, match=r"^policy p: call 2 \(num_steps=3\) returned non-finite actions: "):
        check(output, call="call 2", num_steps=3)
    check({"ids": torch.tensor([[1, 2]])}, call="call 3", num_steps=4)
    with pytest.raises(PolicyError, match=r"returned an output shaped \{'ids': \(1, 3\)\}, expected an output shaped"):
        check({"ids": torch.tensor([[1, 2, 3]])}, call="call 4", num_steps=4)
    assert batch_bytes(output) == 2 * 4 + 2 * 8 and check.actions == {}  # a dict says nothing of its actions
