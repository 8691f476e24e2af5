"""The PnP engine: it reconstructs, it is deepinv's PGD, and its settings are validated."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from scopebench.imaging.common.metrics import psnr
from scopebench.imaging.inference.engine import PnPEngine, ReconstructionConfig, build_engine
from scopebench.imaging.inference.problems import build_problem
from scopebench.imaging.inference.run import reconstruct, throughput_metrics

BLUR = {"kind": "simulated", "image_size": 64, "operator": "blur", "noise_level": 0.03}


class Regions:
    """The smallest profiler stand-in: records which regions ran, in order."""

    def __init__(self):
        self.names = []

    def track_step(self, name):
        self.names.append(name)
        return nullcontext()


def _engine(spec=BLUR, **config):
    spec = dict(spec)
    return PnPEngine(build_problem(spec.pop("kind"), **spec), ReconstructionConfig(**config))


def test_tv_pnp_improves_psnr_by_3db_and_is_deepinv_pgd():
    import deepinv as dinv

    engine = _engine(denoiser="tv", denoiser_sigma=0.005)
    start = psnr(engine.x, engine.problem.x_true)
    regions = Regions()
    for _ in range(30):
        engine.step(regions)
    ours = psnr(engine.x, engine.problem.x_true)
    assert ours - start >= 3.0
    assert regions.names[:4] == ["gradient", "denoise", "gradient", "denoise"]

    # The same prior, step and sigma through deepinv's own proximal gradient descent.
    problem = build_problem("simulated", image_size=64, operator="blur", noise_level=0.03)
    pgd = dinv.optim.PGD(
        data_fidelity=dinv.optim.L2(),
        prior=dinv.optim.PnP(dinv.models.TVDenoiser(n_it_max=50, crit=1e-6)),
        stepsize=engine.gamma,
        g_param=0.005,
        max_iter=30,
        early_stop=False,
    )
    with torch.no_grad():
        reference = pgd(problem.y, problem.physics)
    assert abs(psnr(reference, problem.x_true) - ours) < 0.1


def test_step_size_defaults_to_inverse_lipschitz_and_accepts_ints():
    auto = _engine(step_size_scale=0.5)
    assert auto.gamma == pytest.approx(0.5 / auto.lipschitz())
    assert _engine(step_size=2, step_size_scale=0.25).gamma == 0.5


@pytest.mark.parametrize("init", ["zeros", "adjoint", "pseudo_inverse"])
def test_init_methods(init):
    spec = {"kind": "simulated", "image_size": 32, "operator": "downsampling"}
    engine = _engine(spec, init_method=init)
    assert engine.x.shape == engine.problem.x_true.shape
    if init == "zeros":
        assert not engine.x.any()
    if init == "pseudo_inverse":
        # A least-squares solution fits the data far better than the zero image does.
        y = engine.problem.y
        assert (engine.problem.physics.A(engine.x) - y).norm() < 0.1 * y.norm()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"init_method": "random"},
            "init_method must be one of 'zeros', 'adjoint', 'pseudo_inverse', got 'random'",
        ),
        ({"compile": "all"}, "compile must be one of 'none', 'denoiser', 'physics', 'both', got 'all'"),
        ({"step_size": -1}, "step_size must be a finite number > 0, got -1"),
        ({"step_size_scale": 0}, "step_size_scale must be a finite number > 0, got 0"),
        ({"patch_size": 2}, "patch_size must be an integer >= 4, got 2"),
        ({"overlap": -1}, "overlap must be an integer >= 0, got -1"),
        ({"patch_size": 16, "overlap": 16}, "^overlap=16 must be smaller than patch_size=16"),
        ({"distribute_physics": "yes"}, "distribute_physics must be true or false, got 'yes'"),
        ({"device": "tpu"}, "device must be 'auto', 'cpu' or 'cuda', got 'tpu'"),
        ({"denoiser": "dncnn"}, "denoiser='dncnn' needs weights"),
    ],
)
def test_bad_settings_raise_before_anything_runs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReconstructionConfig(**kwargs)


def test_the_denoiser_config_is_built_once_and_the_engine_takes_the_validated_config():
    # The denoiser's config (and its weights file) was validated four times per cell: by
    # each ReconstructionConfig built from the same values, and again by the engine.
    config = ReconstructionConfig(denoiser="tv", denoiser_sigma=0.02, device="cpu")
    assert config.denoiser_config() is config.denoiser_config()
    assert config.denoiser_config().sigma == 0.02
    engine = build_engine({"kind": "simulated", "image_size": 32, "operator": "blur"}, config, task="denoise")
    assert engine.config is config


def test_boolean_spellings_from_benchopt_selectors():
    assert ReconstructionConfig(distribute_denoiser="true").distribute_denoiser is True


def test_local_tiling_runs_on_one_process():
    engine = _engine(BLUR, patch_size=32, overlap=8)
    engine.step(Regions())
    assert engine.static_metrics()["num_patches"] == 4


def test_denoiser_task_counts_flops_and_bytes():
    spec = {"kind": "simulated", "image_size": 32}
    x, metrics = reconstruct(spec, {"denoiser": "dncnn", "pretrained": "none"}, num_iterations=2, task="denoise")
    assert metrics["flops_per_iter"] > 1e8 and metrics["bytes_per_iter"] > 1e6
    assert metrics["achieved_gflop_per_sec"] == pytest.approx(
        metrics["flops_per_iter"] / metrics["denoise_time_sec"] / 1e9
    )
    assert "gradient_time_sec" not in metrics and x.shape == (1, 3, 32, 32)
    # TV is element-wise only: FLOPs unknown (absent), never a fake 0.
    _, tv = reconstruct(spec, {"denoiser": "tv"}, num_iterations=1, task="denoise")
    assert "flops_per_iter" not in tv and "achieved_gflop_per_sec" not in tv and tv["bytes_per_iter"] > 0
    assert throughput_metrics({"flops_per_iter": 1e9}, {}) == {}


def test_volume_reconstruction_with_a_3d_denoiser():
    spec = {"kind": "denoising_3d", "volume_size": 16, "noise_level": 0.1}
    x, metrics = reconstruct(
        spec, {"denoiser": "tv", "denoiser_sigma": 0.05, "patch_size": 8, "overlap": 2}, num_iterations=3
    )
    truth = build_problem("denoising_3d", volume_size=16, noise_level=0.1)
    assert psnr(x, truth.x_true) > psnr(truth.y, truth.x_true)
    assert metrics["num_patches"] == 8


@pytest.mark.slow
def test_compile_reports_its_first_call_apart_from_steady_state():
    spec = {"kind": "simulated", "image_size": 32}
    _, metrics = reconstruct(spec, {"denoiser": "dncnn", "pretrained": "none", "compile": "denoiser"}, num_iterations=3)
    assert metrics["compile_time_sec"] > 0
    # Steady-state iterations exclude the compilation, which costs far more.
    assert metrics["total_time_sec"] < metrics["compile_time_sec"]
    _, eager = reconstruct(spec, {"denoiser": "dncnn", "pretrained": "none"}, num_iterations=1)
    assert "compile_time_sec" not in eager
