"""Every unpickling of a checkpoint refuses a generated family of code-running gadgets.

A gadget is a pickle that resolves a dangerous callable (``os.system``, ``subprocess``,
``builtins.exec``...) and calls it to create a marker file. The family is generated, not
hand-picked: for every module an unpickler allows, every dotted path from that module to
``os``, ``subprocess``, ``posix`` or ``builtins`` that exists (found by walking the module's
attributes two levels deep), plus the plain module-level names; each written with
protocol 0's ``GLOBAL`` and protocol 4's ``STACK_GLOBAL`` (which resolves dotted names).
Each is fed to each loader the suite uses on checkpoint files: DCP's ``.metadata`` reader,
``torch.load`` under ``data_only_loading`` (zip and legacy formats), accelerate's RNG-state
loader, the imaging weights loader. None may run, each is refused naming the file.

The end-to-end tests plant the issue's gadget in a genuine FSDP2 checkpoint: a ``.metadata``
that runs a command and then unpickles the real metadata, with ``manifest.json`` updated to
match, so only the unpickler stands between it and the command.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import pickletools
import shutil
import types
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from scopebench.train.data_only import (
    METADATA_GLOBALS,
    data_only_globals,
    data_only_loading,
    read_dcp_metadata,
)

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml")
DANGEROUS_MODULES = ("os", "posix", "subprocess", "builtins", "sys", "importlib")
#: The callable reached at the end of each path, and how it is called to touch ``marker``.
CALLS = {
    "os": ("system", lambda marker: (f"touch {marker}",)),
    "posix": ("system", lambda marker: (f"touch {marker}",)),
    "subprocess": ("check_call", lambda marker: (["touch", str(marker)],)),
    "builtins": ("exec", lambda marker: (f"open({str(marker)!r}, 'w').close()",)),
}


def _dangerous_paths(module_name: str) -> list[str]:
    """Dotted names, from ``module_name``, of a callable in :data:`CALLS`: each attribute path
    (two levels deep) that ends at one of those modules, plus the bare names."""
    import importlib

    module = importlib.import_module(module_name)
    paths = {f"{name}.{CALLS[name][0]}" for name in CALLS}  # resolve only if the module imports them
    frontier = [("", module)]
    warnings.simplefilter("ignore")  # deprecated attributes warn when read
    for _ in range(2):
        nxt = []
        for prefix, obj in frontier:
            for attr in dir(obj):
                try:
                    value = getattr(obj, attr)
                except Exception:  # noqa: S112 - lazy attributes that fail are no path
                    continue
                path = f"{prefix}{attr}"
                if isinstance(value, types.ModuleType):
                    base = value.__name__.split(".")[0]
                    if value.__name__ in CALLS:
                        paths.add(f"{path}.{CALLS[value.__name__][0]}")
                    elif base not in DANGEROUS_MODULES:
                        nxt.append((f"{path}.", value))
        frontier = nxt[:200]  # enough to reach what one module imports and what those import
    return sorted(paths)


#: How a gadget names its callable: protocol 0's GLOBAL opcode in a protocol-0 stream (no
#: dots walked), the same opcode after PROTO 4 (dots walked), protocol 4's STACK_GLOBAL.
VARIANTS = ("GLOBAL", "GLOBAL4", "STACK_GLOBAL")


def _gadget_bytes(module: str, name: str, marker: Path, variant: str) -> bytes:
    """A pickle that resolves ``module``/``name`` and calls it to touch ``marker``."""
    ending = name.rsplit(".", 1)[-1]
    kind = next(m for m, (fn, _) in CALLS.items() if fn == ending)
    # the arguments' tuple without PROTO / STOP, and without memo entries (a gadget spliced
    # before a genuine stream must not shift that stream's memo)
    args = pickletools.optimize(pickle.dumps(CALLS[kind][1](marker), protocol=2))[2:-1]
    if variant == "STACK_GLOBAL":
        encoded = [s.encode() for s in (module, name)]
        push = b"".join(b"\x8c" + bytes([len(s)]) + s for s in encoded) + b"\x93"  # SHORT_BINUNICODE x2
    else:
        push = b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    proto = b"" if variant == "GLOBAL" else b"\x80\x04"
    return proto + push + args + b"R."


def family(modules) -> list[tuple[str, str, str]]:
    """(module, dotted name, variant) for every allowed module x every path to a dangerous callable."""
    return [(m, name, v) for m in sorted(set(modules)) for name in _dangerous_paths(m) for v in VARIANTS]


def _metadata_modules() -> set[str]:
    return {module for module, _ in METADATA_GLOBALS} | {"torch"}


def _torch_load_modules() -> set[str]:
    """Modules of every global ``torch.load(weights_only=True)`` admits under ``data_only_loading``
    and accelerate's RNG loader: torch's default allow-list, DeepSpeed's types, numpy's."""
    from torch._weights_only_unpickler import _get_allowed_globals

    modules = {path.rsplit(".", 1)[0] for path in _get_allowed_globals()}
    modules |= {g.__module__ for g in data_only_globals()}
    modules |= {"numpy", "numpy.core.multiarray", "numpy.dtypes", "numpy._core.multiarray"}
    return {m for m in modules if _importable(m)}


def _importable(name: str) -> bool:
    import importlib

    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _as_torch_zip(gadget: bytes, path: Path) -> None:
    """A ``torch.save`` zip archive whose ``data.pkl`` is ``gadget``."""
    buffer = io.BytesIO()
    torch.save({"x": 1}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            data = gadget if item.filename.endswith("/data.pkl") else src.read(item.filename)
            dst.writestr(item.filename, data, compress_type=zipfile.ZIP_STORED)


def test_the_family_reaches_os_subprocess_and_builtins_through_allowed_modules(tmp_path):
    """The generator finds real dotted paths (the metadata module imports ``os``), and plain
    ``pickle`` runs them: without that the family would test nothing."""
    names = {name for _, name, _ in family(["torch.distributed.checkpoint.metadata"])}
    assert "os.system" in names
    assert len(family(_metadata_modules())) > 60
    for variant in ("GLOBAL4", "STACK_GLOBAL"):
        marker = tmp_path / variant
        pickle.loads(_gadget_bytes("torch.distributed.checkpoint.metadata", "os.system", marker, variant))
        assert marker.exists()


def test_dcp_metadata_refuses_every_gadget_of_the_family(tmp_path):
    marker = tmp_path / "ran"
    for module, name, variant in family(_metadata_modules()):
        path = tmp_path / ".metadata"
        path.write_bytes(_gadget_bytes(module, name, marker, variant))
        with pytest.raises(ValueError, match=r"holds more than checkpoint metadata .*is not part of"):
            read_dcp_metadata(path)
        assert not marker.exists(), f"{module} / {name} ran"


@pytest.mark.parametrize("container", ["zip", "legacy"])
def test_torch_load_under_data_only_loading_refuses_every_gadget_of_the_family(tmp_path, container):
    """What DeepSpeed's shards, accelerate's optimizer / scheduler files and DCP's byte items go through."""
    marker = tmp_path / "ran"
    path = tmp_path / "f.pt"
    for module, name, variant in family(_torch_load_modules()):
        gadget = _gadget_bytes(module, name, marker, variant)
        if container == "zip":
            _as_torch_zip(gadget, path)
        else:
            path.write_bytes(gadget)
        with pytest.raises(ValueError, match="holds Python code or objects that are not data"), data_only_loading():
            torch.load(path, map_location="cpu", weights_only=False)
        assert not marker.exists(), f"{module} / {name} ({variant}) ran"


def test_accelerates_rng_loader_and_the_weights_loader_refuse_every_gadget(tmp_path):
    from accelerate.utils.other import load

    from scopebench.imaging.common.weights import load_state_dict

    marker = tmp_path / "ran"
    rng, weights = tmp_path / "random_states_0.pkl", tmp_path / "weights.pt"
    for module, name, variant in family(_torch_load_modules()):
        for path in (rng, weights):
            _as_torch_zip(_gadget_bytes(module, name, marker, variant), path)
        with pytest.raises(ValueError, match="holds Python code"), data_only_loading():
            load(str(rng), map_location="cpu")
        with pytest.raises(pickle.UnpicklingError):  # weights_only=True, its own call
            load_state_dict(weights)
        assert not marker.exists(), f"{module} / {name} ({variant}) ran"


# -- genuine DCP checkpoints --------------------------------------------------------------


@pytest.fixture
def fsdp_checkpoint(tmp_path):
    """A one-rank FSDP2 checkpoint of a small model and its AdamW state (the real DCP files)."""
    import torch.distributed as dist

    from scopebench.train.fsdp import FSDPSettings, join_single_rank_group, save_sharded, shard_model

    created = join_single_rank_group(torch.device("cpu"))
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        shard_model(model, FSDPSettings(), device=torch.device("cpu"), precision="fp32")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        save_sharded(model, optimizer, tmp_path / "ckpt")
        yield tmp_path / "ckpt", {k: v.full_tensor() for k, v in model.state_dict().items()}
    finally:
        if created:
            dist.destroy_process_group()


def test_genuine_dcp_metadata_names_only_allowed_globals(fsdp_checkpoint):
    from scopebench.train.data_only import _metadata_objects
    from scopebench.train.fsdp import MODEL_DIR, OPTIMIZER_DIR

    held = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            held.add((module, name))
            return super().find_class(module, name)

    for sub in (MODEL_DIR, OPTIMIZER_DIR):
        Recorder(io.BytesIO((fsdp_checkpoint[0] / sub / ".metadata").read_bytes())).load()
        assert read_dcp_metadata(fsdp_checkpoint[0] / sub / ".metadata").state_dict_metadata
    assert held and held <= set(_metadata_objects())


def test_consolidation_reads_genuine_shards_and_refuses_a_byte_item_holding_code(fsdp_checkpoint, tmp_path):
    """DCP's planner loads byte items with ``weights_only=False``: the loader is data-only itself,
    whoever calls it (convert-checkpoint did; a direct caller did not)."""
    import torch.distributed.checkpoint as dcp

    from scopebench.train.fsdp import MODEL_DIR, consolidated_model_state

    folder, weights = fsdp_checkpoint
    state = consolidated_model_state(folder)
    assert all(torch.equal(state[k], weights[k]) for k in weights)

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    planted = tmp_path / "planted"
    dcp.save({"w": torch.zeros(2), "note": Planted()}, checkpoint_id=str(planted / MODEL_DIR), no_dist=True)
    with pytest.raises(ValueError) as refused:
        consolidated_model_state(planted)
    assert str(refused.value).startswith(
        f"a non-tensor item of {planted / MODEL_DIR} holds Python code or objects that are not data (posix.system)"
    ), refused.value
    assert not (tmp_path / "ran").exists()


# -- end to end: the issue's gadget in a trained checkpoint --------------------------------


def _issue_gadget(real: bytes, marker: Path) -> bytes:
    """Runs ``touch marker`` through a dotted STACK_GLOBAL, pops the result, then unpickles
    ``real`` (the genuine metadata): a loader that admits it returns normal metadata."""
    call = _gadget_bytes("torch.distributed.checkpoint.metadata", "os.system", marker, "STACK_GLOBAL")[
        2:-1
    ]  # no PROTO/STOP
    body = real[2:]  # the genuine stream after its PROTO opcode
    return b"\x80\x04" + call + b"0" + body  # POP the call's result


def _replant_manifest(checkpoint: Path, name: str) -> None:
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    data = (checkpoint / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """``scopebench train`` under fsdp2 on one process, 2 steps, a checkpoint at step 2."""
    from scopebench.cli import main

    run, cache = tmp_path_factory.mktemp("fsdp_run") / "run", tmp_path_factory.mktemp("datasets")
    args = ["--config", TINY, f"--dataset.cache_dir={cache}", "--output_dir", str(run), "--steps", "2"]
    assert main(["train", *args, "--save_freq", "2", "--backend=fsdp2", "--find_unused_params=false"]) == 0
    return run, cache


@pytest.mark.slow
def test_convert_and_resume_refuse_a_metadata_gadget_even_with_a_matching_manifest(fsdp_run, tmp_path, capsys):
    from scopebench.cli import main

    run = Path(shutil.copytree(fsdp_run[0], tmp_path / "run", symlinks=True))
    checkpoint = run / "checkpoints" / "000002"
    name = "fsdp_model/.metadata"
    marker = tmp_path / "ran"
    (checkpoint / name).write_bytes(_issue_gadget((checkpoint / name).read_bytes(), marker))
    assert pickle.loads((checkpoint / name).read_bytes()) is not None and marker.exists()  # the gadget is live
    marker.unlink()

    capsys.readouterr()  # the manifest's sha256 differs: named as planted code, not as damage
    assert main(["convert-checkpoint", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert f"{checkpoint / name} holds more than checkpoint metadata" in err and not marker.exists(), err
    _replant_manifest(checkpoint, name)  # what an attacker would do: only the unpickler is left
    assert main(["convert-checkpoint", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert f"{checkpoint / name} holds more than checkpoint metadata" in err and "os.system" in err, err
    assert not (checkpoint / "model.safetensors").exists() and not marker.exists()

    config = checkpoint / "train_config.yaml"
    args = ["--config", str(config), "--output_dir", str(run), f"--dataset.cache_dir={fsdp_run[1]}"]
    assert main(["train", *args, "--resume", "true", "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert f"{checkpoint / name} holds more than checkpoint metadata" in err, err
    assert not marker.exists()
    assert (run / "checkpoints" / "last").resolve().name == "000002"


@pytest.mark.slow
def test_convert_checkpoint_verifies_the_manifest_like_a_resume(fsdp_run, tmp_path, capsys):
    from scopebench.cli import main

    run = Path(shutil.copytree(fsdp_run[0], tmp_path / "run", symlinks=True))
    checkpoint = run / "checkpoints" / "000002"
    shard = next((checkpoint / "fsdp_model").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # one byte of one tensor: loads without error, wrong weights
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["convert-checkpoint", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert f"{shard}: sha256" in err and "the checkpoint is damaged" in err, err
    assert not (checkpoint / "model.safetensors").exists()
    # the genuine one still converts
    assert main(["convert-checkpoint", str(fsdp_run[0] / "checkpoints" / "000002")]) == 0


def _forget(checkpoint: Path, name: str) -> None:
    """Delete ``name`` and its manifest entry: the manifest then passes, the shard is gone."""
    (checkpoint / name).unlink()
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    del manifest["files"][name]
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_a_shard_missing_from_folder_and_manifest_is_named_in_one_line(fsdp_run, tmp_path, capsys):
    """Convert and resume read ``.metadata``, which names every shard: the missing one is named
    (it was two tracebacks of DCP's ``CheckpointException``, exit 1)."""
    from scopebench.cli import main

    run = Path(shutil.copytree(fsdp_run[0], tmp_path / "run", symlinks=True))
    checkpoint = run / "checkpoints" / "000002"
    name = sorted(p.relative_to(checkpoint).as_posix() for p in (checkpoint / "fsdp_model").glob("*.distcp"))[-1]
    _forget(checkpoint, name)
    capsys.readouterr()
    expected = (
        f"{checkpoint / name}: missing, {checkpoint / 'fsdp_model' / '.metadata'} names it: the checkpoint is damaged"
    )
    assert main(["convert-checkpoint", str(checkpoint)]) == 2
    assert capsys.readouterr().err == f"scopebench convert-checkpoint: {expected}\n"
    config = checkpoint / "train_config.yaml"
    args = ["--config", str(config), "--output_dir", str(run), f"--dataset.cache_dir={fsdp_run[1]}"]
    assert main(["train", *args, "--resume", "true", "--steps", "4"]) == 2
    assert capsys.readouterr().err == f"scopebench train: {expected}\n"
