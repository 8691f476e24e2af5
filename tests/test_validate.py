"""The shared validators: one error style (key, value, what is allowed)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from scopebench.validate import (
    MAX_ALIAS_NODES,
    batch_limit,
    check_batch_fits,
    choice,
    flag,
    integer,
    load_yaml,
    number,
    optional,
    quote,
    yaml_mapping,
)


@pytest.mark.parametrize("bad", ["abc", 1.5, True, None, "4"])
def test_integer_rejects_non_integers_naming_key_and_value(bad):
    with pytest.raises(ValueError, match=rf"^batch_size must be an integer >= 1, got {repr(bad)[:3]}"):
        integer("batch_size", bad, low=1)


def test_integer_bounds():
    assert integer("n", 3, low=1, high=3) == 3
    with pytest.raises(ValueError, match=r"n must be an integer >= 1 and <= 3, got 4$"):
        integer("n", 4, low=1, high=3)


@pytest.mark.parametrize("bad", ["abc", True, math.nan, math.inf, 0, -1.0])
def test_number_rejects(bad):
    with pytest.raises(ValueError, match=r"^learning_rate must be a finite number > 0, got "):
        number("learning_rate", bad, low=0, low_open=True)


def test_number_converts_int_and_keeps_closed_bounds():
    assert number("grad_clip", 0, low=0) == 0.0 and isinstance(number("x", 2), float)
    with pytest.raises(ValueError, match="< 1"):
        number("p", 1.0, low=0, high=1, high_open=True)


def test_flag_choice_optional():
    assert flag("f", False) is False
    with pytest.raises(ValueError, match="f must be true or false, got 1 \\(int\\)"):
        flag("f", 1)
    assert choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match="mode must be one of 'a', 'b', got 'c'"):
        choice("mode", "c", ["a", "b"])
    assert optional(integer, "m", None, low=1) is None
    with pytest.raises(ValueError, match="m must be"):
        optional(integer, "m", 0, low=1)


# --- Huge values and hostile YAML: bounded messages, bounded alias expansion -------------

REPO = Path(__file__).resolve().parents[1]
#: Every YAML file of the repository's config folders: all are read through load_yaml.
CONFIGS = sorted(
    p
    for pattern in ("configs/**/*.yml", "benchmark_*/configs/**/*.yml", "*config.yml", "benchmark_*/config.yml")
    for p in REPO.glob(pattern)
) + sorted((REPO / "src" / "scopebench" / "train" / "accelerate_configs").glob("*.yaml"))


def _shared_nest(levels: int, width: int) -> list:
    """``width`` references to the level below, ``levels`` deep: tiny in memory, ``width**levels`` leaves."""
    value: list = ["x"] * width
    for _ in range(levels - 1):
        value = [value] * width
    return value


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs" document: each anchor is ``width`` aliases of the one before."""
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("samples", "world_size"), [(8, 1), (8, 2), (7, 2), (96, 3), (1, 1)])
def test_the_batch_rule_accepts_exactly_up_to_its_limit(samples, world_size):
    # One rule, one bound: find-max-batch searches up to batch_limit, and the refusals
    # of every benchmark (policy solvers and runs, imaging training) come from check_batch_fits.
    limit = batch_limit(samples, world_size)
    check_batch_fits(limit, samples, world_size)
    with pytest.raises(ValueError, match=rf"^batch_size {limit + 1} is larger than the {limit} training samples"):
        check_batch_fits(limit + 1, samples, world_size)
    check_batch_fits(10**6, None, world_size)  # samples unknown yet: checked later


def test_the_batch_rule_names_the_dataset_and_how_to_grow_it():
    with pytest.raises(ValueError) as err:
        check_batch_fits(9, 8, dataset="the training set", larger="a larger n_train")
    assert str(err.value) == (
        "batch_size 9 is larger than the 8 training samples of the training set: lower batch_size or use a larger n_train"
    )


def test_small_values_are_quoted_as_repr_shows_them():
    looped: list = [1]
    looped.append(looped)
    values = ["abc", "it's", "", b"x", 1.5, None, (), (1,), [1, (2,), {3: [4]}], {1, 2}, set(), frozenset({1})]
    for value in [*values, frozenset(), {"k": {"j": []}}, looped, [[]]]:
        assert quote(value) == repr(value)
    with pytest.raises(ValueError, match=r"^n must be true or false, got \[1, \[\.\.\.\]\] \(list\)$"):
        flag("n", looped)


def test_a_huge_string_is_quoted_short_with_its_key_type_and_length():
    for check in (lambda v: integer("batch_size", v, low=1), lambda v: choice("batch_size", v, ("a", "b"))):
        with pytest.raises(ValueError) as err:
            check("x" * 1_000_000)
        message = str(err.value)
        assert len(message) < 1000 and message.startswith("batch_size must be ")
        assert message.endswith("xxx...' (str, 1000000 characters)"), message[-60:]


def test_a_shared_nested_value_is_quoted_without_building_its_repr():
    # 10**6 leaves: the full repr is 5 MB; the message must stay a line.
    with pytest.raises(ValueError, match=r"^n must be an integer, got \[\[\[.{150,}\.\.\. \(list, 10 items\)$") as err:
        integer("n", _shared_nest(6, 10))
    assert len(str(err.value)) < 300


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_config_of_the_repository_loads_as_safe_load_reads_it(path):
    import yaml

    assert load_yaml(path) == yaml.safe_load(path.read_text())


def test_configs_are_found():
    # The parametrized test above passes vacuously if the globs find nothing.
    assert len(CONFIGS) > 20 and any(p.match("configs/policy/tiny.yml") for p in CONFIGS)


def test_an_alias_bomb_is_refused_naming_the_file_before_any_object_is_built(tmp_path, monkeypatch):
    import yaml

    bomb = tmp_path / "bomb.yml"
    bomb.write_text(_alias_bomb())
    assert len(bomb.read_bytes()) < 600

    def no_construction(self, node):
        raise AssertionError("objects were built before the aliases were counted")

    monkeypatch.setattr(yaml.SafeLoader, "construct_document", no_construction)
    pattern = (
        rf"^{re.escape(str(bomb))}: its YAML aliases add at least [\d,]+ nodes once expanded, over the 10,000 allowed; "
    )
    with pytest.raises(ValueError, match=pattern):
        load_yaml(bomb)
    with pytest.raises(ValueError, match=pattern):
        yaml_mapping(bomb, "policy config")


def test_aliases_are_allowed_up_to_the_limit():
    def doc(n_aliases: int) -> str:  # each alias of the 100-item list adds its 101 nodes
        return "a: &a [" + "x, " * 100 + "]\nb: [" + "*a, " * n_aliases + "]\n"

    assert 99 * 101 <= MAX_ALIAS_NODES < 100 * 101
    assert len(load_yaml("ok.yml", doc(99))["b"]) == 99
    with pytest.raises(ValueError, match=r"^big\.yml: its YAML aliases add at least 10,100 nodes"):
        load_yaml("big.yml", doc(100))
    merged = load_yaml("merge.yml", "base: &base {lr: 1, steps: 2}\nrun:\n  <<: *base\n  steps: 3\n")
    assert merged["run"] == {"lr": 1, "steps": 3}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("&a [*a]", r"^t\.yml: a YAML alias refers to a node that holds it"),
        ("&a {k: [*a]}", r"^t\.yml: a YAML alias refers to a node that holds it"),
        ("[" * 1000 + "]" * 1000, r"^t\.yml: YAML nested too deep to read"),
        ("n: " + "1" * 5000, r"^t\.yml: Exceeds the limit \(4300 digits\)"),
        ("a: [1, 2", r'^t\.yml is not valid YAML: while parsing a flow sequence\n  in "t\.yml", line 1'),
        ("n: *" + "y" * 100_000, r"^t\.yml is not valid YAML: found undefined alias 'yyy.*\(100\d\d\d characters\)$"),
    ],
)
def test_unreadable_yaml_is_one_bounded_value_error_naming_the_file(text, match):
    with pytest.raises(ValueError, match=match) as err:
        load_yaml("t.yml", text)
    assert len(str(err.value)) < 1000


# -- issue 44: floats YAML 1.1 reads as strings, seeds, duplicate keys, non-UTF-8 files --------------
@pytest.mark.parametrize(("text", "value"), [("1e-3", 1e-3), ("5E-1", 0.5), ("-2.5e2", -250.0), (".5e1", 5.0)])
def test_a_float_yaml_1_1_reads_as_a_string_is_that_number(text, value):
    import yaml

    assert yaml.safe_load(f"x: {text}")["x"] == text  # what PyYAML (and benchopt) hand over
    assert number("learning_rate", text) == value


@pytest.mark.parametrize("bad", ["30", "0.5", "1e", "e5", "1e-3x", " 1e-3", "inf", "1_0e2", "1e-3" + " " * 200])
def test_other_strings_stay_refused_as_numbers(bad):
    with pytest.raises(ValueError, match=r"^lr must be a finite number, got '.*' \(str"):
        number("lr", bad)


def test_a_huge_exponent_in_a_string_is_refused_as_not_finite():
    with pytest.raises(ValueError, match=r"^lr must be a finite number, got inf$"):
        number("lr", "1e999999")


def test_seeds_are_bounded_by_what_torch_takes():
    import torch

    from scopebench.validate import MAX_SEED, seed

    assert seed("seed", MAX_SEED) == MAX_SEED and seed("seed", 0) == 0
    torch.Generator().manual_seed(MAX_SEED + 10**6)  # the sampler's seed + epoch still fits
    message = r"^seed must be an integer from 0 to 2\*\*63 - 1 \(torch seeds its generators with 64 bits and "
    for bad, shown in ((2**64, "18446744073709551616"), (-1, "-1"), ("7", r"'7' \(str\)"), (True, r"True \(bool\)")):
        with pytest.raises(ValueError, match=message + r"the sampler adds the epoch\), got " + shown + "$"):
            seed("seed", bad)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a: 1\nb: 2\na: 3\n", r"^d\.yml: key 'a' appears twice in one mapping, at line 1 and line 3; YAML would keep"),
        ("top:\n  seed: 1\n  lr: 2\n  seed: 3\n", r"^d\.yml: key 'seed' appears twice in one mapping, at line 2 and "),
        ("- {x: 1, 'x': 2}\n", r"^d\.yml: key 'x' appears twice in one mapping, at line 1 and line 1"),
        ("1: a\n0x1: b\n", r"^d\.yml: key 1 appears twice in one mapping"),
    ],
)
def test_a_duplicate_key_is_refused_naming_the_key_and_both_lines(text, match):
    import yaml

    yaml.safe_load(text)  # PyYAML alone takes it, keeping the last value
    with pytest.raises(ValueError, match=match) as err:
        load_yaml("d.yml", text)
    assert "\n" not in str(err.value)


def test_keys_that_only_look_alike_and_merge_overrides_are_not_duplicates():
    assert load_yaml("d.yml", "'1': a\n1: b\n") == {"1": "a", 1: "b"}
    merged = load_yaml("d.yml", "base: &b {lr: 1, steps: 2}\nrun:\n  <<: *b\n  steps: 3\n")
    assert merged["run"] == {"lr": 1, "steps": 3}


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    path = tmp_path / "latin1.yml"
    path.write_bytes("preset: tiny\n# café\n".encode("latin-1"))
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(path))} is not UTF-8 text \(byte 0xe9 at offset 18\); save"
    ):
        load_yaml(path)
    with pytest.raises(ValueError, match=r"latin1\.yml is not UTF-8 text"):
        yaml_mapping(path, "policy config")
