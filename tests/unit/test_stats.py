"""Bootstrap A/B statistics and summary aggregates on distributions with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from tts_bench import stats
from tts_bench.errors import InvalidRunError
from tts_bench.stats import compare, summarize


def normal_repeats(mean: float, *, sd: float, n: int, repeats: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(mean, sd, size=n) for _ in range(repeats)]


def test_known_shift_is_covered_by_the_ci_and_called_faster():
    base = normal_repeats(1.0, sd=0.05, n=200, repeats=3, seed=1)
    test = normal_repeats(0.95, sd=0.05, n=200, repeats=3, seed=2)  # true delta -5%
    cmp = compare(base, test, min_effect_pct=2.0, resamples=2000, seed=0)
    lo, hi = cmp.ci95_pct
    assert lo < -5.0 < hi and hi < 0
    assert cmp.delta_mean_pct == pytest.approx(-5.0, abs=0.5)
    assert cmp.delta_median_pct == pytest.approx(-5.0, abs=1.0)
    lo_m, hi_m = cmp.ci95_median_pct
    assert lo_m < -5.0 < hi_m
    assert cmp.verdict == "faster" and cmp.significant
    assert (cmp.n_base, cmp.n_test) == (600, 600)


def test_slowdown_is_called_slower():
    base = normal_repeats(1.0, sd=0.05, n=100, repeats=2, seed=3)
    test = normal_repeats(1.2, sd=0.05, n=100, repeats=2, seed=4)  # the deliberately slowed arm
    cmp = compare(base, test, min_effect_pct=2.0, resamples=1000, seed=0)
    assert cmp.verdict == "slower" and cmp.ci95_pct[0] > 0
    assert cmp.delta_mean_pct == pytest.approx(20.0, abs=1.0)


def test_identical_samples_are_within_noise():
    base = normal_repeats(1.0, sd=0.1, n=50, repeats=3, seed=5)
    cmp = compare(base, [a.copy() for a in base], min_effect_pct=2.0, resamples=2000, seed=0)
    assert cmp.delta_mean_pct == 0.0
    lo, hi = cmp.ci95_pct
    assert lo < 0 < hi  # independent resampling of each arm: spread around zero
    assert cmp.verdict == "within noise"


def test_significant_but_small_effect_is_within_noise():
    base = normal_repeats(1.0, sd=0.01, n=500, repeats=2, seed=6)
    test = normal_repeats(0.99, sd=0.01, n=500, repeats=2, seed=7)  # -1%, very tight
    cmp = compare(base, test, min_effect_pct=2.0, resamples=1000, seed=0)
    assert cmp.significant and cmp.ci95_pct[1] < 0
    assert cmp.verdict == "within noise"
    assert compare(base, test, min_effect_pct=0.5, resamples=1000, seed=0).verdict == "faster"


def test_large_but_noisy_effect_is_within_noise():
    base = [np.array([1.0, 3.0]), np.array([0.5, 2.5])]
    test = [np.array([0.9, 2.5]), np.array([0.6, 2.2])]
    assert compare(base, test, min_effect_pct=2.0, resamples=500, seed=0).verdict == "within noise"


def test_bootstrap_is_seeded():
    base = normal_repeats(1.0, sd=0.1, n=30, repeats=2, seed=8)
    test = normal_repeats(1.02, sd=0.1, n=30, repeats=2, seed=9)
    a = compare(base, test, resamples=500, seed=123)
    assert a == compare(base, test, resamples=500, seed=123)
    assert a.ci95_pct != compare(base, test, resamples=500, seed=124).ci95_pct


def test_stratified_resampling_keeps_every_repeat():
    # Repeat 0 fast, repeat 1 slow: every stratified resample keeps both repeats' weight, so with
    # zero within-repeat spread the resampled mean cannot move and the CI collapses to the point.
    base = [np.full(10, 1.0), np.full(10, 2.0)]
    test = [np.full(10, 0.9), np.full(10, 1.8)]
    cmp = compare(base, test, resamples=300, seed=0, method="stratified")
    assert cmp.ci95_pct == pytest.approx((-10.0, -10.0))
    assert cmp.verdict == "faster" and cmp.method == "stratified"


def test_hierarchical_resampling_counts_repeat_to_repeat_spread():
    # Same data: the repeats disagree by 2x, so two repeats cannot pin a 10% effect down.
    base = [np.full(10, 1.0), np.full(10, 2.0)]
    test = [np.full(10, 0.9), np.full(10, 1.8)]
    cmp = compare(base, test, resamples=300, seed=0)
    assert cmp.method == "hierarchical"
    assert cmp.delta_mean_pct == pytest.approx(-10.0)
    assert cmp.ci95_pct[0] < -40 and cmp.ci95_pct[1] > 40
    assert cmp.verdict == "within noise"


def test_hierarchical_is_less_often_fooled_by_run_level_offsets_in_a_a():
    # A/A where every (arm, repeat) run gets its own 5% offset: the situation on a shared machine.
    rng = np.random.default_rng(42)

    def arm() -> list[np.ndarray]:
        return [(1 + rng.normal(0, 0.05)) * (1 + rng.normal(0, 0.1, 12)) for _ in range(3)]

    trials = [(arm(), arm()) for _ in range(60)]
    rate = {
        m: np.mean([compare(b, t, resamples=300, seed=i, method=m).significant for i, (b, t) in enumerate(trials)])
        for m in ("stratified", "hierarchical")
    }
    assert rate["hierarchical"] < rate["stratified"]
    assert rate["hierarchical"] <= 0.25


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="hierarchical, stratified"):
        compare([np.ones(3)], [np.ones(3)], method="bayes")  # type: ignore[arg-type]


def test_single_array_is_one_repeat():
    base, test = np.linspace(1.0, 1.1, 40), np.linspace(0.8, 0.9, 40)
    assert compare(base, test, resamples=200).verdict == "faster"


def test_higher_is_better_flips_the_verdict():
    base, test = np.full(20, 10.0) + np.linspace(0, 0.1, 20), np.full(20, 12.0) + np.linspace(0, 0.1, 20)
    assert compare(base, test, resamples=200, lower_is_better=False).verdict == "faster"
    assert compare(base, test, resamples=200).verdict == "slower"


@pytest.mark.parametrize("method", ["stratified", "hierarchical"])
def test_resamples_are_drawn_in_blocks_without_losing_any(monkeypatch, method):
    # Memory stays bounded on big runs: resamples are drawn in blocks of _BLOCK_VALUES values.
    monkeypatch.setattr(stats, "_BLOCK_VALUES", 50)  # 20 values -> blocks of 2 resamples
    strata = normal_repeats(1.0, sd=0.1, n=10, repeats=2, seed=12)
    means, medians = stats._bootstrap_stats(strata, 101, np.random.default_rng(0), method)
    assert means.shape == medians.shape == (101,)
    assert len(set(means.tolist())) == 101  # blocks are fresh draws, not copies of each other
    base = normal_repeats(1.0, sd=0.05, n=10, repeats=2, seed=10)
    assert compare(base, [b * 0.9 for b in base], resamples=101, seed=0, method=method).verdict == "faster"


def test_hierarchical_handles_repeats_of_different_sizes():
    strata = [np.array([1.0, 1.1, 1.2]), np.linspace(2.0, 3.0, 10)]
    means, medians = stats._bootstrap_stats(strata, 500, np.random.default_rng(0), "hierarchical")
    assert np.isfinite(means).all() and np.isfinite(medians).all()
    assert means.min() >= 1.0 and means.max() <= 3.0
    # Both repeats drawn as the short one happens: its mean then stands alone.
    assert means.min() < 1.25 and means.max() > 2.3


@pytest.mark.parametrize(
    ("base", "test"),
    [([np.array([])], [np.array([1.0])]), ([np.array([1.0])], []), ([np.array([1.0, np.inf])], [np.array([1.0])])],
)
def test_empty_or_non_finite_arm_is_an_invalid_run(base, test):
    with pytest.raises(InvalidRunError):
        compare(base, test, resamples=10)


def test_summarize_matches_numpy_linear_percentiles():
    values = np.arange(1, 101, dtype=float)
    s = summarize(values)
    assert s["count"] == 100
    assert s["mean"] == 50.5 and s["median"] == 50.5
    assert s["std"] == pytest.approx(np.std(values))
    assert s["p90"] == pytest.approx(90.1) and s["p99"] == pytest.approx(99.01)


def test_summarize_with_name_uses_vllm_keys_and_empty_is_none():
    s = summarize([0.5, 1.5], name="audio_rtf")
    assert set(s) == {"count", "mean_audio_rtf", "median_audio_rtf", "std_audio_rtf", "p90_audio_rtf", "p99_audio_rtf"}
    assert s["mean_audio_rtf"] == 1.0
    empty = summarize([], name="audio_rtf")
    assert empty["count"] == 0 and empty["p99_audio_rtf"] is None
