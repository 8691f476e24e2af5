"""The building blocks of pi05: masks, attention, rotary and time embeddings, norms, and the layers.

Bottom-up, each small enough to read alone: the block-causal mask (the big_vision rule) and
its additive bias, attention over grouped key/value heads (``sdpa`` or ``eager``), rotary
position tables, the flow-matching time embedding, Gemma's RMSNorm and the action expert's
adaptive one, the SigLIP-style vision tower, and :class:`JointLayer`: a prefix block and an
expert block joined by one attention over both sequences. :mod:`scopebench.policy.pi05.model`
assembles them into the policy.

Nothing here knows about devices, distribution or profiling (STYLE.md rule 3).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from scopebench.policy.pi05.config import Pi05Config, VisionConfig

# ----------------------------------------------------------------------------- helpers


def make_att_2d_masks(pad_masks: torch.Tensor, att_masks: torch.Tensor) -> torch.Tensor:
    """Block-causal attention mask from padding and autoregressive flags (big_vision rule).

    Token ``i`` may attend to token ``j`` iff ``cumsum(att)[j] <= cumsum(att)[i]`` and both
    are real tokens. A run of zeros after a 1 forms a bidirectional block; a run of ones
    is causal.

    Args:
        pad_masks: (B, T) bool, True on real tokens.
        att_masks: (B, T) bool/int, 1 where a token starts a new block.

    Returns:
        (B, T, T) bool, ``[b, query, key]``.

    :Examples:

    >>> m = make_att_2d_masks(torch.ones(1, 4, dtype=torch.bool), torch.tensor([[0, 0, 1, 0]]))
    >>> m[0].int().tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    """
    if pad_masks.shape != att_masks.shape or pad_masks.ndim != 2:
        raise ValueError(
            f"expected pad_masks and att_masks of the same shape (B, T), got "
            f"{tuple(pad_masks.shape)} and {tuple(att_masks.shape)}"
        )
    cumsum = torch.cumsum(att_masks.long(), dim=1)  # (B, T)
    att_2d = cumsum[:, None, :] <= cumsum[:, :, None]
    pad_2d = pad_masks[:, None, :] & pad_masks[:, :, None]
    return att_2d & pad_2d


def mask_to_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (B, Tq, Tk), True = may attend -> additive bias (B, 1, Tq, Tk).

    A finite large negative rather than -inf: a fully padded query row then gets a
    uniform (ignored) distribution instead of NaNs that would poison the backward.
    """
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, torch.finfo(dtype).min)[:, None]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, impl: str) -> torch.Tensor:
    """Attention with grouped key/value heads and an additive mask.

    ``sdpa`` hands torch's kernel one K/V per query head (a free ``expand`` for a single
    key/value head, a copy for grouped ones). ``eager`` copies nothing: it stacks the
    ``H / KV`` query heads that share a key/value head along the query axis, so each
    product is one matmul per key/value head (in fp32).
    Which is faster depends on the device and the sizes: ``perf/attention_speed.py``
    times both on the CPU.

    Args:
        q: (B, H, Tq, hd); k, v: (B, KV, Tk, hd) with H a multiple of KV.
        bias: (B, 1, Tq, Tk) from :func:`mask_to_bias`, or None.
        impl: ``sdpa`` or ``eager``; the two agree to float rounding.

    Returns:
        (B, H, Tq, hd).
    """
    b, h, tq, hd = q.shape
    kv = k.shape[1]
    if impl == "sdpa":
        if kv != h:
            k = k.expand(-1, h, -1, -1) if kv == 1 else k.repeat_interleave(h // kv, dim=1)
            v = v.expand(-1, h, -1, -1) if kv == 1 else v.repeat_interleave(h // kv, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    tk = k.shape[2]
    grouped = (q.float() * hd**-0.5).reshape(b, kv, (h // kv) * tq, hd)  # head h reads kv head h // (H/KV)
    scores = (grouped @ k.float().transpose(-1, -2)).view(b, h, tq, tk)
    if bias is not None:
        scores = scores + bias.float()
    out = scores.softmax(dim=-1).view(b, kv, (h // kv) * tq, tk) @ v.float()  # (B, KV, H/KV * Tq, hd)
    return out.view(b, h, tq, hd).to(q.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for integer positions (B, T) -> cos, sin of shape (B, 1, T, head_dim)."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = theta**-exponent  # (hd/2,)
    angles = positions.float()[..., None] * inv_freq  # (B, T, hd/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, hd)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels (half-split convention of Gemma) by position angles."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def sinusoidal_time_embedding(time: torch.Tensor, dim: int) -> torch.Tensor:
    """Sine-cosine embedding of t in [0, 1] with periods from 4e-3 to 4 (as in pi0).

    Args:
        time: (B,) floats. dim: even output size.

    Returns:
        (B, dim) float32.
    """
    fraction = torch.linspace(0.0, 1.0, dim // 2, device=time.device, dtype=torch.float32)
    period = 4e-3 * (4.0 / 4e-3) ** fraction
    angles = time.float()[:, None] * (2 * math.pi / period)[None, :]  # (B, dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


# ------------------------------------------------------------------------------ layers


class RMSNorm(nn.Module):
    """Gemma RMSNorm: ``x / rms(x) * (1 + w)``, computed in float32, w starts at 0."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype), None


class AdaRMSNorm(nn.Module):
    """Adaptive RMSNorm of the action expert: scale, shift and a residual gate from a condition.

    The modulation starts at zero (as adaLN-Zero in DiT), so every expert block starts as
    the identity and the time condition is learned in.
    """

    def __init__(self, width: int, cond_dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.modulation = nn.Linear(cond_dim, 3 * width)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.modulation(cond)[:, None, :].float().chunk(3, dim=-1)  # (B, 1, D)
        return (normed * (1.0 + scale) + shift).to(x.dtype), gate.to(x.dtype)


class VisionBlock(nn.Module):
    """Pre-norm ViT block: LayerNorm -> MHA -> residual, LayerNorm -> GELU-tanh MLP -> residual."""

    def __init__(self, cfg: VisionConfig, impl: str) -> None:
        super().__init__()
        self.num_heads, self.impl = cfg.num_heads, impl
        self.ln1 = nn.LayerNorm(cfg.width, eps=1e-6)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.ln2 = nn.LayerNorm(cfg.width, eps=1e-6)
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, P, Dv)
        n, p, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(n, p, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (N, h, P, d/h)
        y = attention(q, k, v, None, self.impl).transpose(1, 2).reshape(n, p, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class VisionTower(nn.Module):
    """SigLIP-style ViT: patch embedding, learned positions, pre-norm blocks, final LayerNorm."""

    def __init__(self, cfg: VisionConfig, impl: str) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Conv2d(3, cfg.width, cfg.patch_size, stride=cfg.patch_size)
        self.pos_embed = nn.Parameter(torch.empty(cfg.num_patches, cfg.width))
        self.blocks = nn.ModuleList(VisionBlock(cfg, impl) for _ in range(cfg.depth))
        self.ln_post = nn.LayerNorm(cfg.width, eps=1e-6)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images (N, 3, S, S) in [0, 1] -> tokens (N, P, Dv)."""
        x = self.patch_embed(images * 2.0 - 1.0)  # SigLIP expects [-1, 1]; (N, Dv, S/p, S/p)
        x = x.flatten(2).transpose(1, 2) + self.pos_embed  # (N, P, Dv)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


class DecoderBlock(nn.Module):
    """One Gemma-style layer of one tower, split around the shared attention.

    ``qkv`` runs the input norm and the projections (with rotary embeddings);
    ``finish`` runs the output projection, the (gated) residuals and the GeGLU MLP.
    With ``adaptive=True`` the norms are :class:`AdaRMSNorm` and the residuals are gated.
    """

    def __init__(self, cfg: Pi05Config, width: int, mlp_dim: int, adaptive: bool) -> None:
        super().__init__()
        self.h, self.kv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        norm = (
            (lambda: AdaRMSNorm(width, cfg.expert_width, cfg.rms_eps))
            if adaptive
            else (lambda: RMSNorm(width, cfg.rms_eps))
        )
        self.input_norm, self.post_attention_norm = norm(), norm()
        self.q_proj = nn.Linear(width, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(width, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(width, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, width, bias=False)
        self.gate_proj = nn.Linear(width, mlp_dim, bias=False)
        self.up_proj = nn.Linear(width, mlp_dim, bias=False)
        self.down_proj = nn.Linear(mlp_dim, width, bias=False)

    def qkv(self, x: torch.Tensor, cond: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor):
        """(B, T, D) -> q (B, H, T, hd), k and v (B, KV, T, hd), residual gate or None."""
        b, t, _ = x.shape
        h, gate = self.input_norm(x, cond)
        q = self.q_proj(h).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, gate

    def finish(
        self, x: torch.Tensor, attn: torch.Tensor, gate: torch.Tensor | None, cond: torch.Tensor | None
    ) -> torch.Tensor:
        """Residual stream x (B, T, D) and attention output (B, H, T, hd) -> new x."""
        b, _, t, _ = attn.shape
        y = self.o_proj(attn.transpose(1, 2).reshape(b, t, self.h * self.hd))
        x = x + (y if gate is None else y * gate)
        h, gate = self.post_attention_norm(x, cond)
        y = self.down_proj(F.gelu(self.gate_proj(h), approximate="tanh") * self.up_proj(h))
        return x + (y if gate is None else y * gate)


class JointLayer(nn.Module):
    """A prefix block and an expert block joined by one attention over both sequences."""

    def __init__(self, cfg: Pi05Config) -> None:
        super().__init__()
        self.impl = cfg.attention_implementation
        self.prefix = DecoderBlock(cfg, cfg.width, cfg.mlp_dim, adaptive=False)
        self.expert = DecoderBlock(cfg, cfg.expert_width, cfg.expert_mlp_dim, adaptive=True)

    def forward(self, prefix_x, expert_x, cond, rope, bias, past_kv=None, insulate=False):
        """Run one layer on either tower or both.

        Args:
            prefix_x: (B, Tp, D) or None. expert_x: (B, Ts, De) or None.
            cond: (B, De) time condition (needed with ``expert_x``).
            rope: (cos, sin) for the concatenated new tokens, each (B, 1, Tp+Ts, hd).
            bias: (B, 1, Tq, Tk) additive mask over the new queries and all keys (cache
                first), from :func:`mask_to_bias`.
            past_kv: cached prefix (k, v), each (B, KV, Tc, hd), or None.
            insulate: the expert sees detached prefix keys/values (knowledge insulation).

        Returns:
            New ``prefix_x``, new ``expert_x`` and this layer's prefix (k, v) for a cache.
        """
        # 1. Each tower present normalises its stream and projects its own Q/K/V.
        towers = [
            (blk, x, c) for blk, x, c in ((self.prefix, prefix_x, None), (self.expert, expert_x, cond)) if x is not None
        ]
        sizes = [x.shape[1] for _, x, _ in towers]
        cos, sin = (r.split(sizes, dim=2) for r in rope)
        qs, ks, vs, gates = zip(*(blk.qkv(x, c, co, si) for (blk, x, c), co, si in zip(towers, cos, sin)))
        # 2. One attention over the concatenated sequence (cached prefix keys first).
        past_k, past_v = ([past_kv[0]], [past_kv[1]]) if past_kv is not None else ([], [])
        q = torch.cat(qs, dim=2)  # (B, H, Tq, hd)
        k = torch.cat(past_k + list(ks), dim=2)  # (B, KV, Tk, hd)
        v = torch.cat(past_v + list(vs), dim=2)
        if insulate and len(towers) == 2:
            # Same numbers as the joint call, but the expert's rows read a detached copy
            # of the prefix keys/values, so its loss cannot train the prefix.
            tp = sizes[0]
            out_p = attention(qs[0], k, v, bias[:, :, :tp], self.impl)
            k_d = torch.cat([ks[0].detach(), ks[1]], dim=2)
            v_d = torch.cat([vs[0].detach(), vs[1]], dim=2)
            out = torch.cat([out_p, attention(qs[1], k_d, v_d, bias[:, :, tp:], self.impl)], dim=2)
        else:
            out = attention(q, k, v, bias, self.impl)  # (B, H, Tq, hd)
        # 3. Split back; each tower finishes its own residual stream.
        outs = iter(blk.finish(x, o, g, c) for (blk, x, c), o, g in zip(towers, out.split(sizes, dim=2), gates))
        prefix_out = next(outs) if prefix_x is not None else None
        expert_out = next(outs) if expert_x is not None else None
        prefix_kv = (ks[0], vs[0]) if prefix_x is not None else None
        return prefix_out, expert_out, prefix_kv
