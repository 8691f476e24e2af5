"""The ``fsdp2`` backend: its accelerate file, one rank, checkpoints as data, faults, memory, compile.

Two-rank training, exact resume, consolidation, clipping and gradient accumulation under
``fsdp2`` are in ``test_backends.py`` (one torchrun launch for every backend).
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from scopebench.distributed import RankFailure
from scopebench.policy.run.train import PolicyTrainRun
from scopebench.policy.settings import TrainSettings, backend_conflict, load_run_config
from scopebench.policy.tools import StepCounter
from scopebench.train import load_accelerate_file, shipped_accelerate_file
from scopebench.train.fsdp import FSDPSettings, consolidated_model_state, shard_model

from .conftest import TINY

SMALL = str(Path(TINY).with_name("small.yml"))


def _config(robot_data, path=TINY, **train):
    overrides = [("backend", "fsdp2"), ("find_unused_params", False), ("dataset.cache_dir", robot_data[0].cache_dir)]
    return load_run_config(path, overrides + list(train.items()))


def _run(config, **kwargs):
    return PolicyTrainRun(
        config.train, dataset_root=config.dataset.materialize(), chunk_size=config.dataset.chunk_size, **kwargs
    )


# -- the accelerate file and the settings ------------------------------------------------


def test_the_shipped_file_selects_fsdp2_with_its_knobs():
    file = load_accelerate_file(shipped_accelerate_file("fsdp2"))
    assert file.backend.name == "fsdp2" and file.zero == {}
    # units None: the policy's shard_modules (pi05: DEFAULT_UNITS, see test_one_rank_shards_into_dtensors_and_leaves_no_group)
    assert file.fsdp == FSDPSettings(units=None, reshard_after_forward=True, offload_params=False)
    assert file.activation_checkpointing is False


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("fsdp_version", 1, "fsdp_config.fsdp_version in .*bad.yaml must be one of 2, got 1"),
        ("fsdp_reshard_after_forward", "yes", "fsdp_config.fsdp_reshard_after_forward in .*must be true or false"),
        ("fsdp_transformer_layer_cls_to_wrap", "", "fsdp_transformer_layer_cls_to_wrap in .*must name module classes"),
        ("fsdp_state_dict_type", "FULL_STATE_DICT", "fsdp_state_dict_type in .*must be one of 'SHARDED_STATE_DICT'"),
    ],
)
def test_a_bad_fsdp_knob_is_refused_naming_file_and_key(tmp_path, key, value, message):
    import yaml

    raw = yaml.safe_load(shipped_accelerate_file("fsdp2").read_text())
    raw["fsdp_config"][key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=message):
        load_accelerate_file(path)


def test_units_that_name_no_module_are_refused_with_the_model_classes(tiny):
    with pytest.raises(ValueError, match="JointLayerX names no module of the model; its classes are .*JointLayer"):
        shard_model(tiny, FSDPSettings(units=("JointLayerX",)), device=torch.device("cpu"), precision="fp32")


def test_fsdp2_allows_what_zero3_refuses():
    assert backend_conflict("fsdp2", True, False, world_size=2) is None  # gradient checkpointing
    assert backend_conflict("fsdp2", False, True, world_size=1) is None  # one rank, no optimizer
    assert "use backend=fsdp2 or zero2" in backend_conflict("zero3", True, False, world_size=2)
    TrainSettings(backend="fsdp2", gradient_checkpointing=True, torch_compile=True)


# -- one rank -----------------------------------------------------------------------------


def test_one_rank_shards_into_dtensors_and_leaves_no_group(robot_data):
    from torch.distributed.tensor import DTensor

    with _run(_config(robot_data)) as run:
        run.loop(StepCounter(2))
        assert all(isinstance(p, DTensor) for p in run.work.model.parameters())
        assert run.fsdp_units[-2:] == ["layers.0", "layers.1"] and "vision.patch_embed" in run.fsdp_units
        assert math.isfinite(run.metrics()["train_loss"]) and run.unwrapped_model is None
    assert not dist.is_initialized()  # the one-rank group the run made is gone


# -- checkpoints are data ----------------------------------------------------------------


class _Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_metadata_file_holding_code_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"
    folder = tmp_path / "ckpt" / "fsdp_model"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(pickle.dumps(_Planted(marker)))
    with pytest.raises(ValueError, match=r"\.metadata holds more than checkpoint metadata .*posix.system"):
        consolidated_model_state(tmp_path / "ckpt")
    assert not marker.exists()


def test_resuming_on_another_backend_names_the_conversion(tmp_path):
    from scopebench.train.checkpoint import load_checkpoint

    (tmp_path / "training_step.json").write_text(
        '{"step": 5, "epoch": 0, "position": 5, "backend": "fsdp2", "world_size": 2}'
    )
    for name in ("fsdp_model/.metadata", "random_states_0.pkl", "random_states_1.pkl"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ValueError, match="backend=fsdp2 on 2 rank.*this run has backend=ddp on 2.*convert-checkpoint"):
        load_checkpoint(None, tmp_path, world_size=2, backend="ddp")


# -- faults, as for the other backends ---------------------------------------------------


@pytest.mark.slow
def test_a_killed_rank_fails_an_fsdp2_run_naming_it(robot_data):
    run = _run(_config(robot_data, nproc_per_node=2))
    killed_at = []

    def callback() -> bool:
        if run.profiler.iteration == 3 and not killed_at:
            os.kill(run.session.worker_pids[0], signal.SIGKILL)
            killed_at.append(time.monotonic())
        return True

    with pytest.raises(RankFailure, match=r"^rank 1 died with SIGKILL after iteration 2($|\n)"):
        with run:
            run.loop(callback)
    assert time.monotonic() - killed_at[0] < 60
    assert not dist.is_initialized()


@pytest.mark.slow
def test_a_stopped_rank_fails_an_fsdp2_run_at_the_group_timeout(robot_data):
    # The timeout bounds every collective, the set-up barrier too: generous enough for one
    # rank to build its model well after the other on a busy machine.
    timeout = 30.0
    run = _run(_config(robot_data, nproc_per_node=2, group_timeout_sec=timeout))
    stopped_at = []

    def callback() -> bool:
        if run.profiler.iteration == 3 and not stopped_at:
            os.kill(run.session.worker_pids[0], signal.SIGSTOP)
            stopped_at.append(time.monotonic())
        return True

    with pytest.raises(RankFailure, match=r"^rank 1 is stopped \(SIGSTOP or a debugger\) after iteration 2"):
        with run:
            run.loop(callback)
    assert timeout <= time.monotonic() - stopped_at[0] < timeout + 30


# -- gradient checkpointing lowers the peak; compile runs per unit ------------------------

_PEAK = """
import json, sys
from scopebench.policy.run.train import PolicyTrainRun
from scopebench.policy.settings import load_run_config
from scopebench.policy.tools import StepCounter
config = load_run_config(sys.argv[1], [("backend", "fsdp2"), ("find_unused_params", False), ("batch_size", 8),
    ("dataset.cache_dir", sys.argv[2]), ("gradient_checkpointing", sys.argv[3] == "true")])
run = PolicyTrainRun(config.train, dataset_root=config.dataset.materialize(), chunk_size=config.dataset.chunk_size)
with run:
    run.loop(StepCounter(2))
    m = run.metrics()
print(json.dumps({"max_rss_mb": m["max_rss_mb"], "train_loss": m["train_loss"]}))
"""


@pytest.mark.slow
def test_gradient_checkpointing_under_fsdp2_keeps_the_loss_and_lowers_the_peak_on_small(robot_data):
    """Each setting in a fresh process (a process's peak RSS only grows): the same loss, a lower peak."""
    import json

    seen = {}
    for checkpointing in ("false", "true"):
        proc = subprocess.run(
            [sys.executable, "-c", _PEAK, SMALL, robot_data[0].cache_dir, checkpointing],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen[checkpointing] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert math.isclose(seen["true"]["train_loss"], seen["false"]["train_loss"], rel_tol=1e-5), seen
    assert seen["true"]["max_rss_mb"] < seen["false"]["max_rss_mb"], seen


@pytest.mark.slow
def test_torch_compile_under_fsdp2_compiles_each_unit_and_gives_the_eager_loss(robot_data):
    """Compiled units give the eager validation loss on the same weights (fixed noise), then train."""
    losses = {}
    for compiled in (False, True):
        run = _run(_config(robot_data, torch_compile=compiled), eval_batch_size=4)
        first = []

        def callback(run=run, first=first) -> bool:
            first.append(run.val_loss)
            return len(first) <= 2

        with run:
            run.loop(callback)
            model = run.work.model
            assert all(
                (model.get_submodule(name).forward.__class__.__name__ == "function") == compiled
                for name in run.fsdp_units
            )
            assert math.isfinite(run.metrics()["train_loss"])
        losses[compiled] = first[0]  # before any step: the initial weights
    assert math.isclose(losses[True], losses[False], rel_tol=1e-4), losses
