"""Config validation: bad values are rejected when the config is built, naming the key."""

from __future__ import annotations

import dataclasses

import pytest

from scopebench.policy import Pi05Config, VisionConfig, make_config, make_policy


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            {"attention_implementation": "flash"},
            r"Pi05Config\.attention_implementation must be one of 'sdpa', 'eager', got 'flash'",
        ),
        ({"width": 0}, r"Pi05Config\.width must be an integer >= 1, got 0"),
        ({"num_heads": 6, "num_kv_heads": 4}, r"num_heads must be a multiple of num_kv_heads=4, got 6"),
        ({"dtype": "float8"}, r"dtype must be one of .*got 'float8'"),
        ({"ce_weight": -1.0}, r"Pi05Config\.ce_weight must be a finite number >= 0, got -1"),
        ({"ce_weight": 0.0, "mse_weight": 0.0}, r"both 0"),
        ({"discrete_action_steps": 99}, r"discrete_action_steps must be at most chunk_size=8, got 99"),
        ({"vocab_size": 64}, r"vocab_size must exceed the 65 reserved"),
        ({"head_dim": 15}, r"head_dim must be even"),
        ({"vision": {"image_size": 30}}, r"image_size must be a multiple of patch_size=8, got 30"),
    ],
)
def test_bad_values_raise_value_error_naming_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        make_config("tiny", **overrides)


def test_unknown_preset_and_field_are_rejected():
    with pytest.raises(ValueError, match=r"preset must be one of 'tiny', 'small', 'pi05', got 'huge'"):
        make_config("huge")
    with pytest.raises(ValueError, match=r"unknown Pi05Config field\(s\) \['widht'\]"):
        make_policy("tiny", widht=8)


def test_configs_are_keyword_only_and_nested_dicts_are_validated():
    with pytest.raises(TypeError):
        Pi05Config(2048)  # positional arguments must fail
    with pytest.raises(ValueError, match=r"VisionConfig\.depth must be an integer >= 1, got -1"):
        Pi05Config(vision={"depth": -1})
    cfg = make_config(
        "tiny", vision=VisionConfig(image_size=16, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64)
    )
    assert cfg.vision.num_patches == 4


def test_presets_have_the_documented_sizes():
    pi05 = make_config("pi05")
    assert (pi05.width, pi05.depth, pi05.num_heads, pi05.num_kv_heads, pi05.head_dim) == (2048, 18, 8, 1, 256)
    assert (pi05.mlp_dim, pi05.vocab_size, pi05.expert_width, pi05.expert_mlp_dim) == (16384, 257152, 1024, 4096)
    v = pi05.vision
    assert (v.image_size, v.patch_size, v.width, v.depth, v.mlp_dim, v.num_heads) == (224, 14, 1152, 27, 4304, 16)
    tiny = make_config("tiny")
    # the token-id layout leaves room for prompt text
    assert tiny.text_vocab_size + tiny.num_reserved_tokens == tiny.vocab_size
    assert dataclasses.replace(tiny, chunk_size=4).chunk_size == 4
