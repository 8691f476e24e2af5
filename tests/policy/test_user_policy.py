"""User policies: bad factories refused in one line, and every policy tool, ``Pi05Train`` under
benchopt and the four backends on the ``examples/`` policy and on Hugging Face's PaliGemma."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from scopebench.cli import main

from .conftest import TINY
from .helpers import TRAIN_PHASES

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = f"{REPO}/examples/flow_policy.py:make_policy"
PALIGEMMA = "scopebench.policy.paligemma:make_paligemma_policy"
#: The keys of profile-step's ``phases``, for pi05 and any policy alike.
STEP_PHASES = {*TRAIN_PHASES, "backward_step", "total"}

BAD_POLICIES = """
import torch
from scopebench.policy import UserPolicy


def raises():
    raise RuntimeError("boom in the factory")


def not_a_policy():
    return torch.nn.Linear(2, 1)


def _policy(loss, size=8, **extra):
    data = torch.utils.data.TensorDataset(torch.randn(size, 2))
    return UserPolicy(model=torch.nn.Linear(2, 1), loss=loss, dataset=data, **extra)


def vector_loss():
    return _policy(lambda model, batch: model(batch[0]).flatten())


def detached_loss():
    return _policy(lambda model, batch: model(batch[0]).sum().detach())


def detached_loss_with_flops():  # no FLOP count before training: refused at the first step
    return _policy(lambda model, batch: model(batch[0]).sum().detach(), flops_per_sample=6)


def empty():
    return _policy(lambda model, batch: model(batch[0]).sum(), size=0)


def no_sample():
    return _policy(lambda model, batch: model(batch[0]).sum())


def no_parameter():
    return UserPolicy(
        model=torch.nn.ReLU(),
        loss=lambda model, batch: model(batch[0]).sum(),
        dataset=torch.utils.data.TensorDataset(torch.randn(8, 2)),
        flops_per_sample=6,  # no loss check before training: torch's optimizer saw no parameter
    )


class _Mismatch(torch.nn.Linear):
    def forward(self, x):
        raise RuntimeError("shape mismatch: (2, 2) against (3,)\\nsecond line of the message")


def forward_raises():
    return UserPolicy(
        model=_Mismatch(2, 1),
        loss=lambda model, batch: model(batch[0]).sum(),
        dataset=torch.utils.data.TensorDataset(torch.randn(8, 2)),
    )


def text_term():
    return _policy(lambda model, batch: (model(batch[0]).sum(), {"mse": "high"}))


class _Missing(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == 5:  # the FLOP count reads sample 0: the loader meets this one
            raise KeyError(f"sample {index} is missing")
        return (torch.randn(2),)


def dataset_raises():
    return UserPolicy(model=torch.nn.Linear(2, 1), loss=lambda model, batch: model(batch[0]).sum(), dataset=_Missing())


class _TwoParts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = torch.nn.Linear(2, 2)
        self.head = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.head(self.lm(x))


def calls_a_submodule(**extra):  # trains on one rank without the check; DDP's wrapper has no lm
    return UserPolicy(
        model=_TwoParts(),
        loss=lambda model, batch: model.head(model.lm(batch[0])).sum(),
        dataset=torch.utils.data.TensorDataset(torch.randn(8, 2)),
        **extra,
    )


def calls_a_submodule_at_the_first_step():  # no FLOP count: the first call is the first step's
    return calls_a_submodule(flops_per_sample=6)
"""


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policies") / "bad_policies.py"
    path.write_text(BAD_POLICIES)
    return str(path)


def _tool(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("factory", "tool", "line"),
    [
        ("nosuchmodule_xyz:make", "profile-step", r"policy nosuchmodule_xyz:make: no module named 'nosuchmodule_xyz'"),
        (f"{PALIGEMMA[:-22]}:nope", "profile-step", r"module scopebench\.policy\.paligemma has no function 'nope'"),
        ("{bad}:not_a_policy", "profile-step", r"policy factory .*:not_a_policy returned Linear, not a scopebench"),
        (
            "{bad}:vector_loss",
            "profile-step",
            r"loss\(model, batch\) returned a tensor of shape \(1,\); expected a scalar",
        ),
        ("{bad}:detached_loss", "find-unused-params", r"loss\(model, batch\) returned a tensor without grad"),
        ("{bad}:detached_loss_with_flops", "profile-step", r"loss\(model, batch\) returned a tensor without grad"),
        ("{bad}:empty", "profile-dataloader", r"policy .*:empty: UserPolicy\.dataset has length 0"),
        ("{bad}:no_sample", "bench-inference", r"bench-inference needs UserPolicy\.sample, which this policy"),
        ("{bad}:no_sample", "decompose-latency", r"decompose-latency needs UserPolicy\.sample"),
        (
            "{bad}:no_parameter",
            "profile-step",
            r"policy .*:no_parameter: model ReLU has no parameter: training needs at least one trainable parameter$",
        ),
        ("{bad}:no_parameter", "train", r"policy .*:no_parameter: model ReLU has no parameter: training needs"),
        ("{bad}:no_parameter", "find-unused-params", r"policy .*:no_parameter: model ReLU has no parameter"),
        (
            "{bad}:forward_raises",
            "profile-step",
            r"policy .*:forward_raises: forward raised RuntimeError: shape mismatch: \(2, 2\) against \(3,\) \.\.\.$",
        ),
        ("{bad}:forward_raises", "train", r"policy .*:forward_raises: forward raised RuntimeError: shape mismatch"),
        ("{bad}:forward_raises", "find-unused-params", r"policy .*:forward_raises: forward raised RuntimeError"),
        ("{bad}:vector_loss", "train", r"loss\(model, batch\) returned a tensor of shape \(1,\); expected a scalar"),
        (
            "{bad}:text_term",
            "profile-step",
            r"policy .*:text_term: loss term 'mse' is 'high' \(str\); expected a float or a 0-d tensor$",
        ),
        (
            "{bad}:dataset_raises",
            "profile-step",
            r"policy .*:dataset_raises: dataset\[5\] raised KeyError: 'sample 5 is missing'$",
        ),
        (
            "{bad}:dataset_raises",
            "profile-dataloader",
            r"policy .*:dataset_raises: dataset\[5\] raised KeyError: 'sample 5 is missing'$",
        ),
        *[
            (
                f"{{bad}}:{factory}",
                tool,
                r"policy .*:calls_a_submodule\w*: loss\(model, batch\) never called model\(\.\.\.\): it must",
            )
            for factory in ("calls_a_submodule", "calls_a_submodule_at_the_first_step")
            for tool in ("profile-step", "train")
        ],
    ],
)
def test_a_bad_factory_is_refused_in_one_line_naming_it(bad, factory, tool, line, capsys, tmp_path):
    extra = {"profile-step": ["--steps", "2", "--warmup", "0"], "profile-dataloader": ["--batches", "2"]}
    extra["bench-inference"] = ["--output-dir", str(tmp_path)]
    extra["train"] = ["--steps", "1", "--output_dir", str(tmp_path / "run")]
    code, _, err = _tool([tool, "--config", TINY, "--policy", factory.format(bad=bad), *extra.get(tool, [])], capsys)
    assert code == 2, err
    assert err.count("\n") == 1, err  # one line
    assert err.startswith(f"scopebench {tool}: ") and re.search(line, err), err


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["calls_a_submodule", "calls_a_submodule_at_the_first_step"])
def test_a_loss_that_bypasses_the_wrapper_is_named_on_two_ranks_too(bad, factory, capsys):
    """On two ranks the loss meets DDP's wrapper (which has no ``lm``) or, with the FLOP count
    first, the bare model: either way one line naming the contract, rank 0's own refusal (it
    was rank 1's ``AttributeError`` traceback in the launcher's report)."""
    args = ["profile-step", "--config", TINY, "--policy", f"{bad}:{factory}", "--nproc-per-node", "2"]
    code, _, err = _tool([*args, "--steps", "2", "--warmup", "0"], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(
        r"loss\(model, batch\) (never called model|called model\.\w+)\(\.\.\.\): it must call model", err
    ), err


def test_a_collective_s_error_in_the_forward_passes_as_it_is_for_the_rank_failure_report():
    """gloo raises a peer's timeout as a plain RuntimeError from ``work.wait()`` in
    ``distributed_c10d.py`` (FSDP2 all-gathers in the forward's pre-hook): not the policy's
    error, so it is not turned into a ``forward raised`` line; the run's failure path names
    the rank. The same error raised by the policy's own code is still its line."""
    from scopebench.policy.calls import policy_loss
    from scopebench.policy.user import UserPolicy

    space: dict = {}
    raising = "def wait():\n    raise RuntimeError('Timed out waiting 30000ms for send operation to complete')\n"
    exec(compile(raising, "/venv/lib/torch/distributed/distributed_c10d.py", "exec"), space)  # noqa: S102
    exec(compile(raising, "/home/user/mypolicy.py", "exec"), ours := {})  # noqa: S102
    # The ledger wraps Work.wait: the error then comes from its wrapper, called by c10d.
    exec(compile(raising, "/repo/src/scopebench/profiler/collectives.py", "exec"), wrapper := {})  # noqa: S102
    calling = "def wait():\n    inner()\n"
    exec(
        compile(calling, "/venv/lib/torch/distributed/distributed_c10d.py", "exec"), c10d := {"inner": wrapper["wait"]}
    )  # noqa: S102

    class Net(torch.nn.Module):
        def __init__(self, wait):
            super().__init__()
            self.wait = wait
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            self.wait()
            return self.lin(x).sum()

    for wait, passes in ((space["wait"], True), (ours["wait"], False), (c10d["wait"], True), (wrapper["wait"], False)):
        model = Net(wait)
        policy = UserPolicy(model=model, loss=lambda m, batch: m(batch), dataset=[1])
        with pytest.raises((RuntimeError, ValueError)) as raised:
            policy_loss(policy, model, torch.randn(1, 2))
        assert isinstance(raised.value, ValueError) is not passes, raised.value
        if not passes:
            assert "forward raised RuntimeError: Timed out waiting" in str(raised.value)


def test_the_policy_s_own_exception_is_chained_under_the_line_and_comes_back_from_a_worker(bad):
    """The one line for the commands, the original exception for a debugger (``__cause__``);
    from a DataLoader worker, the line is taken back from the worker's traceback."""
    from scopebench.policy.calls import make_policy_loader, policy_loss
    from scopebench.policy.user import PolicyDataError, build_policy

    policy = build_policy(f"{bad}:forward_raises")
    with pytest.raises(ValueError) as raised:
        policy_loss(policy, policy.model, (torch.randn(2, 2),))
    assert str(raised.value).startswith(f"policy {bad}:forward_raises: forward raised RuntimeError: shape mismatch")
    assert isinstance(raised.value.__cause__, RuntimeError) and "second line" in str(raised.value.__cause__)
    policy = build_policy(f"{bad}:dataset_raises")
    for workers in (0, 1):
        with pytest.raises(PolicyDataError) as raised:
            list(make_policy_loader(policy, 4, num_workers=workers))
        assert str(raised.value) == f"policy {bad}:dataset_raises: dataset[5] raised KeyError: 'sample 5 is missing'"
        if workers:
            assert 'raise KeyError(f"sample {index} is missing")' in raised.value.worker_traceback
        else:
            assert isinstance(raised.value.__cause__, KeyError)


def test_a_raising_factory_is_named_above_its_traceback(bad, capsys):
    code, _, err = _tool(["profile-step", "--config", TINY, "--policy", f"{bad}:raises"], capsys)
    first, _, rest = err.partition("\n")
    assert code == 2
    assert first == f"scopebench profile-step: policy factory {bad}:raises raised RuntimeError: boom in the factory"
    assert rest.startswith("Traceback (most recent call last):") and 'raise RuntimeError("boom in the factory")' in rest


def test_policy_args_and_names_are_validated_before_any_work(capsys):
    code, _, err = _tool(["profile-step", "--config", TINY, "--policy", "mypkg"], capsys)
    assert code == 2 and "policy must be pi05 or a factory module:function" in err
    code, _, err = _tool(["profile-step", "--config", TINY, "--policy-arg", "hidden"], capsys)
    assert code == 2 and "--policy-arg expects key=value" in err
    code, _, err = _tool(
        ["profile-step", "--config", TINY, "--policy", EXAMPLE, "--gradient_checkpointing=true"], capsys
    )
    assert code == 2 and "gradient_checkpointing=true applies to policy pi05 only" in err


def test_the_policy_key_is_a_factory_or_the_inference_section_naming_one(tmp_path):
    from scopebench.policy.settings import load_run_config

    (tmp_path / "a.yml").write_text("policy: mypkg.policies:make\npolicy_args: {hidden: 8}\n")
    (tmp_path / "b.yml").write_text("policy: {factory: mypkg.policies:make, num_steps: 3}\n")
    a, b = load_run_config(tmp_path / "a.yml"), load_run_config(tmp_path / "b.yml")
    assert (a.train.policy, a.train.policy_args, a.inference.policy) == (
        "mypkg.policies:make",
        {"hidden": 8},
        a.train.policy,
    )
    assert (b.train.policy, b.inference.num_steps) == ("mypkg.policies:make", 3)
    (tmp_path / "c.yml").write_text(a.to_yaml())  # train_config.yaml: the factory inside the section
    c = load_run_config(tmp_path / "c.yml", [("policy_args.layers", 2)])
    assert (c.train.policy, c.train.policy_args) == ("mypkg.policies:make", {"hidden": 8, "layers": 2})
    assert load_run_config(TINY).train.policy == "pi05"
    with pytest.raises(ValueError, match="policy_args must be empty with policy pi05"):
        load_run_config(TINY, [("policy_args.hidden", 8)])


def test_fsdp2_default_units_are_the_children_with_parameters_of_their_own():
    from torch import nn

    from scopebench.train.fsdp import _default_units, _given_units

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.body, self.norm = nn.Embedding(10, 4), nn.Sequential(nn.Linear(4, 4)), nn.Identity()
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight  # tied: both stay in the root

    model = Tied()
    assert [name for name, _ in _default_units(model)] == ["body"]
    assert [name for name, _ in _given_units(model, [model.body, model.body[0]])] == ["body.0", "body"]


def test_one_rank_fsdp2_shards_a_user_policy_by_default():
    from torch.distributed.tensor import DTensor

    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings

    run = PolicyTrainRun(TrainSettings(policy=EXAMPLE, backend="fsdp2"), dataset_root="", chunk_size=8)
    with run:
        run.loop(lambda: run.work.steps < 2)
        assert run.fsdp_units == ["net"] and all(isinstance(p, DTensor) for p in run.work.model.parameters())
        assert math.isfinite(run.metrics()["train_loss"])


# -- the examples/ policy, one rank -----------------------------------------------------------


def test_every_tool_runs_the_example_policy(tmp_path, capsys):
    args = ["--config", TINY, "--policy", EXAMPLE, "--policy-arg", "hidden=16"]
    code, out, err = _tool(
        ["profile-step", *args, "--steps", "3", "--warmup", "1", "--json", f"{tmp_path}/s.json"], capsys
    )
    assert code == 0, err
    step = json.loads((tmp_path / "s.json").read_text())
    assert set(step["phases"]) == STEP_PHASES and step["measured"] == 3
    assert step["settings"]["policy"] == EXAMPLE and step["settings"]["policy_args"] == {"hidden": 16}
    assert step["mfu"]["achieved_flops_per_sec"] > 0  # FLOPs counted by FlopCounterMode
    assert "dataload_wait" in out and "backward_step" in out
    code, _, err = _tool(["find-unused-params", *args, "--json", f"{tmp_path}/u.json"], capsys)
    unused = json.loads((tmp_path / "u.json").read_text())
    assert code == 0 and unused["unused"] == [] and unused["safe_without_find_unused"], err
    code, _, err = _tool(
        ["profile-dataloader", *args, "--batches", "3", "--warmup", "1", "--json", f"{tmp_path}/d.json"], capsys
    )
    loader = json.loads((tmp_path / "d.json").read_text())
    assert code == 0 and loader["measured"] == 3 and loader["cluster_samples_per_sec"] > 0, err
    bench = ["bench-inference", *args, "--n-timed", "3", "--n-warmup", "1", "--output-dir", str(tmp_path)]
    code, out, err = _tool([*bench, "--json", f"{tmp_path}/b.json"], capsys)
    inference = json.loads((tmp_path / "b.json").read_text())
    assert code == 0 and set(inference["phases"]) == {"preprocess", "denoise", "postprocess"}, err  # no prefill
    assert inference["n_timed"] == 3 and f"policy={EXAMPLE}" in out
    decompose = ["decompose-latency", *args, "--num-steps", "1,3", "--repeats", "2", "--policy.n_warmup=1"]
    code, _, err = _tool([*decompose, "--json", f"{tmp_path}/l.json"], capsys)
    latency = json.loads((tmp_path / "l.json").read_text())
    assert code == 0 and latency["num_steps"] == [1, 3] and set(latency["denoise_sec"]) == {"1", "3"}, err


LATENCY_POLICIES = """
import torch
from scopebench.policy import UserPolicy


def _policy(sample):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8, 256))
    return UserPolicy(
        model=torch.nn.Linear(256, 256),
        loss=lambda model, batch: model(batch[0]).sum(),
        dataset=data,
        sample=sample,
        observation=lambda batch_size: torch.randn(256, 256),  # a step: a 256 x 256 matmul
    )


def constant():  # the call ignores num_steps: four layers whatever N
    def sample(model, obs, num_steps):
        for _ in range(4):
            obs = torch.tanh(model(obs))
        return obs

    return _policy(sample)


def growing():  # one layer per step
    def sample(model, obs, num_steps):
        for _ in range(num_steps):
            obs = torch.tanh(model(obs))
        return obs

    return _policy(sample)
"""


@pytest.fixture(scope="module")
def latency_policies(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policies") / "latency_policies.py"
    path.write_text(LATENCY_POLICIES)
    return str(path)


def test_decompose_latency_fits_no_line_to_a_call_that_ignores_num_steps(latency_policies, tmp_path, capsys):
    """12 rounds of two N: whatever the noise, the calls' order in the rounds cannot reach the
    rule's z (at most sqrt(12) = 3.46 < 3.719), so the verdict is certain; the rule itself is
    tested on given calls in test_inference_run.py."""
    args = ["decompose-latency", "--config", TINY, "--policy", f"{latency_policies}:constant"]
    code, out, err = _tool([*args, "--num-steps", "1,8", "--repeats", "12", "--json", f"{tmp_path}/l.json"], capsys)
    report = json.loads((tmp_path / "l.json").read_text())
    assert code == 0, err
    assert report["fit_applies"] is False and report["expert_share"] is None and report["fit_reason"]
    assert f"the fit does not apply: {report['fit_reason']}" in out and "expert loop" not in out


def test_decompose_latency_still_fits_a_call_that_grows_with_num_steps(latency_policies, tmp_path, capsys):
    args = ["decompose-latency", "--config", TINY, "--policy", f"{latency_policies}:growing", "--policy.n_warmup=1"]
    code, out, err = _tool([*args, "--num-steps", "1,2,4,8", "--repeats", "15", "--json", f"{tmp_path}/l.json"], capsys)
    report = json.loads((tmp_path / "l.json").read_text())
    assert code == 0, err
    assert report["fit_applies"] is True and report["fit_reason"] is None, report["trend_z"]
    assert report["per_step_sec"] > 0 and 0 < report["expert_share"] < 1.5
    assert "at N=8: expert loop" in out and "does not apply" not in out


def _loads_its_model(checkpoint: Path) -> None:
    """``load_policy`` rebuilds a user policy's model from the recorded factory and arguments
    (it raised ``KeyError: 'preset'``) and loads the trained weights exactly."""
    from safetensors.torch import load_file

    from scopebench.policy.checkpoint import load_policy

    model = load_policy(checkpoint)
    weights = load_file(str(checkpoint / "model.safetensors"))
    assert type(model).__name__ == "FlowPolicy" and model.state_dict().keys() == weights.keys()
    assert all(torch.equal(value, weights[key]) for key, value in model.state_dict().items())
    copy = Path(shutil.copytree(checkpoint, checkpoint.parent.parent / "copy" / checkpoint.name))
    (copy / "policy_config.json").write_text('{"hidden": 8}')
    with pytest.raises(ValueError, match=r"policy_config\.json must hold pi05's 'preset' and 'config' or a user"):
        load_policy(copy)


def test_train_saves_a_user_policy_and_refuses_to_resume_it_as_another(tmp_path, capsys):
    args = ["train", "--config", TINY, "--policy", EXAMPLE, "--policy-arg", "hidden=8", "--output_dir", str(tmp_path)]
    code, out, err = _tool([*args, "--steps", "2", "--log_freq", "1"], capsys)
    assert code == 0 and f"policy={EXAMPLE}" in out and "step 2/2" in out, err
    saved = json.loads((tmp_path / "checkpoints" / "000002" / "policy_config.json").read_text())
    assert saved == {"policy": EXAMPLE, "policy_args": {"hidden": 8}}
    _loads_its_model(tmp_path / "checkpoints" / "000002")
    resume = ["train", "--config", str(tmp_path / "checkpoints" / "000002" / "train_config.yaml"), "--resume", "true"]
    code, _, err = _tool([*resume, "--steps", "3", "--policy-arg", "hidden=16"], capsys)
    assert code == 2 and "policy_args" in err, err  # another model: not an exact resume
    code, out, err = _tool([*resume, "--steps", "3"], capsys)
    assert code == 0 and "resumed from" in out and "step 3/3" in out, err


# -- PaliGemma (transformers), one rank -------------------------------------------------------


@pytest.mark.slow
def test_find_unused_params_on_paligemma_matches_the_gradients(tmp_path, capsys):
    """The tool's UNUSED list is exactly the trainable parameters a forward + backward of the same
    first batch leaves without a gradient, computed here: SigLIP's pooling head, never called."""
    from scopebench.policy.calls import make_policy_loader, policy_loss, to_device
    from scopebench.policy.user import build_policy

    code, out, err = _tool(
        ["find-unused-params", "--config", TINY, "--policy", PALIGEMMA, "--json", f"{tmp_path}/u.json"], capsys
    )
    assert code == 0, err
    reported = {entry["name"] for entry in json.loads((tmp_path / "u.json").read_text())["unused"]}
    policy = build_policy(PALIGEMMA, {}, seed=0)
    batch = to_device(next(iter(make_policy_loader(policy, 4, seed=0))), torch.device("cpu"))
    policy_loss(policy, policy.model, batch)[0].backward()
    no_grad = {n for n, p in policy.model.named_parameters() if p.requires_grad and p.grad is None}
    assert reported == no_grad and "model.vision_tower.head.probe" in reported
    assert all(".head." in name or name.endswith(".head.probe") for name in reported)


@pytest.mark.slow
def test_every_tool_runs_paligemma(tmp_path, capsys):
    args = ["--config", TINY, "--policy", PALIGEMMA, "--batch_size=2"]
    code, _, err = _tool(
        ["profile-step", *args, "--steps", "2", "--warmup", "1", "--json", f"{tmp_path}/s.json"], capsys
    )
    step = json.loads((tmp_path / "s.json").read_text())
    assert (
        code == 0 and set(step["phases"]) == STEP_PHASES and math.isfinite(step["phases"]["forward"]["mean_sec"])
    ), err
    code, _, err = _tool(["profile-dataloader", *args, "--batches", "2", "--warmup", "0"], capsys)
    assert code == 0, err
    bench = ["bench-inference", *args, "--n-timed", "2", "--n-warmup", "1", "--output-dir", str(tmp_path)]
    code, _, err = _tool([*bench, "--policy.num_steps=3", "--json", f"{tmp_path}/b.json"], capsys)
    assert code == 0 and json.loads((tmp_path / "b.json").read_text())["n_timed"] == 2, err
    decompose = ["decompose-latency", *args, "--num-steps", "1,2", "--repeats", "1", "--policy.n_warmup=1"]
    code, _, err = _tool(decompose, capsys)
    assert code == 0, err


@pytest.mark.slow
def test_paligemma_samples_exactly_num_steps_greedy_tokens():
    from scopebench.policy.run.inference import InferenceRun
    from scopebench.policy.settings import InferenceSettings

    settings = InferenceSettings(policy=PALIGEMMA, n_warmup=1, num_steps=3)
    with InferenceRun(settings, dataset_root="", chunk_size=8) as run:
        first = run.actions  # the warm-up call's
        run.timed_call(3)
    assert first.shape == (1, 3) and first.dtype == torch.long
    assert torch.equal(run.actions, first)  # greedy: the same tokens every call


# -- Pi05Train / Pi05Inference / Pi05Dataloader under benchopt --------------------------------


@pytest.mark.slow
def test_the_solvers_run_user_policies_under_benchopt(tmp_path):
    from scopebench.runs import run_benchopt

    config = tmp_path / "user_policies.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "dataset": ["synthetic_robot"],
                "solver": [
                    {"Pi05Train": {"policy": [EXAMPLE, PALIGEMMA], "batch_size": [2]}},
                    {"Pi05Inference": {"policy": [PALIGEMMA], "n_warmup": [1], "num_steps": [2]}},
                    {"Pi05Dataloader": {"policy": [EXAMPLE], "policy_args": [{"size": 32}]}},
                ],
                "max-runs": 2,
                "n-repetitions": 1,
                "timeout": 600,
            }
        )
    )
    df = pd.read_parquet(run_benchopt(REPO, config, output=tmp_path / "user.parquet").parquet)
    for policy in (EXAMPLE, PALIGEMMA):
        train = df[df.solver_name.str.startswith("Pi05Train") & df.solver_name.str.contains(policy, regex=False)]
        recorded = train[train["objective_total_time_sec"].notna()]
        assert len(train) == 3 and len(recorded) == 2, policy
        for phase in TRAIN_PHASES:
            assert (recorded[f"objective_{phase}_time_sec"] > 0).all(), (policy, phase)
        assert train["objective_val_loss"].map(math.isfinite).all() and recorded["objective_train_loss"].notna().all()
    infer = df[df.solver_name.str.startswith("Pi05Inference")]
    recorded = infer[infer["objective_total_time_sec"].notna()]
    assert len(recorded) == 2 and recorded["objective_denoise_time_sec"].notna().all()
    assert (recorded["objective_value"] == recorded["objective_step_time_sec"]).all()  # seconds per call
    loader = df[df.solver_name.str.startswith("Pi05Dataloader")]
    assert loader[loader["objective_total_time_sec"].notna()]["objective_fetch_time_sec"].notna().all()


# -- two gloo ranks, every backend ------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """:mod:`user_policy_driver` on two ranks: (output folder, [facts of rank 0, of rank 1])."""
    out = tmp_path_factory.mktemp("user_policies")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [str(Path(__file__).with_name("user_policy_driver.py")), str(out)],
        capture_output=True,
        text=True,
        timeout=560,  # the driver dumps its stacks and ends at 480 s: its output is then in the failure
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    return out, [json.loads((out / f"facts_rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "zero2", "zero3", "fsdp2"])
def test_paligemma_trains_on_two_ranks_under_every_backend(two_ranks, backend):
    _, facts = two_ranks
    seen = [rank_facts["paligemma"][backend] for rank_facts in facts]
    for rank in seen:
        assert rank["world_size"] == 2 and rank["accelerate_num_processes"] == 2 and rank["steps"] == 1
        assert set(TRAIN_PHASES) <= set(rank["phases"]) and math.isfinite(rank["train_loss"])
        assert rank["flops_per_sample"] > 0
    assert seen[0]["val_loss"] == seen[1]["val_loss"] and math.isfinite(seen[0]["val_loss"])
    if backend == "fsdp2":  # the policy's shard_modules: every SigLIP and Gemma layer
        assert {"model.language_model.layers.0", "model.language_model.layers.1"} <= set(seen[0]["units"])
        assert sum(".encoder.layers." in name for name in seen[0]["units"]) == 2


@pytest.mark.slow
def test_the_example_trains_on_two_ranks_and_resumes_exactly(two_ranks):
    from safetensors.torch import load_file

    out, facts = two_ranks
    assert all(rank_facts["example"]["world_size"] == 2 for rank_facts in facts)
    train = facts[0]["train"]
    assert train["resumed"]["start_step"] == 2 and train["resumed"]["steps"] == train["full"]["steps"] == 4
    full = load_file(str(out / "train" / "full" / "checkpoints" / "000004" / "model.safetensors"))
    resumed = load_file(str(out / "train" / "resumed" / "checkpoints" / "000004" / "model.safetensors"))
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)
