"""The memory check refuses, with the numbers, what cannot fit."""

from __future__ import annotations

import pytest

from scopebench.train.memory import GB, available_memory_bytes, check_memory_fits


def test_refuses_more_than_available_with_the_numbers():
    available = available_memory_bytes("cpu")
    with pytest.raises(ValueError) as err:
        check_memory_fits(
            "preset",
            "huge",
            needed_bytes=available + 10 * GB,
            what="weights",
            device="cpu",
            override_key="check_memory",
        )
    text = str(err.value)
    assert text.startswith("preset='huge' needs at least ") and "GB are available" in text
    assert "check_memory: false" in text


def test_accepts_what_fits_and_multiplies_by_processes():
    available = available_memory_bytes("cpu")
    check_memory_fits("preset", "tiny", needed_bytes=1, what="w", device="cpu", override_key="k")
    with pytest.raises(ValueError, match=r"per process x 4 processes"):
        check_memory_fits(
            "preset", "x", needed_bytes=available // 2, what="w", device="cpu", override_key="k", processes=4
        )
