"""The shared validators: one error style (key, value, what is allowed)."""

from __future__ import annotations

import math

import pytest

from scopebench.validate import choice, flag, integer, number, optional


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
