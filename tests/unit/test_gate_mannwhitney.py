"""The Mann-Whitney U test against published values and an exact permutation variance."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tts_bench.gate.mannwhitney import mann_whitney_u, rankdata


def test_scipy_documentation_example_asymptotic_p_value():
    # scipy.stats.mannwhitneyu docs (males vs females, method="asymptotic"): U1 = 17,
    # p = 0.11134688653314041.
    res = mann_whitney_u([19, 22, 16, 29, 24], [20, 11, 17, 12])
    assert res.u == 17.0
    assert res.p_value == pytest.approx(0.11134688653314041, rel=1e-12)
    assert res.z > 0


def test_fully_separated_samples_give_u_zero_and_the_textbook_p():
    # mu = 12.5, sigma^2 = 25 * 11 / 12, z = (12.5 - 0.5) / sigma = 2.5067 -> p = 0.012186
    res = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert res.u == 0.0
    assert res.z == pytest.approx(-2.50672, abs=1e-5)
    assert res.p_value == pytest.approx(0.0121858, rel=1e-5)


def test_swapping_the_samples_keeps_p_and_flips_z():
    x, y = [3.1, 2.2, 5.0, 4.4, 4.4], [1.0, 2.2, 0.5, 3.3]
    a, b = mann_whitney_u(x, y), mann_whitney_u(y, x)
    assert a.p_value == pytest.approx(b.p_value)
    assert a.z == pytest.approx(-b.z)
    assert a.u + b.u == len(x) * len(y)


def test_ranks_of_ties_are_averaged():
    assert rankdata(np.array([20.0, 10.0, 20.0, 30.0])).tolist() == [2.5, 1.0, 2.5, 4.0]


def test_tie_corrected_variance_equals_the_exact_permutation_variance():
    # With ties the normal approximation must use Var(U) under the permutation null; compute it
    # by enumerating every split of the pooled sample and compare with the p the function gives.
    x, y = [1, 2, 2, 3, 3], [2, 3, 3, 4, 5, 5]
    pooled = np.array(x + y, dtype=float)
    ranks = rankdata(pooled)
    n1 = len(x)
    us = [ranks[list(c)].sum() - n1 * (n1 + 1) / 2 for c in itertools.combinations(range(len(pooled)), n1)]
    var = float(np.var(us))
    res = mann_whitney_u(x, y)
    z = (abs(res.u - n1 * len(y) / 2) - 0.5) / math.sqrt(var)
    assert res.p_value == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-9)


def test_all_values_tied_means_no_evidence():
    assert mann_whitney_u([1.0, 1.0, 1.0], [1.0, 1.0]).p_value == 1.0


def test_empty_or_non_finite_samples_are_refused():
    with pytest.raises(ValueError, match="both sides"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="non-finite"):
        mann_whitney_u([1.0, float("inf")], [1.0])
