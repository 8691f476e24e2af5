"""The pi05 model: sizes, training, KV-cached sampling, attention paths, options."""

from __future__ import annotations

import copy

import pytest
import torch

from scopebench.policy import make_policy

from ..helpers import make_batch, randomize_modulations


def test_pi05_preset_on_meta_device_has_real_size_and_no_memory():
    with torch.device("meta"):
        model = make_policy("pi05")
    params = list(model.parameters())
    assert all(p.is_meta for p in params)
    assert 3.2e9 <= model.num_params() <= 3.5e9
    assert 2.4e9 < sum(p.numel() for n, p in model.named_parameters() if ".expert." not in n)


def test_tiny_and_small_presets_sizes():
    assert make_policy("tiny").num_params() < 2e6
    with torch.device("meta"):
        assert 20e6 <= make_policy("small").num_params() <= 50e6


def test_training_step_is_finite_and_reaches_every_part(tiny):
    batch = make_batch(tiny)
    loss, info = tiny(batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert set(info) == {"mse_loss", "ce_loss"}
    loss.backward()
    grads = [p.grad for p in tiny.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_training_halves_the_flow_matching_loss(tiny):
    """200 Adam steps on one batch: the loss at fixed noise and times at least halves."""
    batch = make_batch(tiny, batch_size=4)
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(batch["actions"].shape, generator=g)
    times = torch.linspace(0.1, 0.9, 4)

    def fixed_loss() -> float:
        with torch.no_grad():
            return tiny(batch, noise=noise, time=times)[1]["mse_loss"].item()

    initial = fixed_loss()
    opt = torch.optim.Adam(tiny.parameters(), lr=3e-3)
    for _ in range(200):
        loss, _ = tiny(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert fixed_loss() <= 0.5 * initial


def test_kv_cache_matches_recomputing_the_prefix(tiny):
    randomize_modulations(tiny)
    batch = make_batch(tiny)
    noise = torch.randn(batch["actions"].shape, generator=torch.Generator().manual_seed(2))
    cached = tiny.sample_actions(batch, num_steps=4, noise=noise)
    reference = tiny.sample_actions(batch, num_steps=4, noise=noise, use_kv_cache=False)
    assert cached.shape == (4, tiny.config.chunk_size, tiny.config.action_dim)
    torch.testing.assert_close(cached, reference, atol=1e-5, rtol=0)
    # The comparison is not vacuous: the actions do depend on the prefix.
    other = dict(batch, images=torch.rand_like(batch["images"]))
    assert (tiny.sample_actions(other, num_steps=4, noise=noise) - cached).abs().max() > 1e-3


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("kv", [1, 2, 4])
def test_attention_matches_one_copy_of_k_and_v_per_query_head(impl, kv):
    """Head h reads key/value head h // (H / KV) (the grouping of repeat_interleave), with
    the mask, in the forward and the gradients, whichever way the heads are grouped."""
    from scopebench.policy.pi05.layers import attention, mask_to_bias

    gen = torch.Generator().manual_seed(kv)
    q = torch.randn(2, 4, 5, 8, generator=gen, requires_grad=True)
    k = torch.randn(2, kv, 7, 8, generator=gen, requires_grad=True)
    v = torch.randn(2, kv, 7, 8, generator=gen, requires_grad=True)
    bias = mask_to_bias(torch.rand(2, 5, 7, generator=gen) > 0.3, torch.float32)
    weight = torch.randn(2, 4, 5, 8, generator=gen)
    out = attention(q, k, v, bias, impl)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    k_full, v_full = (x.repeat_interleave(4 // kv, dim=1) for x in (k, v))
    scores = q @ k_full.transpose(-1, -2) / 8**0.5 + bias
    ref = scores.softmax(-1) @ v_full
    ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_eager_and_sdpa_attention_agree(tiny):
    randomize_modulations(tiny)
    eager = make_policy("tiny", attention_implementation="eager")
    eager.load_state_dict(tiny.state_dict())
    batch = make_batch(tiny)
    noise = torch.randn(batch["actions"].shape, generator=torch.Generator().manual_seed(3))
    times = torch.full((4,), 0.3)
    torch.testing.assert_close(
        eager(batch, noise=noise, time=times)[0], tiny(batch, noise=noise, time=times)[0], atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        eager.sample_actions(batch, 3, noise), tiny.sample_actions(batch, 3, noise), atol=1e-4, rtol=0
    )


def test_knowledge_insulation_stops_the_flow_loss_at_the_prefix():
    def prefix_grad_norm(insulate: bool) -> float:
        torch.manual_seed(0)
        model = make_policy("tiny", ce_weight=0.0, knowledge_insulation=insulate)
        randomize_modulations(model)
        model(make_batch(model))[0].backward()
        prefix = [model.embed_tokens.weight, model.layers[0].prefix.q_proj.weight]
        return sum(float(p.grad.abs().sum()) for p in prefix if p.grad is not None)

    assert prefix_grad_norm(False) > 0
    assert prefix_grad_norm(True) == 0


def test_knowledge_insulation_keeps_the_forward_value(tiny):
    insulated = make_policy("tiny", knowledge_insulation=True)
    insulated.load_state_dict(tiny.state_dict())
    batch, noise, times = make_batch(tiny), torch.zeros(4, 8, 6), torch.full((4,), 0.5)
    torch.testing.assert_close(
        insulated(batch, noise=noise, time=times)[0], tiny(batch, noise=noise, time=times)[0], atol=1e-5, rtol=0
    )


def test_gradient_checkpointing_gives_the_same_gradients(tiny):
    randomize_modulations(tiny)
    ckpt = copy.deepcopy(tiny)
    ckpt.config.gradient_checkpointing = True
    batch, noise, times = make_batch(tiny), torch.randn(4, 8, 6), torch.full((4,), 0.7)
    for model in (tiny, ckpt):
        model(batch, noise=noise, time=times)[0].backward()
    for (name, a), b in zip(tiny.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("option", "frozen_prefixes"),
    [
        ("freeze_vision_encoder", ("vision.",)),
        ("train_expert_only", ("vision.", "projector.", "embed_tokens.", "prefix_norm.")),
    ],
)
def test_freezing_options(option, frozen_prefixes):
    model = make_policy("tiny", **{option: True})
    for name, param in model.named_parameters():
        frozen = name.startswith(frozen_prefixes)
        if option == "train_expert_only" and ".prefix." in name:
            frozen = True
        assert param.requires_grad is not frozen, name
    assert model.num_params(trainable_only=True) < model.num_params()


def test_bfloat16_model_runs():
    model = make_policy("tiny", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    batch = make_batch(model, batch_size=2)
    loss, _ = model(batch)
    assert torch.isfinite(loss)
    assert model.sample_actions(batch, 2).dtype == torch.float32


def test_bad_inputs_are_rejected(tiny):
    batch = make_batch(tiny)
    with pytest.raises(ValueError, match=r"expected images \(B, 2, 3, 32, 32\), got \(4, 2, 3, 16, 16\)"):
        tiny.sample_actions(dict(batch, images=batch["images"][..., :16, :16]))
    with pytest.raises(ValueError, match=r"expected actions \(B, 8, 6\), got \(4, 8\)"):
        tiny(dict(batch, actions=batch["actions"][..., 0]))
    with pytest.raises(ValueError, match="num_steps must be >= 1, got 0"):
        tiny.sample_actions(batch, num_steps=0)
