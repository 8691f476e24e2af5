"""The pi05 vision-language-action policy: the network a reader follows top-down.

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

The building blocks (masks, attention, rotary and time embeddings, norms, the vision tower
and the joint layer) are in ``layers.py``. Nothing here knows about devices, distribution or
profiling; see ``runner.py`` for the stages a profiler wraps, and ``flops.py`` for the cost
formulas.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import scopebench.policy.pi05.flops as flops_lib
import scopebench.policy.pi05.tokenizer as tok
from scopebench.policy.pi05.config import Pi05Config
from scopebench.policy.pi05.layers import (
    AdaRMSNorm,
    JointLayer,
    RMSNorm,
    VisionTower,
    make_att_2d_masks,
    mask_to_bias,
    rope_cos_sin,
    sinusoidal_time_embedding,
)


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
    (B, chunk_size) bool. :class:`~scopebench.policy.pi05.runner.PolicyRunner` builds them.
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

        See :func:`scopebench.policy.pi05.flops.estimate_flops` for the formula.
        """
        steps = self.config.num_inference_steps if num_steps is None else num_steps
        return flops_lib.estimate_flops(self.config, batch_size, mode=mode, num_steps=steps)
