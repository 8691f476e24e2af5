"""A third-party vision-language model as a policy: Hugging Face ``transformers``' PaliGemma.

PaliGemma (a SigLIP vision tower, a linear projector and a Gemma decoder) is the backbone
family of pi0 and pi05. :func:`make_paligemma_policy` builds one from a small config with
random weights (nothing is downloaded) and trains it the way PaliGemma is fine-tuned: the
image's tokens and a prompt form the prefix (full attention, ``token_type_ids`` 0), the
target tokens the suffix (causal, ``token_type_ids`` 1), and the loss is the next-token
cross-entropy on the suffix (``labels`` -100 on the prefix), computed by the model itself.
Inference (``sample``) is greedy generation of ``num_steps`` tokens with ``generate``.

The synthetic data (:class:`CaptionData`) pairs random images and prompts with targets the
image determines (the mean brightness of horizontal bands, quantised to tokens), so the
loss can fall. FLOPs are counted by the suite (``FlopCounterMode``); FSDP2 shards every
SigLIP encoder layer and every Gemma decoder layer, the root keeping the tied embedding and
LM head. SigLIP's pooling head (``vision_tower.head``) exists in the model but PaliGemma
never calls it: ``find-unused-params`` names it, and DDP needs ``find_unused_params: true``.

    scopebench profile-step --config configs/policy/tiny.yml --policy scopebench.policy.paligemma:make_paligemma_policy
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from scopebench.policy.user import UserPolicy

__all__ = ["CaptionData", "make_paligemma_policy"]

#: Token ids with a meaning: padding, end of sequence; the image placeholder is the last id.
PAD, EOS = 0, 1


class CaptionData(Dataset):
    """Images, prompts and target tokens, as PaliGemma's training inputs (one dict per sample).

    Args:
        size: Samples.
        image_size: Side of the square RGB images.
        image_tokens: Image tokens the vision tower makes of one image (``(image_size / patch)**2``).
        prompt_len: Prompt tokens.
        target_len: Target tokens (the mean brightness of ``target_len`` horizontal bands).
        vocab_size: Token ids (the last one is the image placeholder).
        seed: Fixes everything.
    """

    def __init__(
        self, size: int, image_size: int, image_tokens: int, prompt_len: int, target_len: int, vocab_size: int, seed=0
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.image_token = vocab_size - 1
        self.images = torch.rand(size, 3, image_size, image_size, generator=g)
        self.prompts = torch.randint(EOS + 1, self.image_token, (size, prompt_len), generator=g)
        bands = self.images.mean(1).reshape(size, target_len, -1).mean(-1)  # (size, target_len) in [0, 1]
        self.targets = (EOS + 1 + bands * (self.image_token - EOS - 2)).long()
        self.image_tokens = image_tokens

    def __len__(self) -> int:
        return len(self.images)

    def prefix(self, i) -> dict[str, torch.Tensor]:
        """Sample ``i`` (an index or a slice) without its target: what generation starts from."""
        prompts = self.prompts[i]
        image = torch.full((*prompts.shape[:-1], self.image_tokens), self.image_token)
        ids = torch.cat([image, prompts], dim=-1)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": self.images[i]}

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        prefix = self.prefix(i)
        ids = torch.cat([prefix["input_ids"], self.targets[i]])
        suffix = torch.ones_like(self.targets[i])
        labels = torch.cat([torch.full_like(prefix["input_ids"], -100), self.targets[i]])
        token_types = torch.cat([torch.zeros_like(prefix["input_ids"]), suffix])
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": token_types,
            "labels": labels,
            "pixel_values": prefix["pixel_values"],
        }


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def _sample(model: Any, observation: dict[str, torch.Tensor], num_steps: int) -> torch.Tensor:
    """Greedy generation of exactly ``num_steps`` tokens; the generated ids (B, num_steps)."""
    out = model.generate(
        **observation,
        max_new_tokens=num_steps,
        min_new_tokens=num_steps,
        do_sample=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    return out[:, observation["input_ids"].shape[1] :]


def make_paligemma_policy(
    *,
    image_size: int = 32,
    patch_size: int = 8,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    vocab_size: int = 128,
    prompt_len: int = 6,
    target_len: int = 4,
    samples: int = 64,
    seed: int = 0,
) -> UserPolicy:
    """A randomly initialised PaliGemma of the given sizes on :class:`CaptionData`.

    Args:
        image_size: Side of the images (a multiple of ``patch_size``).
        patch_size: SigLIP's patch side.
        hidden: Width of both towers (MLPs are twice as wide; Gemma's head_dim is ``hidden / heads``).
        layers: Layers of each tower.
        heads: Attention heads of each tower (Gemma: one key-value head).
        vocab_size: Token ids.
        prompt_len: Prompt tokens per sample.
        target_len: Target tokens per sample.
        samples: Samples of the dataset.
        seed: Seed of the data (the weights follow the run's ``seed``).
    """
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    if image_size % patch_size:
        raise ValueError(f"image_size must be a multiple of patch_size={patch_size}, got {image_size}")
    vision = dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        image_size=image_size,
        patch_size=patch_size,
    )
    text = dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=hidden // heads,
        vocab_size=vocab_size,
    )
    config = PaliGemmaConfig(
        vision_config=vision, text_config=text, image_token_index=vocab_size - 1, projection_dim=hidden
    )
    model = PaliGemmaForConditionalGeneration(config)
    image_tokens = (image_size // patch_size) ** 2
    data = CaptionData(samples, image_size, image_tokens, prompt_len, target_len, vocab_size, seed)
    layers = [m for m in model.modules() if type(m).__name__ in ("SiglipEncoderLayer", "GemmaDecoderLayer")]
    return UserPolicy(
        model=model,
        loss=_loss,
        dataset=data,
        sample=_sample,
        observation=lambda batch_size: data.prefix(slice(0, batch_size)),
        shard_modules=layers,
    )
