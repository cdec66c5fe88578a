"""The gate's Mann-Whitney U p-value (scipy, pinned) against published values, the textbook
formula the gate used before scipy, and an exact permutation variance."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import rankdata

from tts_bench.verdicts.stats import mann_whitney_p


def textbook_p(x, y) -> float:
    """The formula the gate computed by hand until it moved to scipy (kept as the reference):
    U1 = R1 - n1 (n1 + 1) / 2, sigma^2 = n1 n2 / 12 ((n + 1) - sum(t^3 - t) / (n (n - 1))),
    z = max(|U1 - n1 n2 / 2| - 0.5, 0) / sigma, p = erfc(z / sqrt(2))."""
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n1, n2 = xa.size, ya.size
    n = n1 + n2
    pooled = np.concatenate([xa, ya])
    u1 = rankdata(pooled)[:n1].sum() - n1 * (n1 + 1) / 2.0
    _, t = np.unique(pooled, return_counts=True)
    var = n1 * n2 / 12.0 * ((n + 1) - float(np.sum(t.astype(np.float64) ** 3 - t)) / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = max(abs(u1 - n1 * n2 / 2.0) - 0.5, 0.0) / math.sqrt(var)
    return min(1.0, math.erfc(z / math.sqrt(2.0)))


FIXED = [
    ([19, 22, 16, 29, 24], [20, 11, 17, 12]),
    ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]),
    ([3.1, 2.2, 5.0, 4.4, 4.4], [1.0, 2.2, 0.5, 3.3]),
    ([1, 2, 2, 3, 3], [2, 3, 3, 4, 5, 5]),
    ([1.0, 1.0, 1.0], [1.0, 1.0]),
    ([1.0], [2.0]),
]


def random_cases(count: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    for i in range(count):
        n1, n2 = (int(v) for v in rng.integers(1, 160, size=2))
        if i % 3 == 0:  # heavy ties, like quantised latencies
            yield rng.integers(0, 5, n1).astype(float), rng.integers(0, 6, n2).astype(float)
        else:  # skewed, like RTF
            yield rng.lognormal(0.0, 0.3, n1), rng.lognormal(0.05, 0.3, n2)


def test_scipy_p_values_equal_the_textbook_formula_to_1e_12():
    cases = FIXED + list(random_cases())
    worst = max(abs(mann_whitney_p(x, y) - textbook_p(x, y)) for x, y in cases)
    assert worst <= 1e-12, worst


def test_scipy_documentation_example_asymptotic_p_value():
    # scipy.stats.mannwhitneyu docs (males vs females, method="asymptotic"): p = 0.11134688653314041.
    # The method is pinned: scipy's default would take the exact distribution here (p = 0.111...).
    assert mann_whitney_p([19, 22, 16, 29, 24], [20, 11, 17, 12]) == pytest.approx(0.11134688653314041, rel=1e-12)


def test_fully_separated_samples_give_the_textbook_p():
    # mu = 12.5, sigma^2 = 25 * 11 / 12, z = (12.5 - 0.5) / sigma = 2.5067 -> p = 0.012186
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.0121858, rel=1e-5)


def test_swapping_the_samples_keeps_p():
    x, y = [3.1, 2.2, 5.0, 4.4, 4.4], [1.0, 2.2, 0.5, 3.3]
    assert mann_whitney_p(x, y) == pytest.approx(mann_whitney_p(y, x), rel=1e-14)


def test_tie_corrected_variance_equals_the_exact_permutation_variance():
    # With ties the normal approximation must use Var(U) under the permutation null; compute it
    # by enumerating every split of the pooled sample and compare with the p the function gives.
    x, y = [1, 2, 2, 3, 3], [2, 3, 3, 4, 5, 5]
    pooled = np.array(x + y, dtype=float)
    ranks = rankdata(pooled)
    n1 = len(x)
    us = [ranks[list(c)].sum() - n1 * (n1 + 1) / 2 for c in itertools.combinations(range(len(pooled)), n1)]
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    z = (abs(u1 - n1 * len(y) / 2) - 0.5) / math.sqrt(float(np.var(us)))
    assert mann_whitney_p(x, y) == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-9)


def test_all_values_tied_means_no_evidence():
    assert mann_whitney_p([1.0, 1.0, 1.0], [1.0, 1.0]) == 1.0


def test_empty_or_non_finite_samples_are_refused():
    with pytest.raises(ValueError, match="both sides"):
        mann_whitney_p([], [1.0])
    with pytest.raises(ValueError, match="non-finite"):
        mann_whitney_p([1.0, float("inf")], [1.0])
