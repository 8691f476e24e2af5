"""Problems rebuild bit for bit from plain parameters; bad parameters fail by name."""

from __future__ import annotations

import pytest
import torch

from scopebench.imaging.common.images import fit_to_size, natural_image
from scopebench.imaging.inference.problems import build_problem, describe_problem

CASES = [
    ("simulated", {"image_size": 32, "operator": "blur"}, (1, 3, 32, 32), [(1, 3, 32, 32)]),
    ("simulated", {"image_size": 32, "operator": "downsampling"}, (1, 3, 32, 32), [(1, 3, 16, 16)]),
    ("simulated", {"image_size": 32, "operator": "inpainting"}, (1, 3, 32, 32), [(1, 3, 32, 32)]),
    ("multiframe_superres", {"image_size": 32, "num_operators": 3, "scale": 2}, (1, 3, 32, 32), [(1, 3, 16, 16)] * 3),
    ("tomography_2d", {"image_size": 32, "num_angles": 20}, (1, 1, 32, 32), None),
    ("denoising_3d", {"volume_size": 16}, (1, 1, 16, 16, 16), [(1, 1, 16, 16, 16)]),
]


def _measurements(problem):
    return list(problem.y) if problem.num_operators > 1 else [problem.y]


@pytest.mark.parametrize("kind, params, x_shape, y_shapes", CASES)
def test_problem_shapes_and_determinism(kind, params, x_shape, y_shapes):
    a = build_problem(kind, **params)
    b = build_problem(kind, **params)
    assert tuple(a.x_true.shape) == x_shape
    assert describe_problem(kind, **params) == (x_shape, a.num_operators)
    if y_shapes is not None:
        assert [tuple(t.shape) for t in _measurements(a)] == y_shapes
    assert torch.equal(a.x_true, b.x_true)
    # Same to float rounding: torch's Radon transform sums in a thread-dependent order.
    assert all(torch.allclose(u, v, rtol=0, atol=1e-6) for u, v in zip(_measurements(a), _measurements(b)))
    assert 0.0 <= float(a.x_true.min()) and float(a.x_true.max()) <= 1.0
    # The spec alone rebuilds the problem (what a spawned rank receives).
    spec = dict(a.spec)
    c = build_problem(spec.pop("kind"), **spec)
    assert all(torch.allclose(u, v, rtol=0, atol=1e-6) for u, v in zip(_measurements(a), _measurements(c)))


def test_seed_changes_the_noise_not_the_image():
    a = build_problem("simulated", image_size=32, seed=0)
    b = build_problem("simulated", image_size=32, seed=1)
    assert torch.equal(a.x_true, b.x_true)
    assert not torch.equal(a.y, b.y)


def test_multiframe_frames_differ():
    frames = list(build_problem("multiframe_superres", image_size=32, num_operators=2, noise_level=0.0).y)
    assert not torch.allclose(frames[0], frames[1])


def test_noise_level_is_the_measurement_noise():
    p = build_problem("simulated", image_size=64, operator="inpainting", noise_level=0.05)
    clean = p.physics.A(p.x_true)
    assert abs(float((p.y - clean).std()) - 0.05) < 0.005


def test_large_images_are_mirror_tiled_not_upsampled():
    img = natural_image(600)  # the bundled astronaut is 512 x 512
    assert tuple(img.shape) == (1, 3, 600, 600)
    assert torch.equal(img[..., 512:520, :], img[..., 504:512, :].flip(-2))
    assert fit_to_size(torch.ones(8, 8, 1).numpy(), 4).shape == (4, 4, 1)


@pytest.mark.parametrize(
    "kind, params, match",
    [
        (
            "simulated",
            {"operator": "motion"},
            "operator must be one of 'blur', 'downsampling', 'inpainting', got 'motion'",
        ),
        ("simulated", {"image_size": 33, "operator": "downsampling"}, "image_size must be even, got 33"),
        ("simulated", {"image_size": 8}, "image_size must be an integer >= 16, got 8"),
        ("simulated", {"noise_level": -0.1}, "noise_level must be a finite number >= 0 and <= 1, got -0.1"),
        ("simulated", {"blur_sigma": 2}, r"unknown parameter\(s\) \['blur_sigma'\] for problem 'simulated'"),
        ("multiframe_superres", {"num_operators": 0}, "num_operators must be an integer >= 1 and <= 256, got 0"),
        ("multiframe_superres", {"image_size": 30, "scale": 4}, "image_size must be a multiple of scale=4, got 30"),
        ("tomography_2d", {"num_angles": 2.5}, "num_angles must be an integer"),
        ("tomography_2d", {"image": "astronaut"}, "image must be one of 'phantom', 'camera', got 'astronaut'"),
        ("denoising_3d", {"volume_size": True}, "volume_size must be an integer"),
        ("mri", {}, "problem kind must be one of"),
        ("simulated", {"seed": -1}, "^seed must be an integer >= 0, got -1$"),
        ("denoising_3d", {"seed": -1}, "^seed must be an integer >= 0, got -1$"),
    ],
)
def test_bad_parameters_raise_value_error(kind, params, match):
    with pytest.raises(ValueError, match=match):
        build_problem(kind, **params)


@pytest.mark.parametrize("kind", ["simulated", "multiframe_superres", "tomography_2d", "denoising_3d", "training"])
def test_one_noise_level_rule_for_every_problem_and_training_set(kind):
    # scopebench.imaging.common.images.check_noise_level: the signals are in [0, 1], so is the noise's std.
    from scopebench.imaging.inference.problems import make_spec
    from scopebench.imaging.training.data import TrainingDataSpec

    build = (lambda **kw: TrainingDataSpec(**kw)) if kind == "training" else (lambda **kw: make_spec(kind, **kw))
    assert build(noise_level=1).noise_level == 1.0
    with pytest.raises(ValueError, match=r"^noise_level must be a finite number >= 0 and <= 1, got 1.5$"):
        build(noise_level=1.5)
