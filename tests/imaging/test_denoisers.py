"""Denoisers build offline; weights files are read with their architecture; bad input fails early."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from scopebench.imaging.common.denoisers import DenoiserConfig, DenoiserSpec, build_denoiser, denoiser_unavailable
from scopebench.imaging.common.weights import load_state_dict, save_denoiser_weights


def _drunet(**kw):
    import deepinv as dinv

    return dinv.models.DRUNet(pretrained=None, **kw).eval()


def test_learned_denoiser_without_weights_is_refused_with_the_fix():
    with pytest.raises(
        ValueError, match="denoiser='drunet' needs weights and none can be downloaded here: set denoiser_weights"
    ):
        DenoiserConfig(name="drunet")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "unet"}, "denoiser must be one of"),
        ({"name": "tv", "weights": "w.pth"}, "denoiser='tv' has no weights"),
        ({"name": "dncnn", "weights": "/nonexistent/w.pth"}, "denoiser_weights='/nonexistent/w.pth' is not a file"),
        ({"name": "tv", "sigma": 0}, "denoiser_sigma must be a finite number > 0, got 0"),
        ({"name": "tv", "pretrained": "download"}, "pretrained must be one of 'auto', 'none', got 'download'"),
    ],
)
def test_bad_denoiser_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DenoiserConfig(**kwargs)


def test_random_weights_are_identical_whatever_the_global_seed():
    torch.manual_seed(1)
    a = build_denoiser(DenoiserConfig(name="dncnn", pretrained="none"), channels=1)
    torch.manual_seed(2)
    b = build_denoiser(DenoiserConfig(name="dncnn", pretrained="none"), channels=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("suffix, prefix", [(".safetensors", ""), (".pth", "denoiser."), (".pt", "module.")])
def test_weights_file_round_trip_reads_the_architecture(tmp_path, suffix, prefix):
    model = _drunet(in_channels=3, out_channels=3, nc=(8, 16, 32, 64), nb=1)
    state = {prefix + k: v.contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save({"state_dict": state} if prefix else state, path)
    loaded = build_denoiser(DenoiserConfig(name="drunet", weights=str(path)), channels=3)
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(loaded(x, 0.05), model(x, 0.05))
    assert set(load_state_dict(path)) >= {k.removeprefix("module.") for k in state}


def test_weights_for_other_channels_are_refused(tmp_path):
    path = tmp_path / "gray.pth"
    torch.save(_drunet(in_channels=1, out_channels=1, nc=(8, 16, 32, 64), nb=1).state_dict(), path)
    with pytest.raises(ValueError, match="hold a 2-D drunet for 1 channel"):
        build_denoiser(DenoiserConfig(name="drunet", weights=str(path)), channels=3)


def test_missing_optional_package_is_reported(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bm3d" else real(name, *a))
    assert denoiser_unavailable("bm3d") == "denoiser='bm3d' needs the optional package 'bm3d', which is not installed"
    with pytest.raises(ValueError, match="needs the optional package 'bm3d'"):
        build_denoiser(DenoiserConfig(name="bm3d"), channels=3)
    assert denoiser_unavailable("tv") is None


def test_volumes_get_3d_denoisers_and_2d_only_ones_are_refused():
    net = build_denoiser(DenoiserConfig(name="dncnn", pretrained="none"), channels=1, spatial_dims=3)
    assert next(net.parameters()).ndim == 5
    with pytest.raises(ValueError, match="denoiser='median' only handles 2-D images"):
        build_denoiser(DenoiserConfig(name="median"), channels=1, spatial_dims=3)


@pytest.mark.parametrize("name", ["dncnn", "drunet"])
def test_weights_written_by_benchmark_training_load_here(tmp_path, name):
    spec = DenoiserSpec(denoiser=name, channels=16)
    net = spec.build().eval()
    path = save_denoiser_weights(tmp_path / f"{name}.safetensors", net, spec)
    ours = build_denoiser(DenoiserConfig(name=name, weights=str(path)), channels=3)
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(ours(x, 0.05), net(x, 0.05))


@pytest.mark.parametrize("name", ["tv", "median", "wavelet", "bm3d"])
def test_classical_denoisers_reduce_noise(name):
    """Every non-learned denoiser builds offline and brings a noisy image closer to the clean one."""
    torch.manual_seed(0)
    clean = torch.linspace(0, 1, 32).repeat(1, 3, 32, 1)  # smooth ramp, (1, 3, 32, 32)
    noisy = clean + 0.1 * torch.randn_like(clean)
    denoiser = build_denoiser(DenoiserConfig(name=name, sigma=0.1), channels=3)
    with torch.no_grad():
        out = denoiser(noisy, 0.1)
    assert out.shape == clean.shape
    assert (out - clean).pow(2).mean() < (noisy - clean).pow(2).mean()


def _saved_drunet(tmp_path, suffix):
    model = _drunet(in_channels=3, out_channels=3, nc=(8, 16, 32, 64), nb=1)
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        save_denoiser_weights(path, model, DenoiserSpec(denoiser="drunet", channels=8, depth=1))
    else:
        torch.save(model.state_dict(), path)
    return path


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda data: b"", "is empty"),
        (lambda data: data[: len(data) // 2], "is truncated"),
        (lambda data: data[:4], "is truncated"),
        (lambda data: b"\x17" * len(data), "is truncated or corrupt|is corrupt"),
    ],
    ids=["empty", "half", "four-bytes", "garbage"],
)
def test_damaged_weights_file_is_refused_naming_key_and_file(tmp_path, suffix, damage, problem):
    path = _saved_drunet(tmp_path, suffix)
    DenoiserConfig(name="drunet", weights=str(path))  # intact: accepted
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=rf"^denoiser_weights='{re.escape(str(path))}' ({problem})") as err:
        DenoiserConfig(name="drunet", weights=str(path))
    assert "\n" not in str(err.value)


def test_flipped_bytes_inside_a_pth_archive_fail_its_checksum(tmp_path):
    path = _saved_drunet(tmp_path, ".pth")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"denoiser_weights='.*w\.pth' is corrupt"):
        DenoiserConfig(name="drunet", weights=str(path))


def test_one_loader_for_both_benchmarks_refuses_the_wrong_kind(tmp_path):
    from scopebench.imaging.common.weights import load_denoiser_weights

    path = _saved_drunet(tmp_path, ".safetensors")
    assert type(load_denoiser_weights(path)).__name__ == "DRUNet"
    with pytest.raises(ValueError, match="holds a drunet, not a dncnn"):
        build_denoiser(DenoiserConfig(name="dncnn", weights=str(path)), channels=3)


_COMMON = "scopebench.imaging.common"


def _imports(source: str, package: str) -> set[str]:
    """Modules a source imports anywhere (function bodies too), relative imports resolved;
    ``from pkg import name`` also counts ``pkg.name`` (it may be a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def _common_graph() -> dict[str, set[str]]:
    """``module -> modules of imaging.common it imports`` (short names), read from the sources."""
    import scopebench.imaging.common as common

    folder = Path(common.__file__).parent
    names = {path.stem for path in folder.glob("*.py") if path.stem != "__init__"}
    graph = {}
    for name in names:
        imported = _imports((folder / f"{name}.py").read_text(), _COMMON)
        graph[name] = {other for other in names if f"{_COMMON}.{other}" in imported and other != name}
    return graph


def test_import_reader_sees_function_level_and_relative_imports():
    source = "def f():\n    from scopebench.imaging.common.weights import x\nfrom . import denoisers\n"
    found = _imports(source, _COMMON)
    assert {f"{_COMMON}.weights", f"{_COMMON}.denoisers"} <= found


def test_denoisers_and_weights_do_not_import_each_other():
    graph = _common_graph()
    assert {"denoisers", "weights"} <= set(graph)
    assert not ("weights" in graph["denoisers"] and "denoisers" in graph["weights"]), graph

    # Nor through a third module of the package: no cycle at all.
    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph[start] - seen:
            if nxt == goal or reaches(nxt, goal, seen | {nxt}):
                return True
        return False

    cyclic = sorted(name for name in graph if reaches(name, name, set()))
    assert cyclic == [], graph
