"""Deterministic stand-ins for pi05's tokenizers.

pi05 uses the PaliGemma SentencePiece tokenizer for prompts and FAST (DCT + BPE) for
discrete actions. Neither can be downloaded here, and latency or throughput do not
depend on which ids come out, only on how many. So:

- :class:`PromptTokenizer` maps each word to a stable hash id and pads to a fixed
  length, returning ids and a validity mask;
- :func:`discretize` bins values in [-1, 1] uniformly;
- :func:`action_tokens` averages an action chunk over a few time segments and bins it,
  a fixed-length block that, like FAST, keeps the low-frequency content of the chunk.

Token-id layout of the shared vocabulary (see :class:`~scopebench.policy.pi05.config.Pi05Config`):
``0`` padding, ``[1, text_vocab_size)`` prompt words, then the begin-of-actions id,
the action bins and the state bins at the very end.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from scopebench.policy.pi05.config import Pi05Config

PAD_ID = 0
BOS_ID = 1
_WORD = re.compile(r"\w+|[^\w\s]")


class PromptTokenizer:
    """Word-level hashing tokenizer with padding to a fixed length.

    Args:
        vocab_size: ids are drawn from ``[2, vocab_size)``; 0 is padding, 1 is BOS.
        max_length: every prompt becomes exactly this many ids (truncated or padded).

    :Examples:

    >>> tok = PromptTokenizer(vocab_size=100, max_length=6)
    >>> ids, mask = tok(["pick the cube", ""])
    >>> ids.shape, mask.sum(dim=1).tolist()
    (torch.Size([2, 6]), [5, 2])
    >>> bool((tok(["pick the cube"])[0] == ids[:1]).all())
    True
    """

    def __init__(self, vocab_size: int, max_length: int) -> None:
        if vocab_size < 3:
            raise ValueError(f"PromptTokenizer needs vocab_size >= 3, got {vocab_size}")
        if max_length < 1:
            raise ValueError(f"PromptTokenizer needs max_length >= 1, got {max_length}")
        self.vocab_size = vocab_size
        self.max_length = max_length

    @classmethod
    def from_config(cls, config: Pi05Config) -> PromptTokenizer:
        """The tokenizer matching a policy config (text ids only, reserved ids avoided)."""
        return cls(vocab_size=config.text_vocab_size, max_length=config.prompt_max_length)

    def encode(self, text: str) -> list[int]:
        """Ids of one prompt: BOS, one id per word or punctuation mark, then a newline
        id (pi05 ends the prompt with a newline), before padding."""
        # crc32, not hash(): Python salts str hashes per process, and DataLoader workers
        # and reruns must agree on the ids.
        words = _WORD.findall(text.strip().lower()) + ["\n"]
        span = self.vocab_size - 2
        return [BOS_ID] + [2 + zlib.crc32(w.encode()) % span for w in words]

    def __call__(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenize a batch.

        Args:
            prompts: B strings.

        Returns:
            ``ids`` (B, max_length) int64 and ``mask`` (B, max_length) bool, True on
            real tokens. Padding is on the right.
        """
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise TypeError(f"expected a sequence of str prompts, got {prompts!r:.80}")
        ids = torch.full((len(prompts), self.max_length), PAD_ID, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            row = self.encode(prompt)[: self.max_length]
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return ids, ids != PAD_ID


def discretize(x: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Uniform bins over [-1, 1]; values outside are clipped.

    :Examples:

    >>> discretize(torch.tensor([-1.0, -0.01, 0.0, 1.0, 5.0]), 4).tolist()
    [0, 1, 2, 3, 3]
    """
    x = x.float().clamp(-1.0, 1.0)
    return ((x + 1.0) * (num_bins / 2.0)).long().clamp_(0, num_bins - 1)


def undiscretize(bins: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Centres of the bins made by :func:`discretize`.

    :Examples:

    >>> undiscretize(torch.tensor([0, 3]), 4).tolist()
    [-0.75, 0.75]
    """
    return (bins.float() + 0.5) * (2.0 / num_bins) - 1.0


def state_token_ids(state: torch.Tensor, config: Pi05Config) -> torch.Tensor:
    """Vocabulary ids of the binned state: (B, state_dim) -> (B, state_dim)."""
    first = config.vocab_size - config.state_bins
    return first + discretize(state, config.state_bins)


def action_tokens(
    actions: torch.Tensor, action_is_pad: torch.Tensor | None, config: Pi05Config
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discrete action block: segment means of the chunk, binned.

    The chunk is averaged over ``discrete_action_steps`` time segments
    (adaptive average pooling), flattened time-major and binned into ``action_bins``.

    Args:
        actions: (B, chunk_size, action_dim), normalised to about [-1, 1].
        action_is_pad: (B, chunk_size) bool or None.
        config: the policy config.

    Returns:
        ``bins`` (B, L) int64 in ``[0, action_bins)`` with
        ``L = discrete_action_steps * action_dim``, and ``valid`` (B, L) bool: a token is
        valid when its time segment holds at least one real (non-padded) action.
    """
    b, t, a = actions.shape
    pooled = F.adaptive_avg_pool1d(actions.float().transpose(1, 2), config.discrete_action_steps)
    bins = discretize(pooled.transpose(1, 2).reshape(b, -1), config.action_bins)  # (B, L)
    if action_is_pad is None:
        return bins, torch.ones_like(bins, dtype=torch.bool)
    real = (~action_is_pad).float().unsqueeze(1)  # (B, 1, T)
    seg_real = F.adaptive_max_pool1d(real, config.discrete_action_steps).squeeze(1) > 0
    valid = seg_real.repeat_interleave(a, dim=1)  # (B, L), time-major like bins
    return bins, valid


def action_token_ids(bins: torch.Tensor, config: Pi05Config) -> torch.Tensor:
    """Vocabulary ids of action bins; the begin-of-actions id sits just before them."""
    return boa_token_id(config) + 1 + bins


def boa_token_id(config: Pi05Config) -> int:
    """Id of the begin-of-actions token that starts the discrete action block."""
    return config.text_vocab_size
