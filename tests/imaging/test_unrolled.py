"""Unrolled network: configuration errors, activation checkpointing, weight files."""

from __future__ import annotations

import math

import pytest
import torch

from scopebench.imaging.common.denoisers import DenoiserSpec
from scopebench.imaging.common.weights import load_denoiser_weights, read_denoiser_metadata
from scopebench.imaging.training import (
    TrainConfig,
    UnrolledConfig,
    UnrolledTrainer,
    build_training_data,
    build_unrolled,
    evaluate_reconstruction,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data():
    return build_training_data(image_size=32, n_train=8, n_val=2)


def make_trainer(data, checkpoint="never", distribute=False, max_batch_size=None, **spec):
    config = UnrolledConfig(denoiser=DenoiserSpec(in_channels=3, out_channels=3, **spec), checkpoint=checkpoint)
    trainer = UnrolledTrainer(data, config, TrainConfig(distribute_model=distribute, max_batch_size=max_batch_size))
    if distribute:
        from deepinv.distributed import DistributedContext

        # A context outside any process group: one rank holding every tile.
        with DistributedContext(device_mode="cpu") as ctx:
            trainer.distribute(ctx)
    return trainer


def loss_grads_and_saved_bytes(trainer, x, y):
    """One forward/backward; bytes autograd keeps for backward (activations, weights excluded)."""
    weights = {p.untyped_storage().data_ptr() for p in trainer.params}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = trainer.loss(x, y)
    loss.backward()
    return loss.detach(), [p.grad for p in trainer.params], sum(saved.values())


@pytest.mark.parametrize(
    "params, message",
    [
        ({"n_unrolled": 0}, "n_unrolled must be an integer >= 1, got 0"),
        ({"checkpoint": "sometimes"}, "checkpoint_batches must be one of"),
        ({"stepsize": -1.0}, "stepsize must be a finite number > 0"),
    ],
)
def test_bad_unrolled_config(params, message):
    with pytest.raises(ValueError, match=message):
        UnrolledConfig(**params)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"denoiser": "unet"}, "denoiser must be one of 'dncnn', 'drunet', got 'unet'"),
        ({"channels": 0}, "denoiser_channels must be an integer >= 1"),
        ({"denoiser": "dncnn", "depth": 1}, "DnCNN needs at least 2 conv layers"),
        ({"dim": 4}, "dim must be one of 2, 3"),
    ],
)
def test_bad_denoiser_spec(params, message):
    with pytest.raises(ValueError, match=message):
        DenoiserSpec(**params)


@pytest.mark.parametrize("name", ["dncnn", "drunet"])
@pytest.mark.parametrize("dim", [2, 3])
def test_unrolled_forward_keeps_the_signal_shape(name, dim):
    import deepinv as dinv

    spec = DenoiserSpec(denoiser=name, channels=4, in_channels=1, out_channels=1, dim=dim)
    model = build_unrolled(UnrolledConfig(n_unrolled=2, denoiser=spec), spec.build())
    x = torch.rand(2, 1, *(16,) * dim)
    out = model(x, dinv.physics.Denoising())
    assert out.shape == x.shape and out.requires_grad
    assert len(model.params_algo["stepsize"]) == 2 and len(model.params_algo["g_param"]) == 2


@pytest.mark.parametrize(
    "reference, checkpointed",
    [
        ({"checkpoint": "never"}, {"checkpoint": "always"}),
        # Tiled model: deepinv checkpoints each tile batch when a rank has several ("auto").
        (
            {"checkpoint": "never", "distribute": True, "max_batch_size": 1},
            {"checkpoint": "auto", "distribute": True, "max_batch_size": 1},
        ),
    ],
)
def test_checkpointing_same_loss_and_gradients_less_saved_memory(data, reference, checkpointed):
    x, y = data.x_train[:4], data.y_train[:4]
    loss_a, grads_a, bytes_a = loss_grads_and_saved_bytes(make_trainer(data, **reference), x, y)
    loss_b, grads_b, bytes_b = loss_grads_and_saved_bytes(make_trainer(data, **checkpointed), x, y)
    assert abs(loss_a - loss_b) <= 1e-6 * abs(loss_a)
    assert [g is None for g in grads_a] == [g is None for g in grads_b]
    for ga, gb in zip(grads_a, grads_b):
        if ga is not None:
            assert (ga - gb).norm() <= 1e-6 * ga.norm()
    # On CPU the profiler's GPU memory is 0; what checkpointing saves is the activations
    # autograd holds between forward and backward, counted here (the inputs of each
    # checkpointed call stay, the activations inside are recomputed).
    assert bytes_b < 0.5 * bytes_a, (bytes_a, bytes_b)


def test_checkpoint_auto_without_tiling_is_never(data):
    trainer = make_trainer(data, checkpoint="auto")
    assert not any(type(m).__name__ == "CheckpointedDenoiser" for m in trainer.model.modules())
    always = make_trainer(data, checkpoint="always")
    assert any(type(m).__name__ == "CheckpointedDenoiser" for m in always.model.modules())


@pytest.mark.parametrize("name", ["dncnn", "drunet"])
def test_saved_weights_load_into_a_denoiser_usable_for_pnp(data, tmp_path, name):
    import deepinv as dinv

    trainer = make_trainer(data, denoiser=name, channels=8)
    for _ in range(3):
        trainer.step()
    path = trainer.save_weights(tmp_path / "run_denoiser.safetensors")

    meta = read_denoiser_metadata(path)
    assert meta["format"] == "scopebench.denoiser.v1" and meta["denoiser"] == name
    assert (meta["channels"], meta["in_channels"], meta["out_channels"], meta["dim"]) == ("8", "3", "3", "2")
    assert meta["train_steps"] == 3 and len(meta["unrolled_sigma"]) == 3
    net = load_denoiser_weights(path)
    assert type(net) is type(trainer.denoiser) and not net.training
    for key, value in trainer.denoiser.state_dict().items():
        assert torch.equal(net.state_dict()[key], value), key

    # A plain PnP-PGD with the loaded denoiser, on a small deblurring problem.
    pnp = dinv.optim.PGD(
        data_fidelity=dinv.optim.L2(),
        prior=dinv.optim.PnP(net),
        stepsize=meta["unrolled_stepsize"],
        sigma_denoiser=meta["unrolled_sigma"],
        max_iter=len(meta["unrolled_sigma"]),
    )
    scores = evaluate_reconstruction(pnp, data.x_val, data.y_val, data.physics)
    assert math.isfinite(scores["val_psnr"]) and scores["val_psnr"] > 0
    # ... and it is exactly the trained network's reconstruction.
    expected = evaluate_reconstruction(trainer.reconstructor(), data.x_val, data.y_val, data.physics)
    assert scores["val_psnr"] == pytest.approx(expected["val_psnr"], rel=1e-6)


@pytest.mark.parametrize("name", ["dncnn", "drunet"])
def test_inference_benchmark_loads_the_weights_through_denoiser_weights(data, tmp_path, name):
    """Contract with benchmark_inference: its ``denoiser_weights`` loader rebuilds the same net."""
    from scopebench.imaging.common.denoisers import DenoiserConfig
    from scopebench.imaging.common.denoisers import build_denoiser as build_inference_denoiser

    trainer = make_trainer(data, denoiser=name, channels=8)
    trainer.step()
    path = trainer.save_weights(tmp_path / "run_denoiser.safetensors")
    net = build_inference_denoiser(DenoiserConfig(name=name, weights=str(path)), channels=3, spatial_dims=2)
    assert type(net) is type(trainer.denoiser)
    loaded = net.state_dict()
    for key, value in trainer.denoiser.state_dict().items():
        assert torch.equal(loaded[key], value), key


def test_loader_rejects_a_foreign_file(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="expected a weight file of format 'scopebench.denoiser.v1', got None"):
        load_denoiser_weights(path)
    with pytest.raises(FileNotFoundError, match="no denoiser weight file"):
        load_denoiser_weights(tmp_path / "missing.safetensors")
