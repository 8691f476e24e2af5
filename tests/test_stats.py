"""scopebench.stats: the one definition of the summary statistics."""

from __future__ import annotations

import numpy as np
import pytest

from scopebench import stats


def test_percentiles_match_numpy_linear_interpolation():
    rng = np.random.default_rng(0)
    samples = rng.exponential(size=57).tolist()
    for q in (0, 5, 50, 95, 99, 100):
        assert stats.percentile(samples, q) == pytest.approx(np.percentile(samples, q, method="linear"))


def test_summary_fields():
    s = stats.summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.count, s.mean, s.median, s.min, s.max) == (4, 2.5, 2.5, 1.0, 4.0)
    assert s.std == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert s.ci_low < s.mean < s.ci_high
    assert set(s.as_dict()) == {"count", "mean", "median", "p95", "p99", "std", "min", "max", "ci_low", "ci_high"}


def test_confidence_interval_narrows_with_more_samples():
    rng = np.random.default_rng(1)
    few = rng.normal(size=10).tolist()
    many = rng.normal(size=1000).tolist()
    width = lambda xs: np.subtract(*stats.confidence_interval(xs)[::-1])  # noqa: E731
    assert width(many) < width(few)


@pytest.mark.parametrize("bad, message", [([], "at least one sample"), ([1.0, float("nan")], "NaN")])
def test_bad_samples(bad, message):
    with pytest.raises(ValueError, match=message):
        stats.mean(bad)


def test_bad_percentile():
    with pytest.raises(ValueError, match="percentile q in \\[0, 100\\], got 101"):
        stats.percentile([1.0], 101)
