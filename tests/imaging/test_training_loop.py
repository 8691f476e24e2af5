"""Training loop: learning, clipping, learning rates, regions, bad inputs, two ranks."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from scopebench.imaging.common.denoisers import DenoiserSpec
from scopebench.imaging.training import (
    REGIONS,
    TrainConfig,
    TrainingRun,
    UnrolledConfig,
    UnrolledTrainer,
    build_training_data,
    evaluate_reconstruction,
)

pytestmark = pytest.mark.usefixtures("one_thread")


QUICKSTART = dict(image_size=32, operator="blur", noise_level=0.03, n_train=64, n_val=8, seed=0)
ARCH = UnrolledConfig(n_unrolled=3, denoiser=DenoiserSpec(denoiser="dncnn", channels=16, in_channels=3, out_channels=3))


@pytest.fixture(scope="module")
def small():
    return build_training_data(image_size=16, n_train=8, n_val=2)


def counting_callback(run, steps, on_step=None):
    """benchopt-like callback: called before each step, stops after ``steps`` steps."""

    def callback():
        done = run.trainer.step_count
        if on_step is not None and done > 0:
            on_step(done)
        return done < steps

    return callback


def test_sixty_quickstart_steps_lower_the_loss_and_raise_validation_psnr(tmp_path):
    run = TrainingRun(
        data_params=QUICKSTART, unrolled=ARCH, train=TrainConfig(batch_size=4), nproc=1, output_dir=tmp_path
    )
    run.start()
    data = run.trainer.data
    losses, psnr = [], {}

    def on_step(step):
        losses.append(run.trainer.last_loss.item())
        if step in (1, 60):
            psnr[step] = evaluate_reconstruction(run.trainer.reconstructor(), data.x_val, data.y_val, data.physics)[
                "val_psnr"
            ]

    with run:
        run.loop(counting_callback(run, 60, on_step))
    metrics = run.metrics()
    assert run.trainer.step_count == 60 and len(losses) == 60
    assert sum(losses[-10:]) < 0.5 * sum(losses[:10])
    assert psnr[60] >= psnr[1] + 1.0, psnr
    assert {f"{r}_time_sec" for r in REGIONS} <= set(metrics)


def test_grad_clip_bounds_the_gradient_norm(small):
    def grad_norm(trainer):
        return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trainer.params if p.grad is not None]))

    clipped = UnrolledTrainer(small, ARCH, TrainConfig(batch_size=2, grad_clip=1e-3))
    free = UnrolledTrainer(small, ARCH, TrainConfig(batch_size=2, grad_clip=None))
    for _ in range(2):
        clipped.step()
        free.step()
        assert clipped.last_grad_norm > 1e-3  # the raw norm: clipping had work to do
        assert grad_norm(clipped) <= 1e-3 * (1 + 1e-5)  # what the optimizer applied
    assert grad_norm(free) > 1e-3 and free.last_grad_norm is None


def test_learning_rates_reach_the_two_parameter_groups(small):
    trainer = UnrolledTrainer(small, ARCH, TrainConfig(learning_rate=0.05, model_learning_rate=2e-4))
    groups = {g["name"]: g for g in trainer.optimizer.param_groups}
    assert groups["unrolled"]["lr"] == 0.05 and groups["denoiser"]["lr"] == 2e-4
    assert {id(p) for p in groups["denoiser"]["params"]} == {id(p) for p in trainer.denoiser.parameters()}
    unrolled = [p for key in ("stepsize", "g_param") for p in trainer.model.params_algo[key]]
    assert {id(p) for p in groups["unrolled"]["params"]} == {id(p) for p in unrolled}
    before = [p.detach().clone() for p in unrolled]
    trainer.step()
    stepsizes = [p.detach() for p in trainer.model.params_algo["stepsize"]]
    # Adam's first update moves each parameter by about its learning rate.
    assert all(abs((p - b).item()) == pytest.approx(0.05, rel=0.05) for p, b in zip(stepsizes, before))


def test_regions_in_order_and_loss_returned(small):
    class Recorder:
        def __init__(self):
            self.names = []

        def track_step(self, name):
            self.names.append(name)
            return contextlib.nullcontext()

    trainer = UnrolledTrainer(small, ARCH, TrainConfig(batch_size=2))
    regions = Recorder()
    loss = trainer.step(regions)
    assert regions.names == list(REGIONS)
    assert loss.ndim == 0 and not loss.requires_grad and trainer.step_count == 1


def test_batches_cycle_through_a_seeded_shuffle(small):
    a = UnrolledTrainer(small, ARCH, TrainConfig(batch_size=4, seed=1))
    b = UnrolledTrainer(small, ARCH, TrainConfig(batch_size=4, seed=1))
    first = [a.next_batch()[0] for _ in range(2)]
    assert all(torch.equal(x, b.next_batch()[0]) for x in first)
    seen = torch.cat(first).flatten(1)
    assert len({tuple(row[:8].tolist()) for row in seen}) == 8  # one epoch = every pair once


@pytest.mark.parametrize(
    "train, message",
    [
        (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
        (dict(batch_size=9), r"^batch_size 9 is larger than the 8 training samples of the training set: .* n_train$"),
        (dict(distribute_model=True, patch_size=32), r"patch_size=32 is larger than the image \(image_size=16\)"),
        (dict(grad_clip=0.0), "grad_clip must be a finite number > 0"),
        (dict(learning_rate=float("nan")), "learning_rate must be a finite number"),
        (dict(max_batch_size=0), "max_batch_size must be an integer >= 1"),
        (dict(distribute_model=True, patch_size=8, overlap=8), "^overlap=8 must be smaller than patch_size=8"),
    ],
)
def test_bad_training_inputs_fail_before_any_work(small, train, message):
    with pytest.raises(ValueError, match=message):
        UnrolledTrainer(small, ARCH, TrainConfig(**train))


def test_several_processes_need_a_distributed_model():
    with pytest.raises(ValueError, match="2 processes need distribute_model=true"):
        TrainingRun(data_params=QUICKSTART, unrolled=ARCH, train=TrainConfig(), nproc=2)


def test_denoiser_must_match_the_data(small):
    grey = dataclasses.replace(ARCH, denoiser=DenoiserSpec(in_channels=1, out_channels=1))
    with pytest.raises(ValueError, match=r"denoiser expects 1 channel\(s\) in 2-D, the data has 3 channel\(s\)"):
        UnrolledTrainer(small, grey, TrainConfig())


def trajectory(nproc, tmp_path, steps=5):
    data = dict(image_size=32, n_train=16, n_val=2, seed=0)
    train = TrainConfig(batch_size=4, distribute_model=True, patch_size=16, overlap=8)
    run = TrainingRun(data_params=data, unrolled=ARCH, train=train, nproc=nproc, output_dir=tmp_path)
    losses = []
    with run:
        run.loop(counting_callback(run, steps, lambda step: losses.append(run.trainer.last_loss.item())))
    return losses, run.metrics()


@pytest.mark.slow
def test_two_ranks_reproduce_the_single_process_trajectory(tmp_path):
    single, _ = trajectory(1, tmp_path)
    double, metrics = trajectory(2, tmp_path)
    assert len(single) == len(double) == 5
    for a, b in zip(single, double):
        assert abs(a - b) <= 1e-4 * abs(a), (single, double)
    assert "rank_skew_pct" in metrics  # rank 0's row is the reduction over both ranks
    assert single[-1] < single[0]
    # The ledger on DDP-free deepinv distribution too: each region split, the collectives seen.
    for region in ("forward", "backward", "optimizer_step"):
        parts = [metrics[f"{region}_{p}_sec"] for p in ("work", "comm_wait_peer", "comm_transfer", "comm_hidden")]
        assert min(parts) >= 0, (region, parts)
    moved = {k: v for k, v in metrics.items() if k.startswith("comm_") and k.endswith("_bytes")}
    assert moved and all(v > 0 for v in moved.values()), moved
