"""FLOPs of the pi05 policy, computed from its config.

Only matrix multiplications are counted (linear layers, the patch convolution, and the
two attention products); norms, activations, softmax, biases, rotary embeddings and
embedding lookups are O(tokens x width) and left out, as in the usual 6ND accounting.

Conventions, for ``B`` samples:

- A linear layer with ``K x N`` weights applied to ``T`` tokens costs ``2 T K N``.
- Attention with ``H`` heads of size ``hd``, ``Tq`` queries and ``Tk`` keys costs
  ``4 H hd Tq Tk`` (scores and weighted sum). Masked entries are counted, because the
  dense kernels compute them; ``Tk`` is every key of the joint sequence.
- Modulations of the adaptive norms and the time MLP run once per sample, not per token.
- A training step is 3 x one training forward (the backward costs about twice the
  forward), whatever is frozen. The training forward runs the vision tower, the prefix
  (with the discrete action block when ``ce_weight > 0``) and the expert jointly.
- A ``sample_actions`` call is ``F + N * s``: ``F`` = vision + prefix prefill,
  ``s`` = one expert step over ``chunk_size`` tokens reading the cached prefix.
"""

from __future__ import annotations

from scopebench.policy.pi05.config import Pi05Config

MODES = ("train", "forward", "inference")


def _decoder_token_flops(cfg: Pi05Config, width: int, mlp_dim: int) -> int:
    """Matmul FLOPs of one decoder layer's projections and MLP for one token."""
    q_and_o = 2 * width * cfg.num_heads * cfg.head_dim
    k_and_v = 2 * width * cfg.num_kv_heads * cfg.head_dim
    return 2 * (q_and_o + k_and_v + 3 * width * mlp_dim)


def _attention_flops(cfg: Pi05Config, num_queries: int, num_keys: int) -> int:
    """Both attention products of one layer of the shared trunk."""
    return 4 * cfg.num_heads * cfg.head_dim * num_queries * num_keys


def vision_flops(cfg: Pi05Config) -> int:
    """Per sample: every camera through the ViT and the projector."""
    v = cfg.vision
    p = v.num_patches
    patch = 2 * p * 3 * v.patch_size**2 * v.width
    per_block = 2 * p * (4 * v.width**2 + 2 * v.width * v.mlp_dim) + 4 * p * p * v.width
    projector = 2 * p * v.width * cfg.width
    return cfg.num_cameras * (patch + v.depth * per_block + projector)


def prefix_flops(cfg: Pi05Config, num_keys_extra: int = 0, with_discrete: bool = False) -> int:
    """Per sample: the prefix tower's projections and its queries' attention.

    Args:
        num_keys_extra: keys beyond the prefix seen by prefix queries (the joint
            sequence in training).
        with_discrete: include the discrete action block and its head.
    """
    tp = cfg.prefix_len(with_discrete)
    per_layer = tp * _decoder_token_flops(cfg, cfg.width, cfg.mlp_dim)
    per_layer += _attention_flops(cfg, tp, tp + num_keys_extra)
    head = 2 * cfg.discrete_action_len * cfg.width * cfg.action_bins if with_discrete else 0
    return cfg.depth * per_layer + head


def expert_flops(cfg: Pi05Config, num_prefix_keys: int) -> int:
    """Per sample: one expert pass over ``chunk_size`` tokens (one denoising step)."""
    s, we = cfg.chunk_size, cfg.expert_width
    per_layer = s * _decoder_token_flops(cfg, we, cfg.expert_mlp_dim)
    per_layer += _attention_flops(cfg, s, num_prefix_keys + s)
    modulations = (2 * cfg.depth + 1) * 2 * we * 3 * we  # adaptive norms, once per sample
    time_mlp = 2 * 2 * we * we
    in_out = 2 * 2 * s * cfg.action_dim * we
    return cfg.depth * per_layer + modulations + time_mlp + in_out


def flops_breakdown(cfg: Pi05Config) -> dict[str, int]:
    """Per-sample FLOPs of the parts that :func:`estimate_flops` adds up.

    Returns:
        ``vision``, ``prefill`` (prefix without discrete tokens), ``expert_step``
        (inference), ``train_forward`` (one training forward).
    """
    tp = cfg.prefix_len(False)
    use_ce, use_mse = cfg.ce_weight > 0, cfg.mse_weight > 0
    tp_train = cfg.prefix_len(use_ce)
    train_forward = vision_flops(cfg) + prefix_flops(
        cfg, num_keys_extra=cfg.chunk_size if use_mse else 0, with_discrete=use_ce
    )
    if use_mse:
        train_forward += expert_flops(cfg, tp_train)
    return {
        "vision": vision_flops(cfg),
        "prefill": vision_flops(cfg) + prefix_flops(cfg),
        "expert_step": expert_flops(cfg, tp),
        "train_forward": train_forward,
    }


def estimate_flops(cfg: Pi05Config, batch_size: int, mode: str = "train", num_steps: int = 10) -> int:
    """Matmul FLOPs for a batch.

    ``train`` = 3 x ``forward``; ``forward`` = one training forward;
    ``inference`` = ``B * (prefill + num_steps * expert_step)``.

    Args:
        cfg: the policy config.
        batch_size: samples B.
        mode: ``train``, ``forward`` or ``inference``.
        num_steps: Euler steps (``inference`` only).

    Returns:
        FLOPs as an int.

    :Examples:

    >>> from scopebench.policy.pi05.config import make_config
    >>> cfg = make_config("tiny")
    >>> estimate_flops(cfg, 2, "train") == 3 * estimate_flops(cfg, 2, "forward")
    True
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if batch_size < 1 or num_steps < 1:
        raise ValueError(f"batch_size and num_steps must be >= 1, got {batch_size} and {num_steps}")
    parts = flops_breakdown(cfg)
    if mode == "inference":
        return batch_size * (parts["prefill"] + num_steps * parts["expert_step"])
    forward = batch_size * parts["train_forward"]
    return 3 * forward if mode == "train" else forward
