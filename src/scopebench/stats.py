"""The one definition of the summary statistics used everywhere in scopebench.

Every table, report and benchmark script that summarises a list of samples calls
:func:`summarize` (or the small functions below), so "p95" means the same thing in
the console, the HTML report and docs/performance.md.

Conventions:
    * Percentiles use **linear interpolation between closest ranks** (numpy's default
      ``method="linear"``, type 7 of Hyndman & Fan): for sorted samples
      ``x_0 <= ... <= x_{n-1}`` the q-th percentile is read at fractional index
      ``h = (n - 1) * q / 100`` and interpolated between ``x_floor(h)`` and
      ``x_ceil(h)``.
    * ``std`` is the sample standard deviation (``ddof=1``); it is ``0.0`` for a
      single sample.
    * The confidence interval of the mean is the Student-t interval
      ``mean ± t_{1-α/2, n-1} · std / sqrt(n)``; for one sample it collapses to the mean.
    * The confidence interval of a ratio of medians (A/B comparisons) is a seeded
      percentile bootstrap (both samples resampled independently with replacement) from
      :data:`BOOTSTRAP_MIN_SAMPLES` samples a side, and below that the rank interval of
      :func:`scale_ratio_ci`, whose coverage the bootstrap does not reach there
      (:func:`median_ratio_ci` gives the measured coverage).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "BOOTSTRAP_MIN_SAMPLES",
    "Summary",
    "mean",
    "median",
    "percentile",
    "std",
    "confidence_interval",
    "median_ratio_ci",
    "scale_ratio_ci",
    "linear_fit",
    "r_squared",
    "samples_per_sec",
    "summarize",
]


def _as_list(samples: Iterable[float]) -> list[float]:
    values = [float(x) for x in samples]
    if not values:
        raise ValueError("expected at least one sample, got an empty sequence")
    if any(math.isnan(x) for x in values):
        raise ValueError(f"expected finite samples, got NaN in {values[:8]}")
    return values


def mean(samples: Iterable[float]) -> float:
    """Arithmetic mean ``sum(x) / n``.

    :Examples:
        >>> mean([1.0, 2.0, 6.0])
        3.0
    """
    values = _as_list(samples)
    return math.fsum(values) / len(values)


def percentile(samples: Iterable[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks.

    Args:
        samples: The values.
        q: Percentile in [0, 100].

    :Examples:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
        2.5
        >>> percentile(range(1, 101), 95)
        95.05
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"expected a percentile q in [0, 100], got {q!r}")
    values = sorted(_as_list(samples))
    h = (len(values) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (h - lo) * (values[hi] - values[lo])


def median(samples: Iterable[float]) -> float:
    """The 50th percentile (mean of the two middle values for an even count).

    :Examples:
        >>> median([3.0, 1.0, 2.0])
        2.0
    """
    return percentile(samples, 50.0)


def std(samples: Iterable[float]) -> float:
    """Sample standard deviation ``sqrt(sum((x - mean)^2) / (n - 1))``; 0 for n = 1.

    :Examples:
        >>> round(std([1.0, 2.0, 3.0, 4.0]), 6)
        1.290994
    """
    values = _as_list(samples)
    if len(values) == 1:
        return 0.0
    m = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((x - m) ** 2 for x in values) / (len(values) - 1))


@functools.lru_cache(maxsize=1024)
def _t_quantile(p: float, dof: int) -> float:
    # scipy is a dependency of scikit-image, so it is always installed with scopebench.
    from scipy.stats import t

    return float(t.ppf(p, dof))


def confidence_interval(samples: Iterable[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval of the mean, ``mean ± t · std / sqrt(n)``.

    :Examples:
        >>> confidence_interval([2.0])
        (2.0, 2.0)
        >>> lo, hi = confidence_interval([1.0, 2.0, 3.0])
        >>> round(lo, 4), round(hi, 4)
        (-0.4841, 4.4841)
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"expected a confidence level in (0, 1), got {level!r}")
    values = _as_list(samples)
    m = mean(values)
    if len(values) == 1:
        return (m, m)
    half = _t_quantile(0.5 + level / 2.0, len(values) - 1) * std(values) / math.sqrt(len(values))
    return (m - half, m + half)


@dataclass(frozen=True)
class Summary:
    """Summary of one series of samples (all in the samples' own unit)."""

    count: int
    mean: float
    median: float
    p95: float
    p99: float
    std: float
    min: float
    max: float
    ci_low: float
    ci_high: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(samples: Sequence[float] | Iterable[float], level: float = 0.95) -> Summary:
    """All the statistics of this module for one series.

    :Examples:
        >>> s = summarize([1.0, 2.0, 3.0, 4.0])
        >>> s.count, s.mean, s.median, s.min, s.max
        (4, 2.5, 2.5, 1.0, 4.0)
    """
    values = _as_list(samples)
    lo, hi = confidence_interval(values, level)
    return Summary(
        count=len(values),
        mean=mean(values),
        median=median(values),
        p95=percentile(values, 95.0),
        p99=percentile(values, 99.0),
        std=std(values),
        min=min(values),
        max=max(values),
        ci_low=lo,
        ci_high=hi,
    )


def samples_per_sec(batch_size: int, metrics: dict[str, Any]) -> float | None:
    """Throughput of one step: ``batch_size / step_time_sec``.

    The one definition of ``samples_per_sec`` in every benchmark: the step without the
    benchopt scoring callback (which ``total_time_sec`` includes), as the profiler reports
    it in ``step_time_sec``; metrics without that key (rows of an older profiler) fall back
    to ``total_time_sec - callback_time_sec``. Pass the global batch (all ranks) for a
    global rate.

    ``None`` when the step was not recorded (outside the profiler's window, or no timer).

    :Examples:
        >>> samples_per_sec(8, {"total_time_sec": 0.5, "callback_time_sec": 0.1, "step_time_sec": 0.4})
        20.0
        >>> samples_per_sec(8, {"total_time_sec": 0.5, "callback_time_sec": 0.1})
        20.0
        >>> samples_per_sec(8, {}) is None
        True
    """
    step = metrics.get("step_time_sec")
    if step is None:
        total = metrics.get("total_time_sec")
        if total is None:
            return None
        step = total - metrics.get("callback_time_sec", 0.0)
    return batch_size / step if step > 0 else None


#: Fewest samples on each side for which :func:`median_ratio_ci` bootstraps; below it, the
#: bootstrap's interval is too narrow for its level (coverage measured in its docstring).
BOOTSTRAP_MIN_SAMPLES = 5


def median_ratio_ci(
    a: Iterable[float], b: Iterable[float], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Ratio ``median(b) / median(a)`` with a confidence interval at ``level``.

    From :data:`BOOTSTRAP_MIN_SAMPLES` samples on each side, a percentile bootstrap: each of
    ``resamples`` rounds draws ``len(a)`` values from ``a`` and ``len(b)`` from ``b`` with
    replacement (a generator seeded with ``seed``: the same inputs give the same interval)
    and takes the ratio of their medians (a round whose ``a`` median is 0 counts as an
    infinite ratio); the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2``
    percentiles of those ratios (linear interpolation, as :func:`percentile`).

    With fewer samples on a side the bootstrap's interval is too narrow: with ``B = 2 A`` in
    distribution, 1000 simulated pairs per cell, 95 % intervals covered the true ratio in
    89-92 % of the pairs at 3 samples a side and 92-94 % at 4, against 94-98 % at every size
    from 5 to 10 (log-normal times with 5 % and 50 % spread, 1 + an exponential, 10 %
    outliers 3x slower; also 5 against 40 samples and A, B of different shapes). Below 5,
    the interval is therefore :func:`scale_ratio_ci`'s rank interval, whose coverage is
    exact under its model, and unbounded (``(0, inf)``) when no interval at ``level`` exists
    from so few samples (3 a side at 95 %). At ``level`` 0.99 the bootstrap covered 98.2-98.5 %
    at 5 samples a side and 99 % or more from 6.

    Returns:
        ``(ratio, low, high)``.

    Raises:
        ValueError: an empty or NaN sample, a level outside (0, 1), or a baseline median <= 0
            (the ratio is undefined).

    :Examples:
        >>> ratio, low, high = median_ratio_ci([1.0, 1.1, 0.9, 1.0, 1.05], [2.0, 2.2, 1.8, 2.0, 2.1])
        >>> ratio, low <= 2.0 <= high
        (2.0, True)
        >>> median_ratio_ci([1.0, 1.1, 0.9], [2.0, 2.2, 1.8])
        (2.0, 0.0, inf)
    """
    import numpy as np

    if not 0.0 < level < 1.0:
        raise ValueError(f"expected a confidence level in (0, 1), got {level!r}")
    if resamples < 1:
        raise ValueError(f"expected at least one bootstrap resample, got {resamples!r}")
    xa, xb = np.asarray(_as_list(a)), np.asarray(_as_list(b))
    if median(xa) <= 0.0:
        raise ValueError(f"expected a positive median for the baseline sample, got {median(xa)!r}")
    ratio = median(xb) / median(xa)
    if min(xa.size, xb.size) < BOOTSTRAP_MIN_SAMPLES:
        return (ratio, *scale_ratio_ci(xa.tolist(), xb.tolist(), level))
    rng = np.random.default_rng(seed)
    med_a = np.median(xa[rng.integers(0, xa.size, size=(resamples, xa.size))], axis=1)
    med_b = np.median(xb[rng.integers(0, xb.size, size=(resamples, xb.size))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(med_a > 0.0, med_b / np.where(med_a > 0.0, med_a, 1.0), math.inf).tolist()
    alpha = (1.0 - level) / 2.0 * 100.0
    return ratio, percentile(ratios, alpha), percentile(ratios, 100.0 - alpha)


def _rank_sum_counts(m: int, n: int) -> list[int]:
    """How many of the ``C(m + n, m)`` orderings of two samples (sizes ``m``, ``n``, no ties)
    give the Mann-Whitney count ``U = u``, for ``u = 0 .. m n``: the coefficients of the
    Gaussian binomial ``[m + n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i)``.

    :Examples:
        >>> _rank_sum_counts(2, 2)
        [1, 1, 2, 1, 1]
    """
    m, n = min(m, n), max(m, n)
    poly = [1]
    for i in range(1, m + 1):
        grown = poly + [0] * (n + i)
        for j, c in enumerate(poly):
            grown[j + n + i] -= c
        for j in range(i, len(grown)):  # divide by (1 - q^i)
            grown[j] += grown[j - i]
        poly = grown[: len(grown) - i]
    return poly


def scale_ratio_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Rank confidence interval (Moses's, on a log scale) for the factor ``r`` in the scale
    model ``b ~ r a``: B's times are A's times multiplied by ``r`` (then ``r`` is also the
    ratio of their medians).

    The ``m n`` ratios ``b_j / a_i`` sorted, the interval is ``[R_(k), R_(mn+1-k)]`` with
    the largest ``k`` whose two tails hold at most ``1 - level`` of the Mann-Whitney null
    distribution: its coverage, ``1 - 2 P(U <= k - 1)``, is exact for continuous times
    under the model (without it, no interval reaches 95 % from fewer than 7 samples a
    side). When even ``k = 1`` (``[min b / max a, max b / min a]``, coverage
    ``1 - 2 / C(m + n, m)``) falls short of ``level`` the interval is ``(0, inf)``: 3
    samples a side reach 90 %, 4 a side 97.1 %.

    :Examples:
        >>> scale_ratio_ci([1.0, 1.1, 0.9, 1.0], [2.0, 2.2, 1.8, 2.0])
        (1.6363636363636362, 2.4444444444444446)
        >>> scale_ratio_ci([1.0, 1.1, 0.9], [2.0, 2.2, 1.8])
        (0.0, inf)
    """
    import numpy as np

    if not 0.0 < level < 1.0:
        raise ValueError(f"expected a confidence level in (0, 1), got {level!r}")
    xa, xb = np.asarray(_as_list(a)), np.asarray(_as_list(b))
    counts = _rank_sum_counts(xa.size, xb.size)
    total, tail, k = sum(counts), 0, 0
    allowed = (1.0 - level) * total * (1.0 + 1e-12)  # 1 - 0.8 is 0.19999999999999996
    while 2 * (tail + counts[k]) <= allowed:
        tail += counts[k]
        k += 1
    if k == 0:
        return (0.0, math.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.sort(np.nan_to_num(xb[None, :] / xa[:, None], nan=math.inf).ravel())
    return float(ratios[k - 1]), float(ratios[ratios.size - k])


def linear_fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares line ``y = intercept + slope · x``; returns ``(intercept, slope)``.

    ``slope = sum((x - mean x)(y - mean y)) / sum((x - mean x)^2)``; used for the
    inference latency model ``L(N) = F + N·s`` (intercept ``F``, slope ``s``).

    :Examples:
        >>> linear_fit([1, 10], [82.0, 316.0])
        (56.0, 26.0)
    """
    xs, ys = _as_list(x), _as_list(y)
    if len(xs) != len(ys):
        raise ValueError(f"expected as many x as y values, got {len(xs)} and {len(ys)}")
    mx, my = mean(xs), mean(ys)
    sxx = math.fsum((v - mx) ** 2 for v in xs)
    if sxx == 0.0:
        raise ValueError(f"expected at least two distinct x values, got {sorted(set(xs))}")
    slope = math.fsum((u - mx) * (v - my) for u, v in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def r_squared(x: Sequence[float], y: Sequence[float]) -> float:
    """Coefficient of determination of :func:`linear_fit`'s line: ``1 - SS_res / SS_tot``
    (1.0 when every ``y`` is equal and the line passes through them).

    :Examples:
        >>> r_squared([1, 2, 3], [2.0, 4.0, 6.0])
        1.0
        >>> round(r_squared([1, 2, 3], [1.0, 3.0, 2.0]), 2)
        0.25
    """
    intercept, slope = linear_fit(x, y)
    ys = _as_list(y)
    my = mean(ys)
    total = math.fsum((v - my) ** 2 for v in ys)
    residual = math.fsum((v - (intercept + slope * u)) ** 2 for u, v in zip(_as_list(x), ys))
    return 1.0 if total == 0.0 else 1.0 - residual / total
