"""Inverse problems built from plain parameters: ground truth, linear physics, data.

:func:`build_problem` is deterministic given its parameters (the seed included), so a
spawned rank or a SLURM task rebuilds exactly the problem rank 0 holds from the dataset
name and a few numbers — tensors and physics objects are never pickled across ranks.

Kinds (one validated spec dataclass each):

* ``simulated``: a bundled natural colour image, one operator (``blur``,
  ``downsampling`` or ``inpainting``), white Gaussian noise.
* ``multiframe_superres``: ``num_operators`` frames of one colour image, each blurred by
  its own anisotropic kernel, shifted by a sub-pixel phase and decimated by ``scale``
  (a stack of linear operators, one per frame).
* ``tomography_2d``: parallel-beam Radon transform (deepinv's torch implementation) of
  the Shepp-Logan phantom or a natural grey image.
* ``denoising_3d``: a synthetic volume and the identity operator.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from scopebench.imaging.common.images import (
    NATURAL_IMAGES,
    check_noise_level,
    natural_image,
    phantom_image,
    synthetic_volume,
)
from scopebench.validate import choice, integer

__all__ = [
    "PROBLEM_KINDS",
    "Problem",
    "SimulatedSpec",
    "MultiframeSpec",
    "TomographySpec",
    "Denoising3DSpec",
    "build_problem",
    "describe_problem",
    "make_spec",
]

OPERATORS = ("blur", "downsampling", "inpainting")


def _check_shared(spec: Any, images: Any = None) -> None:
    """The last fields every problem spec holds, checked one way: ``noise_level``, ``seed``
    and (for pictures) ``image`` among ``images``."""
    object.__setattr__(spec, "noise_level", check_noise_level(spec.noise_level))
    integer("seed", spec.seed, low=0)
    if images is not None:
        choice("image", spec.image, images)


@dataclass(frozen=True, kw_only=True)
class SimulatedSpec:
    """A natural image degraded by one operator and Gaussian noise."""

    image_size: int = 64
    """Side of the square image in pixels (>= 16)."""
    operator: str = "blur"
    """``blur`` (Gaussian, std 2 px), ``downsampling`` (x2, Gaussian anti-alias) or
    ``inpainting`` (half of the pixels kept)."""
    noise_level: float = 0.03
    """Standard deviation of the white Gaussian noise (image range [0, 1])."""
    seed: int = 0
    """Seed of the noise and of the inpainting mask."""
    image: str = "astronaut"
    """Bundled scikit-image picture."""

    def __post_init__(self) -> None:
        integer("image_size", self.image_size, low=16)
        choice("operator", self.operator, OPERATORS)
        if self.operator == "downsampling" and self.image_size % 2:
            raise ValueError(
                f"operator='downsampling' halves the image: image_size must be even, got {self.image_size}"
            )
        _check_shared(self, sorted(NATURAL_IMAGES))


@dataclass(frozen=True, kw_only=True)
class MultiframeSpec:
    """Several blurred, shifted, decimated noisy frames of one colour image."""

    image_size: int = 64
    """Side of the high-resolution square image (a multiple of ``scale``)."""
    num_operators: int = 4
    """Number of low-resolution frames, one linear operator each."""
    scale: int = 2
    """Decimation factor of every frame."""
    noise_level: float = 0.02
    """Standard deviation of the Gaussian noise on every frame."""
    seed: int = 0
    """Seed of the noise."""
    image: str = "astronaut"
    """Bundled scikit-image picture."""

    def __post_init__(self) -> None:
        integer("image_size", self.image_size, low=16)
        integer("num_operators", self.num_operators, low=1, high=256)
        integer("scale", self.scale, low=1, high=8)
        if self.image_size % self.scale:
            raise ValueError(f"image_size must be a multiple of scale={self.scale}, got {self.image_size}")
        _check_shared(self, sorted(NATURAL_IMAGES))


@dataclass(frozen=True, kw_only=True)
class TomographySpec:
    """Parallel-beam tomography of a phantom or a grey natural image."""

    image_size: int = 64
    """Side of the square image in pixels."""
    num_angles: int = 60
    """Number of projection angles, evenly spaced over [0, 180) degrees."""
    noise_level: float = 0.01
    """Standard deviation of the Gaussian noise on the (normalised) sinogram."""
    seed: int = 0
    """Seed of the noise."""
    image: str = "phantom"
    """``phantom`` (Shepp-Logan) or ``camera`` (bundled grey photograph)."""

    def __post_init__(self) -> None:
        integer("image_size", self.image_size, low=16)
        integer("num_angles", self.num_angles, low=1, high=4096)
        _check_shared(self, ("phantom", "camera"))


@dataclass(frozen=True, kw_only=True)
class Denoising3DSpec:
    """A synthetic volume with white Gaussian noise (identity operator)."""

    volume_size: int = 32
    """Side of the cubic volume in voxels."""
    noise_level: float = 0.1
    """Standard deviation of the Gaussian noise."""
    seed: int = 0
    """Seed of the volume's shapes and of the noise."""

    def __post_init__(self) -> None:
        integer("volume_size", self.volume_size, low=8, high=1024)
        _check_shared(self)


PROBLEM_KINDS: dict[str, type] = {
    "simulated": SimulatedSpec,
    "multiframe_superres": MultiframeSpec,
    "tomography_2d": TomographySpec,
    "denoising_3d": Denoising3DSpec,
}


def make_spec(kind: str, **params: Any):
    """Validated spec of ``kind``; unknown keys and bad values raise ``ValueError``."""
    choice("problem kind", kind, sorted(PROBLEM_KINDS))
    cls = PROBLEM_KINDS[kind]
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for problem {kind!r}; allowed: {allowed}")
    return cls(**params)


def describe_problem(kind: str, **params: Any) -> tuple[tuple[int, ...], int]:
    """``(signal shape (1, C, *spatial), number of operators)`` without building anything.

    :Examples:
        >>> describe_problem("multiframe_superres", image_size=32, num_operators=3)
        ((1, 3, 32, 32), 3)
        >>> describe_problem("denoising_3d", volume_size=16)
        ((1, 1, 16, 16, 16), 1)
    """
    spec = make_spec(kind, **params)
    if kind == "denoising_3d":
        return (1, 1, *(3 * (spec.volume_size,))), 1
    if kind == "tomography_2d":
        return (1, 1, spec.image_size, spec.image_size), 1
    channels = NATURAL_IMAGES[spec.image]
    operators = spec.num_operators if kind == "multiframe_superres" else 1
    return (1, channels, spec.image_size, spec.image_size), operators


@dataclass
class Problem:
    """One inverse problem: what the solver sees and what the objective scores against."""

    kind: str
    """Key of :data:`PROBLEM_KINDS`."""
    params: dict
    """The validated plain parameters (JSON-serialisable) that rebuild this problem."""
    x_true: torch.Tensor
    """Ground truth, ``(1, C, H, W)`` or ``(1, 1, D, H, W)``, in [0, 1]."""
    operators: list
    """The linear operators, one per measurement (one for single-operator problems)."""
    y: Any
    """Measurements: a tensor, or a ``TensorList`` with one entry per operator."""
    noise_level: float
    """Standard deviation of the noise added to the measurements."""
    physics: Any = field(default=None)
    """The operators as one deepinv ``LinearPhysics`` (stacked when there are several)."""

    @property
    def num_operators(self) -> int:
        return len(self.operators)

    @property
    def spatial_dims(self) -> int:
        """2 for images, 3 for volumes."""
        return self.x_true.ndim - 2

    @property
    def channels(self) -> int:
        return int(self.x_true.shape[1])

    @property
    def spec(self) -> dict:
        """``{"kind": ..., **params}``: everything :func:`build_problem` needs."""
        return {"kind": self.kind, **self.params}

    def noisy_image(self) -> torch.Tensor:
        """The ground truth plus noise of the problem's level, for denoiser-only runs.

        For identity physics this is the measurement itself; otherwise fresh noise drawn
        from the problem's seed + 1 (deterministic on every rank).
        """
        if self.kind == "denoising_3d":
            return self.y
        gen = torch.Generator().manual_seed(int(self.params.get("seed", 0)) + 1)
        noise = torch.randn(self.x_true.shape, generator=gen, dtype=self.x_true.dtype)
        return self.x_true + self.noise_level * noise.to(self.x_true.device)

    def to(self, device: Any) -> Problem:
        self.x_true = self.x_true.to(device)
        self.operators = [op.to(device) for op in self.operators]
        self.physics = self.physics.to(device)
        self.y = self.y.to(device)
        return self


def _add_noise(clean: torch.Tensor, sigma: float, gen: torch.Generator) -> torch.Tensor:
    return clean + sigma * torch.randn(clean.shape, generator=gen, dtype=clean.dtype)


def _build_simulated(spec: SimulatedSpec):
    import deepinv as dinv

    x = natural_image(spec.image_size, spec.image)
    shape = tuple(x.shape[1:])
    gen = torch.Generator().manual_seed(spec.seed)
    if spec.operator == "blur":
        from deepinv.physics.functional import gaussian_blur

        op = dinv.physics.Blur(filter=gaussian_blur(sigma=(2.0, 2.0)), padding="circular")
    elif spec.operator == "downsampling":
        op = dinv.physics.Downsampling(img_size=shape, filter="gaussian", factor=2, padding="circular")
    else:
        mask = (torch.rand((1, 1, *shape[1:]), generator=gen) < 0.5).float().expand(1, *shape).clone()
        op = dinv.physics.Inpainting(img_size=shape, mask=mask)
    return x, [op]


def _frame_kernel(k: int, num: int, scale: int) -> torch.Tensor:
    from deepinv.physics.functional import gaussian_blur

    angle = 180.0 * k / max(num, 1)
    kernel = gaussian_blur(sigma=(1.0 + 0.5 * (k % 3), 0.7), angle=angle)
    # A different sampling phase per frame is what makes several frames worth more than one.
    shift = (k % scale, (k // scale) % scale)
    kernel = torch.nn.functional.pad(kernel, (scale, scale, scale, scale))
    return torch.roll(kernel, shifts=shift, dims=(-2, -1))


def _build_multiframe(spec: MultiframeSpec):
    import deepinv as dinv

    x = natural_image(spec.image_size, spec.image)
    shape = tuple(x.shape[1:])
    ops = [
        dinv.physics.Downsampling(
            img_size=shape,
            filter=_frame_kernel(k, spec.num_operators, spec.scale),
            factor=spec.scale,
            padding="circular",
        )
        for k in range(spec.num_operators)
    ]
    return x, ops


def _build_tomography(spec: TomographySpec):
    import deepinv as dinv

    x = phantom_image(spec.image_size) if spec.image == "phantom" else natural_image(spec.image_size, "camera")
    op = dinv.physics.Tomography(angles=spec.num_angles, img_width=spec.image_size, circle=False, normalize=True)
    return x, [op]


def _build_denoising_3d(spec: Denoising3DSpec):
    import deepinv as dinv

    return synthetic_volume(spec.volume_size, seed=spec.seed), [dinv.physics.Denoising()]


_BUILDERS = {
    "simulated": _build_simulated,
    "multiframe_superres": _build_multiframe,
    "tomography_2d": _build_tomography,
    "denoising_3d": _build_denoising_3d,
}


def build_problem(kind: str, **params: Any) -> Problem:
    """Build the problem ``kind`` from plain parameters, deterministically (on CPU).

    Identical on every call and every rank, to float rounding for ``tomography_2d``
    (torch's Radon transform sums in a thread-dependent order, ~1e-8).

    Args:
        kind: One of :data:`PROBLEM_KINDS`.
        **params: The kind's spec fields (see the spec dataclasses); missing ones take
            their defaults.

    Returns:
        A :class:`Problem` whose ``spec`` rebuilds it bit for bit.
    """
    import deepinv as dinv

    spec = make_spec(kind, **params)
    x, ops = _BUILDERS[kind](spec)
    gen = torch.Generator().manual_seed(spec.seed + 10_000)
    with torch.no_grad():
        clean = [op.A(x) for op in ops]
        noisy = [_add_noise(c, spec.noise_level, gen) for c in clean]
    if len(ops) == 1:
        physics, y = ops[0], noisy[0]
    else:
        physics, y = dinv.physics.StackedLinearPhysics(ops), dinv.utils.TensorList(noisy)
    return Problem(
        kind=kind,
        params=dataclasses.asdict(spec),
        x_true=x,
        operators=ops,
        y=y,
        noise_level=spec.noise_level,
        physics=physics,
    )
