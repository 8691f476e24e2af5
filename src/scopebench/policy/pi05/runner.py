"""The four inference stages of a pi05 policy, as separate calls a profiler can wrap.

:class:`Preprocessor` holds the host-side half (batch -> normalised, padded, tokenised
tensors on the device, and back), which needs only the config: the dataloader
benchmark uses it without a model. :class:`PolicyRunner` adds the model's two stages.

The model knows nothing about profiling; a solver times the stages from outside::

    runner = PolicyRunner(model, stats=dataset.stats)
    with profiler.track_step("preprocess"):
        obs = runner.preprocess(batch)
    with profiler.track_step("prefill"):
        cache = runner.prefill(obs)
    with profiler.track_step("denoise"):
        actions = runner.denoise(cache, num_steps=10)
    with profiler.track_step("postprocess"):
        actions = runner.postprocess(actions)

``preprocess`` also produces training batches (it keeps ``actions`` and
``action_is_pad``), so a training loop calls ``model(runner.preprocess(batch))``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from scopebench.policy.data.lerobot_meta import ACTION_KEY, STATE_KEY
from scopebench.policy.pi05.config import Pi05Config
from scopebench.policy.pi05.model import Pi05Policy, PrefixCache
from scopebench.policy.pi05.tokenizer import PromptTokenizer


def _pad_last(x: torch.Tensor, size: int, name: str) -> torch.Tensor:
    """Zero-pad the last dimension to ``size`` (pi05 pads states/actions to 32)."""
    if x.shape[-1] > size:
        raise ValueError(f"{name} has {x.shape[-1]} dims, more than the policy's {size}")
    return F.pad(x, (0, size - x.shape[-1]))


class Preprocessor:
    """Dataloader batches to model inputs on the device, and actions back (host side).

    Args:
        config: the policy's config (cameras, image size, prompt length, padded sizes).
        stats: ``meta/stats.json`` of the dataset (``observation.state`` and ``action``
            with ``min`` and ``max``): states and actions are mapped to [-1, 1] with
            them, and actions mapped back in :meth:`postprocess`. None skips this.
        device: where the model runs.
        dtype: the dtype of the model's image input.
    """

    def __init__(
        self, config: Pi05Config, stats: Mapping | None = None, device="cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        self.config = config
        self.tokenizer = PromptTokenizer.from_config(config)
        self.device = torch.device(device)
        self.dtype = dtype
        self.stats = {}
        for key in (STATE_KEY, ACTION_KEY):
            if stats is not None and key in stats:
                lo = torch.as_tensor(stats[key]["min"], dtype=torch.float32)
                hi = torch.as_tensor(stats[key]["max"], dtype=torch.float32)
                # A constant dimension would divide by zero; it maps to 0 instead.
                self.stats[key] = (lo, (hi - lo).clamp(min=1e-8))
        self._action_dim: int | None = None

    def _normalize(self, x: torch.Tensor, key: str) -> torch.Tensor:
        if key not in self.stats:
            return x
        lo, span = (s.to(x.device) for s in self.stats[key])
        return 2.0 * (x - lo) / span - 1.0

    def preprocess(self, batch: Mapping) -> dict:
        """Dataloader batch -> model observation on the model's device.

        Args:
            batch: ``camera{i}`` (B, 3, H, W) float in [0, 1], ``state`` (B, s), ``prompt``
                (list of B str), optionally ``actions`` (B, T, a) and ``action_is_pad``
                (B, T).

        Returns:
            ``images`` (B, N, 3, S, S), ``prompt_ids``/``prompt_mask`` (B, L), ``state``
            (B, state_dim) and, when given, ``actions`` (B, chunk, action_dim) and
            ``action_is_pad`` (B, chunk), all normalised and padded.
        """
        cfg = self.config
        cams = [f"camera{i}" for i in range(cfg.num_cameras)]
        missing = [k for k in cams + ["state", "prompt"] if k not in batch]
        if missing:
            raise ValueError(f"batch lacks key(s) {missing}; got keys {sorted(batch)}")
        size = cfg.vision.image_size
        images = []
        for key in cams:
            img = batch[key].to(self.device, torch.float32, non_blocking=True)
            if img.shape[-2:] != (size, size):
                img = F.interpolate(img, size=(size, size), mode="bilinear", align_corners=False)
            images.append(img)
        ids, mask = self.tokenizer(list(batch["prompt"]))
        state = self._normalize(batch["state"].to(self.device, torch.float32), STATE_KEY)
        obs = {
            "images": torch.stack(images, dim=1).to(self.dtype),  # (B, N, 3, S, S)
            "prompt_ids": ids.to(self.device),
            "prompt_mask": mask.to(self.device),
            "state": _pad_last(state, cfg.state_dim, "state"),
        }
        if "actions" in batch:
            actions = batch["actions"].to(self.device, torch.float32)
            if actions.shape[1] != cfg.chunk_size:
                raise ValueError(f"expected action chunks of {cfg.chunk_size} steps, got {tuple(actions.shape)}")
            self._action_dim = actions.shape[-1]
            obs["actions"] = _pad_last(self._normalize(actions, ACTION_KEY), cfg.action_dim, "actions")
            is_pad = batch.get("action_is_pad")
            if is_pad is None:
                is_pad = torch.zeros(actions.shape[:2], dtype=torch.bool)
            obs["action_is_pad"] = is_pad.to(self.device)
        return obs

    def postprocess(self, actions: torch.Tensor, action_dim: int | None = None) -> torch.Tensor:
        """Crop padded action dims and undo the normalisation; returns a CPU tensor.

        Args:
            actions: (B, chunk, action_dim) from :meth:`denoise`.
            action_dim: dims to keep; default: those of the last preprocessed batch with
                actions, else the stats' size, else all.
        """
        if action_dim is None:
            action_dim = self._action_dim
        if action_dim is None and ACTION_KEY in self.stats:
            action_dim = self.stats[ACTION_KEY][0].numel()
        actions = actions[..., : action_dim or actions.shape[-1]].float()
        if ACTION_KEY in self.stats:
            lo, span = (s.to(actions.device) for s in self.stats[ACTION_KEY])
            actions = (actions + 1.0) * 0.5 * span[: actions.shape[-1]] + lo[: actions.shape[-1]]
        return actions.cpu()


class PolicyRunner(Preprocessor):
    """Batches from :func:`~scopebench.policy.data.dataset.make_dataloader` in, actions out.

    Args:
        model: the policy.
        stats: dataset statistics, as for :class:`Preprocessor`.
        device: where the model runs; default: the device of its parameters.
    """

    def __init__(self, model: Pi05Policy, stats: Mapping | None = None, device=None) -> None:
        param = next(model.parameters())
        super().__init__(model.config, stats, device if device is not None else param.device, param.dtype)
        self.model = model

    @torch.inference_mode()
    def prefill(self, obs: Mapping) -> PrefixCache:
        """Vision tower and prefix decoder once; returns the per-layer KV cache."""
        return self.model.prefill(obs)

    @torch.inference_mode()
    def denoise(self, cache: PrefixCache, num_steps: int | None = None, noise=None) -> torch.Tensor:
        """Euler integration of the action expert over the cached prefix.

        Returns:
            Normalised actions (B, chunk_size, action_dim), float32.
        """
        return self.model.denoise(cache, noise=noise, num_steps=num_steps)

    def __call__(self, batch: Mapping, num_steps: int | None = None, noise=None) -> torch.Tensor:
        """All four stages: batch in, actions in the dataset's units out (B, chunk, a)."""
        obs = self.preprocess(batch)
        return self.postprocess(self.denoise(self.prefill(obs), num_steps, noise))
