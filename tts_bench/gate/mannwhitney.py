"""Mann-Whitney U test (two-sided), normal approximation with tie and continuity corrections.

The gate asks "do the current run's per-request samples come from a slower distribution than
the baseline's?" without assuming normality (RTF and TTFP are skewed, with long right tails).
This is the textbook large-sample form that `scipy.stats.mannwhitneyu(method="asymptotic")`
implements (scipy is not a dependency here):

    U1 = R1 - n1 (n1 + 1) / 2                       R1: rank sum of x in the pooled sample
    mu = n1 n2 / 2
    sigma^2 = n1 n2 / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1)))     t: sizes of tied groups
    z = (|U1 - mu| - 0.5) / sigma                    0.5: continuity correction
    p = erfc(z / sqrt(2))                            two-sided

With fewer than ~8 values per side the approximation is rough (and the test has little power
anyway); the gate then marks a large change `~` rather than `worse`, which is the honest answer.

    res = mann_whitney_u([19, 22, 16, 29, 24], [20, 11, 17, 12])
    res.u, res.p_value        # 17.0, 0.1113... (scipy's asymptotic value)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U statistic of x (number of (x, y) pairs with x > y, ties counting 1/2)
    z: float  # signed: > 0 when x tends to be larger than y
    p_value: float  # two-sided
    n_x: int
    n_y: int


def rankdata(values: np.ndarray) -> np.ndarray:
    """Average ranks (1-based), ties sharing the mean of their ranks, like scipy's `rankdata`."""
    order = np.argsort(values, kind="mergesort")
    sorted_vals = values[order]
    # Group boundaries of equal values in sorted order.
    starts = np.concatenate(([True], sorted_vals[1:] != sorted_vals[:-1]))
    group = np.cumsum(starts) - 1  # group index of each sorted position
    first = np.flatnonzero(starts)  # first sorted position of each group
    counts = np.diff(np.append(first, values.size))
    avg = first + (counts + 1) / 2.0  # mean of 1-based ranks first+1 .. first+count
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = avg[group]
    return ranks


def _tie_term(values: np.ndarray) -> float:
    _, counts = np.unique(values, return_counts=True)
    return float(np.sum(counts.astype(np.float64) ** 3 - counts))


def mann_whitney_u(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> MannWhitney:
    """Two-sided Mann-Whitney U of `x` against `y` (see the module docstring for the formula)."""
    xa = np.asarray(x, dtype=np.float64).ravel()
    ya = np.asarray(y, dtype=np.float64).ravel()
    if xa.size == 0 or ya.size == 0:
        raise ValueError(f"mann_whitney_u needs samples on both sides, got {xa.size} and {ya.size}")
    if not (np.isfinite(xa).all() and np.isfinite(ya).all()):
        raise ValueError("mann_whitney_u got non-finite values; drop failed requests first")
    n1, n2 = xa.size, ya.size
    n = n1 + n2
    pooled = np.concatenate([xa, ya])
    r1 = float(rankdata(pooled)[:n1].sum())
    u1 = r1 - n1 * (n1 + 1) / 2.0
    mu = n1 * n2 / 2.0
    var = n1 * n2 / 12.0 * ((n + 1) - _tie_term(pooled) / (n * (n - 1)))
    if var <= 0:  # every value tied: no evidence of any difference
        return MannWhitney(u1, 0.0, 1.0, n1, n2)
    sigma = math.sqrt(var)
    diff = u1 - mu
    z_abs = max(abs(diff) - 0.5, 0.0) / sigma
    p = min(1.0, math.erfc(z_abs / math.sqrt(2.0)))
    return MannWhitney(u1, math.copysign(z_abs, diff), p, n1, n2)
