"""Training pairs: determinism, shapes, noise at the measurement's size, held-out set."""

from __future__ import annotations

import pytest
import torch

from scopebench.imaging.training.data import TRAIN_IMAGES, VAL_IMAGES, build_training_data

pytestmark = pytest.mark.usefixtures("one_thread")


def test_same_parameters_rebuild_the_same_set_bit_for_bit():
    a = build_training_data(image_size=16, n_train=6, n_val=2, seed=3)
    b = build_training_data(image_size=16, n_train=6, n_val=2, seed=3)
    c = build_training_data(image_size=16, n_train=6, n_val=2, seed=4)
    for name in ("x_train", "y_train", "x_val", "y_val"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.x_train, c.x_train)
    assert a.spec.channels == 3  # None resolves to colour for 2-D
    assert build_training_data(**a.spec.to_dict()).spec == a.spec


@pytest.mark.parametrize(
    "operator, x_shape, y_shape",
    [
        ("blur", (5, 3, 16, 16), (5, 3, 16, 16)),
        ("downsampling", (5, 3, 16, 16), (5, 3, 8, 8)),
        ("denoising_3d", (5, 1, 16, 16, 16), (5, 1, 16, 16, 16)),
    ],
)
def test_shapes_and_noise_added_at_the_measurement_size(operator, x_shape, y_shape):
    data = build_training_data(image_size=16, operator=operator, noise_level=0.1, n_train=5, n_val=2)
    assert tuple(data.x_train.shape) == x_shape and tuple(data.y_train.shape) == y_shape
    assert data.x_train.min() >= 0 and data.x_train.max() <= 1
    residual = data.y_train - data.physics.A(data.x_train)
    # White noise of the requested level on the measurement grid (never resized: a resized
    # noise field would be correlated and of a different std).
    assert residual.std().item() == pytest.approx(0.1, rel=0.1)
    neighbours = (residual[..., 1:] * residual[..., :-1]).mean() / residual.var()
    assert abs(neighbours.item()) < 0.1


def test_validation_pictures_are_never_training_pictures():
    assert not set(TRAIN_IMAGES) & set(VAL_IMAGES)
    data = build_training_data(image_size=16, n_train=4, n_val=4)
    assert not any(torch.equal(v, t) for v in data.x_val for t in data.x_train)


def test_grey_channel_option():
    data = build_training_data(image_size=16, n_train=2, n_val=1, channels=1)
    assert data.x_train.shape[1] == 1 and data.spec.signal_shape == (1, 16, 16)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"operator": "inpainting"}, "operator must be one of"),
        ({"operator": "downsampling", "image_size": 15}, "image_size must be even"),
        ({"image_size": 4}, "image_size must be an integer"),
        ({"n_train": 0}, "n_train must be an integer"),
        ({"noise_level": -0.1}, "noise_level must be a finite number >= 0 and <= 1"),
        ({"operator": "denoising_3d", "channels": 3}, "channels must be 1"),
        ({"channels": 2}, "channels must be one of 1, 3, got 2"),
        ({"sizes": 3}, "unknown training data parameter"),
        ({"seed": -1}, "^seed must be an integer >= 0 and <= 2147483647, got -1$"),
    ],
)
def test_bad_parameters_fail_before_any_work(params, message):
    with pytest.raises(ValueError, match=message):
        build_training_data(**params)
