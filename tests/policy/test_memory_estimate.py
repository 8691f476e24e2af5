"""Memory before launch: model states per backend, activations from a fake forward, checked
against torch's own ``MemTracker`` on a real step; the batch refusal; ``estimate-memory``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from scopebench.cli import main
from scopebench.policy.memory import full_batch, largest_batch, training_memory
from scopebench.policy.pi05.config import make_config
from scopebench.train.backends import backend_names, model_state_bytes
from scopebench.train.memory import GB

from .conftest import TINY


def _measured(preset: str, batch_size: int) -> dict[str, float]:
    """Bytes by category at the peak of a real fp32 training step (second iteration), per MemTracker."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from scopebench.policy import make_policy

    torch.manual_seed(0)
    model = make_policy(preset)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = full_batch(model.config, batch_size)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    for iteration in range(2):  # the first creates AdamW's state
        with tracker:
            noise = torch.randn_like(batch["actions"])
            loss, _ = model(batch, noise=noise, time=torch.full((batch_size,), 0.5))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        if iteration == 0:
            tracker.reset_mod_stats()  # it refuses a second iteration otherwise
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return {str(k).rsplit(".", 1)[-1]: v for k, v in peak.items()}


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_the_estimate_matches_memtracker_on_a_real_step(preset):
    measured = _measured(preset, 4)
    estimate = training_memory(make_config(preset), batch_size=4, backend="ddp")
    assert estimate["parameters"] == pytest.approx(measured["PARAM"], rel=0.02)  # 4 bytes per parameter
    assert estimate["optimizer_state"] == pytest.approx(measured["OPT"], rel=0.02)  # AdamW's two moments
    assert abs(estimate["activations"] / measured["ACT"] - 1) <= 0.10, (estimate["activations"], measured)
    assert abs(estimate["peak"] / measured["Total"] - 1) <= 0.10, (estimate["peak"], measured)


def test_activations_grow_linearly_with_the_batch():
    from scopebench.policy.memory import _activations
    from scopebench.stats import linear_fit

    config = make_config("tiny")
    sizes = [1, 3, 5, 8]
    values = [float(_activations(config, b)[0]) for b in sizes]
    intercept, slope = linear_fit(sizes, values)
    mean = sum(values) / len(values)
    residual = sum((v - (intercept + slope * b)) ** 2 for b, v in zip(sizes, values))
    r2 = 1 - residual / sum((v - mean) ** 2 for v in values)
    assert slope > 0 and r2 >= 0.98, (values, r2)
    line = training_memory(config, batch_size=5, backend="ddp")
    assert line["activations"] == pytest.approx(_activations(config, 5)[0], rel=1e-6)


def test_gradient_checkpointing_lowers_the_estimated_activations():
    plain = training_memory(make_config("small"), batch_size=4, backend="ddp")["activations"]
    recompute = training_memory(make_config("small", gradient_checkpointing=True), batch_size=4, backend="ddp")
    assert recompute["activations"] < 0.6 * plain


def test_model_states_follow_each_backends_sharding():
    n = 1_000_000
    assert model_state_bytes(n, backend="ddp", world_size=4) == {
        "parameters": 4e6,
        "gradients": 4e6,
        "optimizer_state": 8e6,
    }
    # DeepSpeed: gradients sharded from ZeRO-2 on, and an fp32 master copy beside AdamW's moments.
    assert model_state_bytes(n, backend="zero2", world_size=4) == {
        "parameters": 4e6,
        "gradients": 1e6,
        "optimizer_state": 3e6,
    }
    assert model_state_bytes(n, backend="zero3", world_size=4)["optimizer_state"] == 3e6
    for backend in ("zero3", "fsdp2"):
        states = model_state_bytes(n, backend=backend, world_size=4)
        assert states["parameters"] == states["gradients"] == 1e6
    assert model_state_bytes(n, backend="fsdp2", world_size=4)["optimizer_state"] == 2e6


def test_zero1_shards_the_optimizer_state_alone():
    """ZeRO-1: weights and gradients whole on every rank (2 bytes each under bf16, DeepSpeed's
    bf16 mode), the optimizer state (master copy and AdamW's moments) over the ranks."""
    n = 1_000_000
    assert model_state_bytes(n, backend="zero1", world_size=4) == {
        "parameters": 4e6,
        "gradients": 4e6,
        "optimizer_state": 3e6,
    }
    assert model_state_bytes(n, backend="zero1", world_size=4, precision="bf16") == {
        "parameters": 2e6,
        "gradients": 2e6,
        "optimizer_state": 3e6,
    }


@pytest.mark.parametrize("backend", backend_names())
def test_estimate_memory_takes_every_backend_of_the_registry(tmp_path, capsys, backend):
    """A backend added as one module is in ``estimate-memory``: its model states as it holds them,
    its buffers, the peak."""
    from scopebench.train.backends import get_backend

    out = tmp_path / "estimate.json"
    args = ["--backend", backend, "--nproc-per-node", "2", "--batch-size", "4", "--json", str(out)]
    assert main(["estimate-memory", "--config", TINY, *args]) == 0
    payload = json.loads(out.read_text())
    assert payload["backend"] == backend and f"backend={backend} ranks=2" in capsys.readouterr().out
    states = get_backend(backend).model_state_bytes(payload["num_params"], world_size=2)
    assert {key: payload["bytes"][key] for key in states} == states
    assert payload["bytes"]["peak"] > sum(states.values())


def test_a_batch_that_cannot_fit_is_refused_naming_batch_size(monkeypatch):
    import scopebench.train.memory as memory
    from scopebench.policy.run.checks import training_memory_check
    from scopebench.policy.settings import TrainSettings

    config = make_config("tiny")
    settings = TrainSettings(batch_size=64)
    peak = training_memory(config, batch_size=64, backend="ddp")["peak"]
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: int(peak) + 1)
    training_memory_check(settings, config=config)  # just fits
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: int(peak) - 1)
    with pytest.raises(ValueError, match=r"^batch_size=64 needs at least .* activations for 64 samples per rank"):
        training_memory_check(settings, config=config)
    training_memory_check(settings)  # without the model config: model states only, which fit


def test_estimate_memory_prints_the_categories_and_the_largest_batch_that_fits(tmp_path, capsys):
    out = tmp_path / "memory.json"
    code = main(["estimate-memory", "--config", TINY, "--backend", "fsdp2", "--nproc-per-node", "2", "--batch-size", "4"]
                + ["--memory-gb", "0.05", "--json", str(out)])  # fmt: skip
    assert code == 0
    text, err = capsys.readouterr()
    assert "deprecated" not in err
    assert "backend=fsdp2 ranks=2 batch_size=4" in text and "largest per-rank batch that fits" in text
    report = json.loads(out.read_text())
    assert report["tool"] == "estimate-memory" and report["world_size"] == 2 and report["fits"] is True
    best = report["largest_batch"]
    config = make_config("tiny")
    fits = training_memory(config, batch_size=best, backend="fsdp2", world_size=2)["peak"]
    over = training_memory(config, batch_size=best + 1, backend="fsdp2", world_size=2)["peak"]
    assert fits <= 0.05 * GB < over
    assert largest_batch(training_memory(config, batch_size=1, backend="fsdp2", world_size=2), 0.05 * GB) == best


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc-per-node", "0"], "--nproc-per-node must be an integer >= 1, got 0"),
        (["--memory-gb", "0"], "--memory-gb must be a finite number > 0, got 0"),
        (["--nproc", "0"], "--nproc-per-node must be an integer >= 1, got 0"),  # the old spelling
        (["--backend", "zero4"], "backend must be one of"),
    ],
)
def test_estimate_memory_refuses_bad_inputs_in_one_line(capsys, args, message):
    assert main(["estimate-memory", "--config", TINY, *args]) == 2
    err = capsys.readouterr().err.splitlines()
    refusal = err[-1]  # after the deprecation line of an old spelling
    assert refusal.startswith("scopebench estimate-memory: ") and message in refusal and "Traceback" not in refusal
    assert len(err) == (2 if args[0] == "--nproc" else 1), err


@pytest.mark.parametrize(
    ("old", "new"),
    [(["--nproc", "2"], ["--nproc-per-node", "2"]), (["--device-memory-gb", "0.05"], ["--memory-gb", "0.05"])],
)
def test_the_old_spellings_still_work_and_say_they_are_deprecated(tmp_path, capsys, old, new):
    # One vocabulary across the commands (issue 34): --memory-gb and --nproc-per-node.
    runs = {}
    for spelling in (old, new):
        out = tmp_path / f"{spelling[0].strip('-')}.json"
        assert main(["estimate-memory", "--config", TINY, *spelling, "--json", str(out)]) == 0
        runs[spelling[0]] = (capsys.readouterr(), json.loads(out.read_text()))
    (old_out, old_err), old_json = runs[old[0]]
    (new_out, new_err), new_json = runs[new[0]]
    assert old_err == f"scopebench estimate-memory: {old[0]} is deprecated, use {new[0]}\n" and new_err == ""
    assert old_json == new_json
    assert old_out.splitlines()[:-1] == new_out.splitlines()[:-1]  # all but "wrote <path>"


_OWN_PEAK = """
import resource, sys
from scopebench.cli import main
code = main(sys.argv[1:])
print("maxrss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def test_pi05_at_its_real_size_is_estimated_in_a_small_process():
    """3.35 B parameters, never allocated: the estimating process stays under 3 GB resident."""
    proc = subprocess.run(
        [sys.executable, "-c", _OWN_PEAK, "estimate-memory", "--config", TINY.replace("tiny", "pi05")]
        + ["--backend", "zero2", "--nproc-per-node", "8", "--batch-size", "16", "--memory-gb", "80"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "preset=pi05 (3.35 B parameters)" in proc.stdout
    peak_kb = int(proc.stdout.rsplit("maxrss_kb", 1)[1])  # ru_maxrss is in KB on Linux
    assert peak_kb < 3 * 1024 * 1024, peak_kb
