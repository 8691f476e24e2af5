"""Stub tokenizers: deterministic, padded, within their id ranges.

(The modules' doctests run with the suite: ``pytest src/scopebench --doctest-modules``.)
"""

from __future__ import annotations

import pytest
import torch

from scopebench.policy import make_config
from scopebench.policy.pi05.tokenizer import PromptTokenizer, action_tokens, discretize, undiscretize


def test_prompt_tokenizer_is_deterministic_padded_and_in_range():
    tok = PromptTokenizer(vocab_size=300, max_length=8)
    ids, mask = tok(["Pick the cube.", "a b c d e f g h i j k"])
    again, _ = tok(["pick  the CUBE ."])
    assert ids.shape == (2, 8) and mask.dtype == torch.bool
    assert torch.equal(ids[:1], again)
    assert mask[0].sum() == 6  # BOS, 3 words, the full stop, the closing newline
    assert mask[1].all()  # truncated, never longer than max_length
    assert ids[mask].min() >= 1 and ids.max() < 300
    assert (ids[~mask] == 0).all()
    with pytest.raises(TypeError, match="sequence of str"):
        tok("not a list")


def test_discretize_round_trip_error_is_half_a_bin():
    x = torch.linspace(-1, 1, 101)
    err = (undiscretize(discretize(x, 64), 64) - x).abs().max()
    assert err <= 1 / 64 + 1e-6


def test_action_tokens_block_has_fixed_length_and_masks_padded_segments():
    cfg = make_config("tiny")  # chunk 8, action_dim 6, 2 segments -> 12 tokens
    actions = torch.zeros(2, cfg.chunk_size, cfg.action_dim)
    is_pad = torch.zeros(2, cfg.chunk_size, dtype=torch.bool)
    is_pad[1, 4:] = True  # second half of sample 1 is padding
    bins, valid = action_tokens(actions, is_pad, cfg)
    assert bins.shape == valid.shape == (2, cfg.discrete_action_len)
    assert valid[0].all() and valid[1, :6].all() and not valid[1, 6:].any()
    assert (bins == cfg.action_bins // 2).all()  # zero sits at the start of the upper middle bin
