"""Configuration of the pi05 policy: one validated dataclass per component, and presets.

Three presets share one architecture and differ only in sizes:

- ``tiny``: under 2 M parameters, 32 px images; for unit tests.
- ``small``: about 40 M parameters; CPU demos and the CPU speed benchmark.
- ``pi05``: the real sizes (Gemma-2B prefix, SigLIP-So400m/14 at 224 px, a 1024-wide
  18-layer action expert), about 3.3 B parameters. Build it under
  ``with torch.device("meta"):`` to count parameters or FLOPs without memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scopebench.validate import choice, flag, integer, number

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
DTYPES = ("float32", "bfloat16", "float16")
_FLAGS = (
    "discrete_state",
    "knowledge_insulation",
    "gradient_checkpointing",
    "freeze_vision_encoder",
    "train_expert_only",
)


def _check_positive(obj: Any, *names: str) -> None:
    """``ValueError`` (from :func:`scopebench.validate.integer`) for the first field in
    ``names`` that is not an integer >= 1, named ``<Class>.<field>``."""
    for name in names:
        integer(f"{type(obj).__name__}.{name}", getattr(obj, name), low=1)


@dataclass(kw_only=True)
class VisionConfig:
    """A SigLIP-style ViT applied to every camera image independently."""

    image_size: int = 224
    """Side of the square input image in pixels; images are resized to it."""
    patch_size: int = 14
    """Side of a square patch; ``image_size`` must be a multiple of it."""
    width: int = 1152
    """Hidden size of the ViT."""
    depth: int = 27
    """Number of pre-norm transformer blocks."""
    num_heads: int = 16
    """Attention heads; ``width`` must be a multiple of it."""
    mlp_dim: int = 4304
    """Hidden size of the GELU-tanh MLP."""

    def __post_init__(self) -> None:
        _check_positive(self, "image_size", "patch_size", "width", "depth")
        _check_positive(self, "num_heads", "mlp_dim")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"VisionConfig.image_size must be a multiple of patch_size=" f"{self.patch_size}, got {self.image_size}"
            )
        if self.width % self.num_heads:
            raise ValueError(
                f"VisionConfig.width must be a multiple of num_heads={self.num_heads}, " f"got {self.width}"
            )

    @property
    def num_patches(self) -> int:
        """Image tokens per camera."""
        return (self.image_size // self.patch_size) ** 2


@dataclass(kw_only=True)
class Pi05Config:
    """The whole policy: vision tower, prefix decoder, action expert, losses, options."""

    vision: VisionConfig = field(default_factory=VisionConfig)
    """The per-camera image encoder."""

    # --- prefix decoder (Gemma-style) ---
    width: int = 2048
    """Hidden size of the prefix decoder."""
    depth: int = 18
    """Layers of the prefix decoder; the action expert has the same number."""
    num_heads: int = 8
    """Query heads, shared by both towers (their attention is joint)."""
    num_kv_heads: int = 1
    """Key/value heads, shared by both towers; 1 is multi-query attention."""
    head_dim: int = 256
    """Size of one attention head, shared by both towers."""
    mlp_dim: int = 16384
    """Hidden size of the prefix GeGLU MLP."""
    vocab_size: int = 257152
    """Token vocabulary; its last ids are reserved for state and action bins."""

    # --- action expert (Gemma-style with adaptive RMSNorm) ---
    expert_width: int = 1024
    """Hidden size of the action expert."""
    expert_mlp_dim: int = 4096
    """Hidden size of the action expert's GeGLU MLP."""

    # --- inputs and outputs ---
    num_cameras: int = 2
    """Camera images per observation."""
    prompt_max_length: int = 48
    """Prompt tokens after padding or truncation."""
    state_dim: int = 32
    """Size of the proprioceptive state vector (shorter states are zero-padded)."""
    action_dim: int = 32
    """Size of one action vector (shorter actions are zero-padded)."""
    chunk_size: int = 50
    """Actions predicted per call (the action expert's sequence length)."""
    discrete_state: bool = True
    """Append the binned state as tokens after the prompt, as pi05 does."""
    state_bins: int = 256
    """Bins of the discretised state (values clipped to [-1, 1])."""
    action_bins: int = 256
    """Bins of the discrete action tokens (values clipped to [-1, 1])."""
    discrete_action_steps: int = 5
    """Time segments of the discrete action block; it holds
    ``discrete_action_steps * action_dim`` tokens (a fixed-length stand-in for FAST)."""

    # --- training ---
    mse_weight: float = 1.0
    """Weight of the flow-matching MSE in the loss."""
    ce_weight: float = 1.0
    """Weight of the discrete-action cross-entropy; 0 skips that branch entirely."""
    knowledge_insulation: bool = False
    """Detach the prefix keys and values seen by the expert, so the flow-matching loss
    does not train the prefix (pi05's knowledge insulation)."""
    num_inference_steps: int = 10
    """Default Euler steps of ``sample_actions``."""

    # --- implementation options ---
    rope_theta: float = 10_000.0
    """Base of the rotary position embedding."""
    rms_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    gradient_checkpointing: bool = False
    """Recompute each joint layer in the backward pass to save activation memory."""
    attention_implementation: str = "sdpa"
    """``sdpa`` (torch's fused kernel) or ``eager`` (explicit softmax, for checking)."""
    freeze_vision_encoder: bool = False
    """Exclude the vision tower from training."""
    train_expert_only: bool = False
    """Train only the action expert (and the discrete head); freezes the prefix."""
    dtype: str = "float32"
    """Parameter dtype: ``float32``, ``bfloat16`` or ``float16``."""

    def __post_init__(self) -> None:
        if isinstance(self.vision, dict):
            self.vision = VisionConfig(**self.vision)
        if not isinstance(self.vision, VisionConfig):
            raise ValueError(f"Pi05Config.vision must be a VisionConfig or dict, got {self.vision!r}")
        _check_positive(self, "width", "depth", "num_heads", "num_kv_heads", "head_dim")
        _check_positive(self, "mlp_dim", "vocab_size", "expert_width", "expert_mlp_dim")
        _check_positive(self, "num_cameras", "prompt_max_length", "state_dim")
        _check_positive(self, "action_dim", "chunk_size", "state_bins", "action_bins")
        _check_positive(self, "discrete_action_steps", "num_inference_steps")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"Pi05Config.num_heads must be a multiple of num_kv_heads=" f"{self.num_kv_heads}, got {self.num_heads}"
            )
        if self.discrete_action_steps > self.chunk_size:
            raise ValueError(
                f"Pi05Config.discrete_action_steps must be at most chunk_size="
                f"{self.chunk_size}, got {self.discrete_action_steps}"
            )
        if self.text_vocab_size < 3:
            raise ValueError(
                f"Pi05Config.vocab_size must exceed the {self.num_reserved_tokens} "
                f"reserved state/action ids by at least 3, got {self.vocab_size}"
            )
        for name in ("head_dim", "expert_width"):
            if getattr(self, name) % 2:
                raise ValueError(
                    f"Pi05Config.{name} must be even (rotary and sinusoidal embeddings "
                    f"pair up channels), got {getattr(self, name)}"
                )
        for name in ("mse_weight", "ce_weight"):
            setattr(self, name, number(f"Pi05Config.{name}", getattr(self, name), low=0))
        if self.mse_weight == 0 and self.ce_weight == 0:
            raise ValueError("Pi05Config.mse_weight and ce_weight are both 0: no loss")
        for name in _FLAGS:
            flag(f"Pi05Config.{name}", getattr(self, name))
        choice("Pi05Config.attention_implementation", self.attention_implementation, ATTENTION_IMPLEMENTATIONS)
        choice("Pi05Config.dtype", self.dtype, DTYPES)
        for name in ("rope_theta", "rms_eps"):
            setattr(self, name, number(f"Pi05Config.{name}", getattr(self, name), low=0, low_open=True))

    # Token-id layout: [0 = pad | text ids | begin-of-actions | action bins | state bins].
    @property
    def num_reserved_tokens(self) -> int:
        """Ids at the end of the vocabulary used by state bins, action bins and BOA."""
        return self.state_bins + self.action_bins + 1

    @property
    def text_vocab_size(self) -> int:
        """Ids available to prompt text (id 0 is padding)."""
        return self.vocab_size - self.num_reserved_tokens

    @property
    def discrete_action_len(self) -> int:
        """Tokens in the discrete action block."""
        return self.discrete_action_steps * self.action_dim

    @property
    def state_len(self) -> int:
        """State tokens in the prefix (0 when the state is not tokenised)."""
        return self.state_dim if self.discrete_state else 0

    def prefix_len(self, with_discrete_actions: bool = False) -> int:
        """Tokens in the prefix: images, prompt, state and optionally discrete actions."""
        n = self.num_cameras * self.vision.num_patches + self.prompt_max_length
        n += self.state_len
        return n + (self.discrete_action_len if with_discrete_actions else 0)


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vision=dict(image_size=32, patch_size=8, width=64, depth=2, num_heads=4, mlp_dim=128),
        width=64,
        depth=2,
        num_heads=4,
        num_kv_heads=1,
        head_dim=16,
        mlp_dim=128,
        vocab_size=512,
        expert_width=32,
        expert_mlp_dim=64,
        num_cameras=2,
        prompt_max_length=12,
        state_dim=6,
        action_dim=6,
        chunk_size=8,
        state_bins=32,
        action_bins=32,
        discrete_action_steps=2,
    ),
    # Widths of 256-2048 and ~110-180 tokens per sample: a training batch of 8 gives
    # matmuls of about 1000 x 512 x 2048, large enough that a CPU spends its time in
    # BLAS rather than in the Python dispatcher (see perf/policy_speed.py).
    "small": dict(
        vision=dict(image_size=96, patch_size=16, width=384, depth=6, num_heads=6, mlp_dim=1536),
        width=512,
        depth=6,
        num_heads=8,
        num_kv_heads=1,
        head_dim=64,
        mlp_dim=2048,
        vocab_size=8192,
        expert_width=256,
        expert_mlp_dim=1024,
        num_cameras=2,
        prompt_max_length=24,
        state_dim=14,
        action_dim=14,
        chunk_size=16,
        state_bins=64,
        action_bins=64,
        discrete_action_steps=4,
    ),
    "pi05": dict(),  # the dataclass defaults are the real pi05 sizes
}


def make_config(preset: str, **overrides: Any) -> Pi05Config:
    """Build a validated config from a preset name and field overrides.

    Args:
        preset: ``tiny``, ``small`` or ``pi05``.
        **overrides: fields of :class:`Pi05Config`; ``vision`` may be a dict of
            :class:`VisionConfig` fields, merged into the preset's.

    Returns:
        The config.

    Raises:
        ValueError: unknown preset or field, or an invalid value.

    :Examples:

    >>> make_config("tiny", chunk_size=4).chunk_size
    4
    >>> make_config("tiny", vision={"depth": 1}).vision.depth
    1
    """
    choice("preset", preset, PRESETS)
    known = {f.name for f in dataclasses.fields(Pi05Config)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown Pi05Config field(s) {unknown}; expected some of {sorted(known)}")
    values = dict(PRESETS[preset])
    vision = dict(values.pop("vision", {}))
    override_vision = overrides.pop("vision", None)
    if isinstance(override_vision, VisionConfig):
        vision = dataclasses.asdict(override_vision)
    elif override_vision is not None:
        vision.update(override_vision)
    values.update(overrides)
    return Pi05Config(vision=VisionConfig(**vision), **values)
