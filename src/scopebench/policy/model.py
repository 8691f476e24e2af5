"""The pi05 vision-language-action policy in one readable file.

Two towers share every attention layer:

- the **prefix**: a SigLIP-style ViT encodes each camera, a linear projector maps its
  tokens into a Gemma-style decoder that also reads the prompt tokens, the binned state
  tokens and, when training with cross-entropy, a block of discrete action tokens;
- the **action expert**: a narrower Gemma-style decoder over ``chunk_size`` noisy action
  tokens whose RMSNorms are modulated by the flow-matching time (adaptive RMSNorm with
  gated residuals).

In each layer both towers project their own Q/K/V, the projections are concatenated
along the sequence, one masked attention runs over the whole sequence, and the result is
split back per tower. The mask is block-causal (the cumulative-sum rule of pi0 and
big_vision): the prefix never sees the action tokens, the action tokens see the prefix
(except the discrete action tokens, which would leak the answer) and each other.

Training is flow matching: ``x_t = t * noise + (1 - t) * actions`` with
``t ~ Beta(1.5, 1)``, regressing the velocity ``noise - actions``; plus cross-entropy on
the discrete action tokens predicted by the prefix. Inference runs the prefix once into
a per-layer KV cache, then integrates the velocity with Euler steps from t=1 to t=0.

Nothing here knows about devices, distribution or profiling; see ``runner.py`` for the
stages a profiler wraps, and ``flops.py`` for the cost formulas.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import scopebench.policy.flops as flops_lib
import scopebench.policy.tokenizer as tok
from scopebench.policy.config import Pi05Config, VisionConfig

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


# ------------------------------------------------------------------------------ policy


@dataclass
class Prefix:
    """Embedded prefix tokens and their mask metadata."""

    embs: torch.Tensor  # (B, Tp, D)
    pad_mask: torch.Tensor  # (B, Tp) bool, True on real tokens
    ar_mask: torch.Tensor  # (B, Tp) int, 1 where a causal block starts
    is_discrete: torch.Tensor  # (B, Tp) bool, True on discrete action tokens
    action_targets: torch.Tensor | None = None  # (B, L) bins predicted by the discrete head
    action_target_valid: torch.Tensor | None = None  # (B, L) bool


@dataclass
class PrefixCache:
    """Per-layer prefix keys/values computed once by :meth:`Pi05Policy.prefill`."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, each (B, KV, Tp, hd)
    pad_mask: torch.Tensor  # (B, Tp) bool
    ar_mask: torch.Tensor  # (B, Tp) int


class Pi05Policy(nn.Module):
    """pi05: PaliGemma-style prefix plus a flow-matching action expert (see module docstring).

    Observations are dicts with ``images`` (B, num_cameras, 3, S, S) in [0, 1], optional
    ``image_masks`` (B, num_cameras) bool, ``prompt_ids`` and ``prompt_mask``
    (B, prompt_max_length), ``state`` (B, state_dim) normalised to [-1, 1]; training
    batches add ``actions`` (B, chunk_size, action_dim) and ``action_is_pad``
    (B, chunk_size) bool. :class:`~scopebench.policy.runner.PolicyRunner` builds them.
    """

    def __init__(self, config: Pi05Config) -> None:
        super().__init__()
        self.config = cfg = config
        self.vision = VisionTower(cfg.vision, cfg.attention_implementation)
        self.projector = nn.Linear(cfg.vision.width, cfg.width)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.width)
        self.layers = nn.ModuleList(JointLayer(cfg) for _ in range(cfg.depth))
        self.prefix_norm = RMSNorm(cfg.width, cfg.rms_eps)
        self.discrete_head = nn.Linear(cfg.width, cfg.action_bins)
        self.expert_norm = AdaRMSNorm(cfg.expert_width, cfg.expert_width, cfg.rms_eps)
        self.action_in_proj = nn.Linear(cfg.action_dim, cfg.expert_width)
        self.time_mlp_in = nn.Linear(cfg.expert_width, cfg.expert_width)
        self.time_mlp_out = nn.Linear(cfg.expert_width, cfg.expert_width)
        self.action_out_proj = nn.Linear(cfg.expert_width, cfg.action_dim)
        self.reset_parameters()
        frozen = []
        if cfg.freeze_vision_encoder or cfg.train_expert_only:
            frozen.append(self.vision)
        if cfg.train_expert_only:
            frozen += [self.projector, self.embed_tokens, self.prefix_norm]
            frozen += [layer.prefix for layer in self.layers]
        for module in frozen:
            module.requires_grad_(False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random init: N(0, 0.02) weights, zero biases, zero adaptive modulations.

        Needs no data and works on the meta device (where it does nothing)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=1.0 / math.sqrt(module.embedding_dim))
        nn.init.normal_(self.vision.pos_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, AdaRMSNorm):
                nn.init.zeros_(module.modulation.weight)
                nn.init.zeros_(module.modulation.bias)

    # --- embeddings ---

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids) * math.sqrt(self.config.width)  # Gemma scales by sqrt(D)

    def embed_prefix(self, obs: dict, actions=None, action_is_pad=None) -> Prefix:
        """Image, prompt, state (and discrete action) tokens of the prefix.

        Args:
            obs: observation dict (see the class docstring).
            actions: (B, chunk, action_dim) to append the discrete action block, or None.
            action_is_pad: (B, chunk) bool or None.

        Returns:
            A :class:`Prefix`; ``Tp = prefix_len(actions is not None)``.
        """
        cfg = self.config
        images = obs["images"]
        s = cfg.vision.image_size
        if images.ndim != 5 or tuple(images.shape[1:]) != (cfg.num_cameras, 3, s, s):
            raise ValueError(f"expected images (B, {cfg.num_cameras}, 3, {s}, {s}), got {tuple(images.shape)}")
        b, n = images.shape[:2]
        dtype = self.projector.weight.dtype
        img = self.projector(self.vision(images.flatten(0, 1).to(dtype)))  # (B*N, P, D)
        img = img.reshape(b, -1, cfg.width)  # (B, N*P, D)
        cam_mask = obs.get("image_masks")
        if cam_mask is None:
            cam_mask = torch.ones(b, n, dtype=torch.bool, device=img.device)
        parts = [img, self._embed_ids(obs["prompt_ids"])]
        pads = [cam_mask.repeat_interleave(cfg.vision.num_patches, dim=1), obs["prompt_mask"].bool()]
        if cfg.discrete_state:
            parts.append(self._embed_ids(tok.state_token_ids(obs["state"], cfg)))
            pads.append(torch.ones(b, cfg.state_dim, dtype=torch.bool, device=img.device))
        n_plain = sum(p.shape[1] for p in parts)
        targets = valid = None
        if actions is not None:
            targets, valid = tok.action_tokens(actions, action_is_pad, cfg)  # (B, L)
            # Teacher forcing: position i reads token i-1 (BOA first) and predicts token i.
            inputs = torch.cat(
                [torch.full_like(targets[:, :1], tok.boa_token_id(cfg)), tok.action_token_ids(targets[:, :-1], cfg)],
                dim=1,
            )
            parts.append(self._embed_ids(inputs))
            pads.append(torch.ones_like(inputs, dtype=torch.bool))
        embs, pad = torch.cat(parts, dim=1), torch.cat(pads, dim=1)  # (B, Tp, D), (B, Tp)
        is_discrete = torch.zeros_like(pad)
        is_discrete[:, n_plain:] = True
        ar = is_discrete.long()  # images+prompt+state: one bidirectional block; actions: causal
        return Prefix(embs.to(dtype), pad, ar, is_discrete, targets, valid)

    def embed_suffix(self, x_t: torch.Tensor, time: torch.Tensor):
        """Noisy action tokens and the time condition of the expert.

        Args:
            x_t: (B, chunk, action_dim). time: (B,) in [0, 1].

        Returns:
            ``embs`` (B, chunk, De), ``pad_mask`` (B, chunk) bool, ``ar_mask`` (B, chunk)
            (one bidirectional block, starting after the prefix) and ``cond`` (B, De).
        """
        dtype = self.action_in_proj.weight.dtype
        t_emb = sinusoidal_time_embedding(time, self.config.expert_width).to(dtype)
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(t_emb))))  # (B, De)
        embs = self.action_in_proj(x_t.to(dtype))  # (B, S, De)
        pad = torch.ones(embs.shape[:2], dtype=torch.bool, device=embs.device)
        ar = torch.zeros_like(pad, dtype=torch.long)
        ar[:, 0] = 1
        return embs, pad, ar, cond

    # --- the shared trunk ---

    def attention_mask(self, prefix: Prefix, suffix_pad=None, suffix_ar=None) -> torch.Tensor:
        """Joint (B, Tp+Ts, Tp+Ts) bool mask: cumsum rule and padding, and no action token
        (suffix) sees a discrete action token."""
        if suffix_pad is None:
            return make_att_2d_masks(prefix.pad_mask, prefix.ar_mask)
        mask = make_att_2d_masks(torch.cat([prefix.pad_mask, suffix_pad], 1), torch.cat([prefix.ar_mask, suffix_ar], 1))
        tp = prefix.pad_mask.shape[1]
        mask[:, tp:, :tp] &= ~prefix.is_discrete[:, None, :]
        return mask

    def _positions(self, prefix_pad, is_discrete, suffix_pad=None):
        """Rotary positions: real prefix tokens count up; the suffix continues after the
        non-discrete prefix, so training and inference (no discrete block) agree."""
        pos = [torch.cumsum(prefix_pad.long(), 1) - 1] if prefix_pad is not None else []
        if suffix_pad is not None:
            start = (prefix_pad & ~is_discrete).sum(1, keepdim=True)
            pos.append(start + torch.cumsum(suffix_pad.long(), 1) - 1)
        return torch.cat(pos, dim=1)

    def _trunk(self, prefix_x, expert_x, cond, positions, mask, cache=None, insulate=False):
        rope = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        x = prefix_x if prefix_x is not None else expert_x
        bias = mask_to_bias(mask, x.dtype)  # once for all layers
        kvs = []
        for i, layer in enumerate(self.layers):
            args = (prefix_x, expert_x, cond, rope, bias, cache.kv[i] if cache else None, insulate)
            if self.config.gradient_checkpointing and self.training and torch.is_grad_enabled():
                prefix_x, expert_x, kv = checkpoint(layer, *args, use_reentrant=False)
            else:
                prefix_x, expert_x, kv = layer(*args)
            kvs.append(kv)
        return prefix_x, expert_x, kvs

    # --- training ---

    def sample_time(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """Flow-matching times ``t = 0.001 + 0.999 * Beta(1.5, 1)`` (pi0), more mass near 1 (noise)."""
        conc = torch.tensor([1.5, 1.0], device=device)
        beta = torch.distributions.Beta(conc[0], conc[1]).sample((batch_size,))
        return beta * 0.999 + 0.001

    def forward(self, batch: dict, noise=None, time=None) -> tuple[torch.Tensor, dict]:
        """Training loss ``mse_weight * MSE + ce_weight * CE``.

        Args:
            batch: observation dict plus ``actions`` and ``action_is_pad``.
            noise: (B, chunk, action_dim) or None for standard normal noise.
            time: (B,) or None for :meth:`sample_time`.

        Returns:
            ``loss`` (scalar) and a dict of detached ``mse_loss`` / ``ce_loss`` tensors
            (no ``.item()`` here, so the model never forces a device sync).
        """
        cfg = self.config
        actions = batch["actions"]
        if actions.ndim != 3 or tuple(actions.shape[1:]) != (cfg.chunk_size, cfg.action_dim):
            raise ValueError(f"expected actions (B, {cfg.chunk_size}, {cfg.action_dim}), got {tuple(actions.shape)}")
        is_pad = batch.get("action_is_pad")
        use_ce, use_mse = cfg.ce_weight > 0, cfg.mse_weight > 0  # a 0 weight skips its branch
        prefix = self.embed_prefix(batch, actions if use_ce else None, is_pad)
        suffix_pad = suffix_ar = cond = expert_x = None
        if use_mse:
            noise = torch.randn_like(actions, dtype=torch.float32) if noise is None else noise
            time = self.sample_time(actions.shape[0], actions.device) if time is None else time
            t = time.float()[:, None, None]
            x_t = t * noise + (1 - t) * actions.float()  # (B, S, A)
            expert_x, suffix_pad, suffix_ar, cond = self.embed_suffix(x_t, time)
        mask = self.attention_mask(prefix, suffix_pad, suffix_ar)
        positions = self._positions(prefix.pad_mask, prefix.is_discrete, suffix_pad)
        prefix_x, expert_x, _ = self._trunk(
            prefix.embs, expert_x, cond, positions, mask, insulate=cfg.knowledge_insulation
        )
        loss, info = 0.0, {}
        if use_mse:
            v = self.action_out_proj(self.expert_norm(expert_x, cond)[0]).float()  # (B, S, A)
            err = (v - (noise - actions.float())).pow(2).mean(-1)  # (B, S)
            keep = torch.ones_like(err) if is_pad is None else (~is_pad).float()
            mse = (err * keep).sum() / keep.sum().clamp(min=1)
            loss, info["mse_loss"] = loss + cfg.mse_weight * mse, mse.detach()
        if use_ce:
            n = cfg.discrete_action_len
            logits = self.discrete_head(self.prefix_norm(prefix_x[:, -n:])[0]).float()  # (B, L, bins)
            ce = F.cross_entropy(logits.transpose(1, 2), prefix.action_targets, reduction="none")
            keep = prefix.action_target_valid.float()
            ce = (ce * keep).sum() / keep.sum().clamp(min=1)
            loss, info["ce_loss"] = loss + cfg.ce_weight * ce, ce.detach()
        return loss, info

    # --- inference ---

    def prefill(self, obs: dict) -> PrefixCache:
        """Run the prefix once and keep every layer's keys/values."""
        prefix = self.embed_prefix(obs)
        mask = self.attention_mask(prefix)
        positions = self._positions(prefix.pad_mask, prefix.is_discrete)
        _, _, kvs = self._trunk(prefix.embs, None, None, positions, mask)
        return PrefixCache(kvs, prefix.pad_mask, prefix.ar_mask)

    def denoise_step(self, cache: PrefixCache, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """Velocity (B, chunk, action_dim) at ``x_t`` and ``time`` (B,), reading the cached prefix."""
        expert_x, pad, ar, cond = self.embed_suffix(x_t, time)
        tp = cache.pad_mask.shape[1]
        mask = make_att_2d_masks(torch.cat([cache.pad_mask, pad], 1), torch.cat([cache.ar_mask, ar], 1))
        is_discrete = torch.zeros_like(cache.pad_mask)
        positions = self._positions(cache.pad_mask, is_discrete, pad)[:, tp:]
        _, expert_x, _ = self._trunk(None, expert_x, cond, positions, mask[:, tp:], cache=cache)
        return self.action_out_proj(self.expert_norm(expert_x, cond)[0]).float()

    def _velocity_uncached(self, obs: dict, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """Reference velocity: recompute the whole prefix jointly with the suffix."""
        prefix = self.embed_prefix(obs)
        expert_x, pad, ar, cond = self.embed_suffix(x_t, time)
        mask = self.attention_mask(prefix, pad, ar)
        positions = self._positions(prefix.pad_mask, prefix.is_discrete, pad)
        _, expert_x, _ = self._trunk(prefix.embs, expert_x, cond, positions, mask)
        return self.action_out_proj(self.expert_norm(expert_x, cond)[0]).float()

    def integrate(self, velocity: Callable, noise: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Euler steps from t=1 (noise) to t=0 (actions) with ``dt = -1/num_steps``."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        x = noise.float()
        for i in range(num_steps):
            t = torch.full((x.shape[0],), 1.0 - i / num_steps, device=x.device)
            x = x - velocity(x, t) / num_steps
        return x

    def denoise(self, cache: PrefixCache, noise=None, num_steps: int | None = None) -> torch.Tensor:
        """Actions (B, chunk, action_dim) from a prefilled cache."""
        b, device = cache.pad_mask.shape[0], cache.pad_mask.device
        shape = (b, self.config.chunk_size, self.config.action_dim)
        noise = torch.randn(shape, device=device) if noise is None else noise
        steps = self.config.num_inference_steps if num_steps is None else num_steps
        return self.integrate(lambda x, t: self.denoise_step(cache, x, t), noise, steps)

    @torch.no_grad()
    def sample_actions(self, obs: dict, num_steps=None, noise=None, use_kv_cache=True) -> torch.Tensor:
        """Actions (B, chunk_size, action_dim) for a batch of observations.

        Args:
            obs: observation dict.
            num_steps: Euler steps (default ``config.num_inference_steps``).
            noise: (B, chunk_size, action_dim) starting point, or None for N(0, 1).
            use_kv_cache: False recomputes the prefix at every step (the reference path
                for tests and for measuring the cache's speedup).
        """
        if use_kv_cache:
            return self.denoise(self.prefill(obs), noise, num_steps)
        b, device = obs["prompt_ids"].shape[0], obs["prompt_ids"].device
        shape = (b, self.config.chunk_size, self.config.action_dim)
        noise = torch.randn(shape, device=device) if noise is None else noise
        steps = self.config.num_inference_steps if num_steps is None else num_steps
        return self.integrate(lambda x, t: self._velocity_uncached(obs, x, t), noise, steps)

    # --- cost accounting ---

    def num_params(self, trainable_only: bool = False) -> int:
        """Parameter count (works on the meta device)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def estimate_flops(self, batch_size: int, mode: str = "train", num_steps: int | None = None) -> int:
        """Matmul FLOPs of one training step or one ``sample_actions`` call.

        See :func:`scopebench.policy.flops.estimate_flops` for the formula.
        """
        steps = self.config.num_inference_steps if num_steps is None else num_steps
        return flops_lib.estimate_flops(self.config, batch_size, mode=mode, num_steps=steps)
