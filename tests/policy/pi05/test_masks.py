"""Attention masks: the block-causal rule, and who may see whom in the joint sequence."""

from __future__ import annotations

import torch

from scopebench.policy.pi05.layers import make_att_2d_masks

from ..helpers import make_batch


def test_cumsum_rule_prefix_lm_and_causal_blocks():
    pad = torch.tensor([[True, True, True, True, True, False]])
    ar = torch.tensor([[0, 0, 1, 1, 0, 0]])
    mask = make_att_2d_masks(pad, ar)[0].int()
    assert mask.tolist() == [
        [1, 1, 0, 0, 0, 0],  # the first block is bidirectional
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],  # causal token
        [1, 1, 1, 1, 1, 0],  # starts a block with token 4
        [1, 1, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0],  # padding sees nothing and is seen by nobody
    ]


def _joint(model, batch):
    actions = batch["actions"]
    prefix = model.embed_prefix(batch, actions, batch["action_is_pad"])
    _, pad, ar, _ = model.embed_suffix(actions, torch.full((actions.shape[0],), 0.5))
    return prefix, model.attention_mask(prefix, pad, ar)


def test_action_tokens_see_the_prefix_and_each_other_but_not_the_reverse(tiny):
    cfg = tiny.config
    batch = make_batch(tiny)
    prefix, mask = _joint(tiny, batch)
    tp, s = prefix.pad_mask.shape[1], cfg.chunk_size
    assert tp == cfg.prefix_len(with_discrete_actions=True)
    assert mask.shape == (4, tp + s, tp + s)
    plain = prefix.pad_mask & ~prefix.is_discrete  # real image, prompt and state tokens
    suffix_rows = mask[:, tp:]
    # every action token sees every real plain prefix token and every action token
    assert torch.equal(suffix_rows[:, :, :tp], plain[:, None, :].expand(-1, s, -1))
    assert suffix_rows[:, :, tp:].all()
    # the prefix (plain and discrete tokens) never sees an action token
    assert not mask[:, :tp, tp:].any()


def test_discrete_action_tokens_are_causal_and_hidden_from_the_expert(tiny):
    cfg = tiny.config
    prefix, mask = _joint(tiny, make_batch(tiny))
    n = cfg.discrete_action_len
    tp = prefix.pad_mask.shape[1]
    block = mask[:, tp - n : tp, tp - n : tp]
    assert torch.equal(block, torch.ones(n, n, dtype=torch.bool).tril().expand_as(block))
    assert not mask[:, tp:, tp - n : tp].any()  # no leak of the answer to the action expert
    assert not mask[:, : tp - n, tp - n : tp].any()  # nor to the plain prefix


def test_prompt_padding_is_never_attended(tiny):
    cfg = tiny.config
    batch = make_batch(tiny)
    prefix, mask = _joint(tiny, batch)
    first = cfg.num_cameras * cfg.vision.num_patches
    padded_cols = first + torch.nonzero(~batch["prompt_mask"][0]).flatten()
    assert not mask[:, :, padded_cols].any()


def test_suffix_positions_match_between_training_and_inference(tiny):
    batch = make_batch(tiny)
    train_prefix = tiny.embed_prefix(batch, batch["actions"], batch["action_is_pad"])
    infer_prefix = tiny.embed_prefix(batch)
    suffix_pad = torch.ones(4, tiny.config.chunk_size, dtype=torch.bool)
    s = tiny.config.chunk_size
    train = tiny._positions(train_prefix.pad_mask, train_prefix.is_discrete, suffix_pad)[:, -s:]
    infer = tiny._positions(infer_prefix.pad_mask, infer_prefix.is_discrete, suffix_pad)[:, -s:]
    assert torch.equal(train, infer)
    # positions count real tokens only: the suffix starts right after them
    assert torch.equal(infer[:, 0], infer_prefix.pad_mask.sum(1))
