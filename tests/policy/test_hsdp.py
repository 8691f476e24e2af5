"""The ``hsdp`` backend: FSDP2 on a 2-D mesh, sharded within a replica group, replicated across.

The slow test launches 4 gloo ranks (``hsdp_driver.py``): HSDP on a 2 x 2 mesh against FSDP2 on
the same 4 ranks, step by step; an exact resume; the parameters' layout; ``convert-checkpoint``.
The two-node run (2 nodes x 2 ranks, the mesh from the layout) is in
``tests/slurm/test_two_node_benchmarks.py``. The fast tests cover the accelerate file, the
layout refusals and the memory estimate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scopebench.cli import main
from scopebench.train import load_accelerate_file, shipped_accelerate_file
from scopebench.train.backends import get_backend
from scopebench.train.backends.hsdp import REPLICATE, SHARD, mesh_shape

DRIVER = Path(__file__).with_name("hsdp_driver.py")


def hsdp_file(tmp_path: Path, replicate, shard) -> Path:
    """The shipped ``hsdp.yaml`` with these mesh sizes."""
    raw = yaml.safe_load(shipped_accelerate_file("hsdp").read_text())
    raw["parallelism_config"] = {REPLICATE: replicate, SHARD: shard}
    path = tmp_path / f"hsdp_{replicate}x{shard}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# -- the accelerate file and the layout ------------------------------------------------------------


def test_the_shipped_file_selects_hsdp_with_its_mesh_from_the_layout():
    file = load_accelerate_file(shipped_accelerate_file("hsdp"))
    assert file.backend.name == "hsdp" and file.fsdp is not None
    assert file.mesh == {REPLICATE: "auto", SHARD: "auto"}
    backend = get_backend("hsdp")
    assert backend.shard_degree(file, 8, nodes=2) == 4  # sharded within a node, replicated across the 2
    assert backend.shard_degree(file, 4, nodes=1) == 4  # one node: one replica group


@pytest.mark.parametrize(
    ("sizes", "world", "nodes", "expected"),
    [
        ({REPLICATE: 2, SHARD: 2}, 4, 1, (2, 2)),
        ({REPLICATE: "auto", SHARD: "auto"}, 4, 2, (2, 2)),
        ({REPLICATE: "auto", SHARD: 2}, 8, 1, (4, 2)),
        ({}, 6, 3, (3, 2)),
    ],
)
def test_the_mesh_comes_from_the_file_or_the_layout(sizes, world, nodes, expected):
    assert mesh_shape(sizes, world, nodes) == expected


@pytest.mark.parametrize(
    ("sizes", "world", "message"),
    [
        ({REPLICATE: 3, SHARD: "auto"}, 4, "3 replica group(s) do not divide 4 ranks"),
        ({REPLICATE: "auto", SHARD: 3}, 4, "a shard of 3 rank(s) does not divide 4 ranks"),
        ({REPLICATE: 2, SHARD: 3}, 4, f"{REPLICATE}=2 x {SHARD}=3 = 6 ranks, but the run has 4"),
    ],
)
def test_a_mesh_that_does_not_divide_the_ranks_is_refused_naming_both_keys(sizes, world, message):
    with pytest.raises(ValueError) as refused:
        mesh_shape(sizes, world, 1, where="h.yaml")
    assert str(refused.value).startswith(f"parallelism_config in h.yaml: {message}")
    assert f"set {REPLICATE} x {SHARD} = {world}" in str(refused.value)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({REPLICATE: 0, SHARD: 2}, rf"parallelism_config.{REPLICATE} in .* must be an integer >= 1 or auto, got 0"),
        ({REPLICATE: "two"}, rf"parallelism_config.{REPLICATE} in .* must be an integer >= 1 or auto, got 'two'"),
        ({"parallelism_config_tp_size": 2}, r"\['parallelism_config_tp_size'\] not supported; hsdp reads"),
    ],
)
def test_bad_mesh_keys_are_refused_naming_the_file(tmp_path, config, match):
    raw = yaml.safe_load(shipped_accelerate_file("hsdp").read_text())
    raw["parallelism_config"] = config
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=match):
        load_accelerate_file(path)


def test_train_refuses_a_layout_that_does_not_divide_before_any_rank_starts(tmp_path, data_args, capsys, started):
    bad = hsdp_file(tmp_path, 3, "auto")
    args = [*data_args, "--accelerate-config", str(bad), "--nproc-per-node", "2", "--output_dir", str(tmp_path / "o")]
    assert main(["train", *args, "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"scopebench train: parallelism_config in {bad}: 3 replica group"), err
    assert started == []


def test_estimate_memory_shards_over_the_replica_group_only(tmp_path, data_args, capsys):
    """HSDP 2 x 2 holds twice FSDP2-on-4's parameter shard, and the same gather buffers."""
    out = {}
    for name, extra in (("fsdp2", []), ("hsdp", [f"--accelerate_config={hsdp_file(tmp_path, 2, 2)}"])):
        path = tmp_path / f"{name}.json"
        flags = [
            *data_args,
            "--nproc-per-node",
            "4",
            "--batch-size",
            "2",
            "--json",
            str(path),
            "--backend",
            name,
            *extra,
        ]
        assert main(["estimate-memory", *flags]) == 0
        out[name] = json.loads(path.read_text())["bytes"]
    capsys.readouterr()
    for key in ("parameters", "gradients", "optimizer_state"):
        assert out["hsdp"][key] == pytest.approx(2 * out["fsdp2"][key]), key
    assert out["hsdp"]["gather_buffers"] == out["fsdp2"]["gather_buffers"]


# -- four ranks --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """:mod:`hsdp_driver` on four ranks: (output folder, facts of each rank)."""
    out = tmp_path_factory.mktemp("hsdp")
    cache = tmp_path_factory.mktemp("datasets")
    file = hsdp_file(out, 2, 2)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
        + [str(DRIVER), str(out), str(cache), str(file)],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return out, [json.loads((out / f"facts_rank{r}.json").read_text()) for r in range(4)]


def _losses(facts: dict) -> list[float]:
    return [record["train_loss"] for record in facts["log"]]


@pytest.mark.slow
def test_hsdp_gives_fsdp2s_losses_on_the_same_four_ranks(trained):
    _, facts = trained
    fsdp2, hsdp = _losses(facts[0]["fsdp2"]), _losses(facts[0]["hsdp"])
    assert len(fsdp2) == len(hsdp) == 6 and len(set(fsdp2)) > 1  # the loss moves: the check can fail
    for step, (a, b) in enumerate(zip(hsdp, fsdp2), 1):
        assert abs(a - b) <= 1e-5 * abs(b), (step, hsdp, fsdp2)
    assert {f["hsdp"]["world_size"] for f in facts} == {4}


@pytest.mark.slow
def test_hsdp_shards_within_a_replica_group_and_replicates_across(trained):
    layouts = [f["layout"] for f in trained[1]]
    for layout in layouts:
        assert layout["mesh"] == [2, 2] and layout["mesh_dims"] == ["replicate", "shard"]
        assert layout["placements"] == ["R", "S(0)"]  # replicated across groups, dim 0 sharded within
        assert 0.45 < layout["fraction"] < 0.55  # a half of each parameter, not FSDP2-on-4's quarter
        assert layout["units"]


@pytest.mark.slow
def test_hsdp_resumes_exactly_and_converts(trained, capsys):
    from safetensors.torch import load_file

    out, facts = trained
    assert facts[0]["hsdp_resumed"]["start_step"] == 3 and facts[0]["hsdp_resumed"]["steps"] == 6
    assert _losses(facts[0]["hsdp_resumed"]) == _losses(facts[0]["hsdp"])[3:]
    weights = {}
    for name in ("hsdp", "hsdp_resumed", "fsdp2"):
        checkpoint = out / name / "checkpoints" / "000006"
        assert main(["convert-checkpoint", str(checkpoint)]) == 0
        weights[name] = load_file(str(checkpoint / "model.safetensors"))
    capsys.readouterr()
    full, resumed = weights["hsdp"], weights["hsdp_resumed"]
    assert full.keys() == resumed.keys() and len(full) > 50
    assert max(float((full[k] - resumed[k]).abs().max()) for k in full) == 0.0
    assert max(float((full[k] - weights["fsdp2"][k]).abs().max()) for k in full) <= 1e-5


def test_a_pi05_train_cell_whose_mesh_does_not_divide_is_declined(tmp_path):
    """benchopt's ``skip`` and ``scopebench check-config`` decline it (as ZeRO on one rank)."""
    from scopebench.policy.run.solver import TrainSolverMixin

    bad = hsdp_file(tmp_path, 3, "auto")
    params = {"backend": "hsdp", "accelerate_config": str(bad), "nproc_per_node": 2, "find_unused_params": False}
    reason = TrainSolverMixin.check_cell(params, {"kind": "synthetic_robot"}, None)
    assert reason.startswith(f"parallelism_config in {bad}: 3 replica group(s) do not divide 2 ranks"), reason
    good = {**params, "accelerate_config": str(hsdp_file(tmp_path, 1, 2))}
    assert TrainSolverMixin.check_cell(good, {"kind": "synthetic_robot"}, None) is None
