"""A/B statistics: bootstrap CI of the relative difference between two arms, and a verdict.

Noise is measured, not asserted. For each arm the per-request values (e.g. `audio_rtf`) come
grouped by repeat. The statistic is the relative difference of pooled means (and medians),
`100 * (test / base - 1)`, and the 95% interval is the percentile interval of that statistic
over bootstrap resamples of each arm. Two resampling schemes:

- `hierarchical` (default): draw the arm's repeats with replacement, then requests with
  replacement within each drawn repeat. Whole repeats shift together on real machines (warm
  caches, a neighbour's load), and requests of one repeat share that shift, so resampling only
  requests pretends there is more independent evidence than there is. In simulation with a 5%
  run-to-run offset, 2 repeats x 12 requests, A/A intervals excluded 0 about 40% of the time
  when stratified and about 15% when hierarchical (about 4% with 5 repeats).
- `stratified`: keep every repeat, draw requests within each. Right when repeats are exchangeable
  (no run-level shift); identical to `hierarchical` with a single repeat.

The verdict needs both significance and size (pyperf/asv practice):

    faster        CI upper bound < 0  and  delta_mean <= -min_effect_pct
    slower        CI lower bound > 0  and  delta_mean >= +min_effect_pct
    within noise  otherwise

for lower-is-better metrics such as RTF (pass `lower_is_better=False` for throughput, where
`faster` then means a higher value).

    cmp = compare([rtf_base_r0, rtf_base_r1], [rtf_test_r0, rtf_test_r1],
                  min_effect_pct=2.0, resamples=2000, seed=0)
    cmp.delta_mean_pct, cmp.ci95_pct, cmp.verdict   # -4.8, (-6.1, -3.4), 'faster'

Vectorised: resamples are drawn as index matrices in blocks (no Python loop per resample).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tts_bench.errors import InvalidRunError

Verdict = Literal["faster", "slower", "within noise"]
VERDICTS: tuple[Verdict, ...] = ("faster", "slower", "within noise")
Method = Literal["hierarchical", "stratified"]
METHODS: tuple[Method, ...] = ("hierarchical", "stratified")

# Cap on resampled values held at once (floats); 4M = 32 MB, whatever the run size.
_BLOCK_VALUES = 4_000_000


@dataclass(frozen=True)
class Comparison:
    """Test arm relative to base arm, in percent (negative = test lower)."""

    delta_mean_pct: float
    delta_median_pct: float
    ci95_pct: tuple[float, float]  # percentile CI of delta_mean_pct
    ci95_median_pct: tuple[float, float]  # percentile CI of delta_median_pct
    verdict: Verdict
    base_mean: float
    base_median: float
    test_mean: float
    test_median: float
    n_base: int
    n_test: int
    resamples: int
    method: Method = "hierarchical"

    @property
    def significant(self) -> bool:
        lo, hi = self.ci95_pct
        return lo > 0 or hi < 0


def _strata(groups: Sequence[np.ndarray] | np.ndarray, arm: str) -> list[np.ndarray]:
    if isinstance(groups, np.ndarray) and groups.ndim == 1:
        groups = [groups]  # one repeat
    out = [np.asarray(g, dtype=np.float64).ravel() for g in groups]
    out = [g for g in out if g.size]
    if not out:
        raise InvalidRunError(
            f"error: the {arm} arm has no successful requests (A/B statistics); "
            f"check the run's failures before comparing"
        )
    if not all(np.isfinite(g).all() for g in out):
        raise InvalidRunError(
            f"error: the {arm} arm has non-finite values (A/B statistics); "
            f"exclude failed requests (empty audio gives an infinite RTF)"
        )
    return out


def _stratified_block(strata: list[np.ndarray], rows: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, N] values drawn with replacement within each repeat; N = total request count."""
    parts = [g[rng.integers(0, g.size, size=(rows, g.size))] for g in strata]
    return np.concatenate(parts, axis=1)


def _hierarchical_block(strata: list[np.ndarray], rows: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, K * max_n]: K repeats drawn with replacement, then requests within each drawn
    repeat. Repeats shorter than the longest are padded with NaN (callers use nan-reductions)."""
    sizes = np.array([g.size for g in strata])
    k, m = len(strata), int(sizes.max())
    data = np.full((k, m), np.nan)
    for i, g in enumerate(strata):
        data[i, : g.size] = g
    reps = rng.integers(0, k, size=(rows, k))  # [rows, K] which repeat fills each slot
    n = sizes[reps]  # [rows, K]
    idx = (rng.random((rows, k, m)) * n[..., None]).astype(np.int64)  # uniform in [0, n)
    vals = data[reps[..., None], idx]  # [rows, K, m]
    vals[np.arange(m) >= n[..., None]] = np.nan
    return vals.reshape(rows, k * m)


def _bootstrap_stats(
    strata: list[np.ndarray], resamples: int, rng: np.random.Generator, method: Method
) -> tuple[np.ndarray, np.ndarray]:
    """Means and medians of `resamples` bootstrap resamples: two [resamples] arrays."""
    hierarchical = method == "hierarchical" and len(strata) > 1
    width = len(strata) * max(g.size for g in strata) if hierarchical else sum(g.size for g in strata)
    padded = hierarchical and len({g.size for g in strata}) > 1
    mean, median = (np.nanmean, np.nanmedian) if padded else (np.mean, np.median)
    block = max(1, _BLOCK_VALUES // width)
    means, medians = [], []
    for start in range(0, resamples, block):
        rows = min(block, resamples - start)
        if hierarchical:
            sample = _hierarchical_block(strata, rows, rng)
        else:
            sample = _stratified_block(strata, rows, rng)
        means.append(mean(sample, axis=1))
        medians.append(median(sample, axis=1))
    return np.concatenate(means), np.concatenate(medians)


def _rel_pct(test: np.ndarray | float, base: np.ndarray | float) -> np.ndarray | float:
    return 100.0 * (np.asarray(test) / np.asarray(base) - 1.0)


def _verdict(
    delta_pct: float, ci: tuple[float, float], min_effect_pct: float, lower_is_better: bool
) -> Verdict:
    lo, hi = ci
    lower = hi < 0 and delta_pct <= -min_effect_pct
    higher = lo > 0 and delta_pct >= min_effect_pct
    if lower:
        return "faster" if lower_is_better else "slower"
    if higher:
        return "slower" if lower_is_better else "faster"
    return "within noise"


def compare(
    base: Sequence[np.ndarray] | np.ndarray,
    test: Sequence[np.ndarray] | np.ndarray,
    *,
    min_effect_pct: float = 2.0,
    resamples: int = 2000,
    seed: int = 0,
    lower_is_better: bool = True,
    method: Method = "hierarchical",
) -> Comparison:
    """Compare two arms given per-repeat arrays of per-request values (a 1-D array = 1 repeat).

    `method`: `hierarchical` resamples repeats, then requests within them (honest when whole
    repeats shift together); `stratified` keeps every repeat and resamples only requests.
    With a single repeat the two are the same.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if method not in METHODS:
        raise ValueError(f"unknown bootstrap method {method!r}; valid: {', '.join(METHODS)}")
    b, t = _strata(base, "base"), _strata(test, "test")
    b_all, t_all = np.concatenate(b), np.concatenate(t)
    b_mean, b_median = float(b_all.mean()), float(np.median(b_all))
    if b_mean == 0 or b_median == 0:
        raise InvalidRunError(
            "error: the base arm's mean or median is 0 (A/B statistics); a relative delta is "
            "undefined, check the metric"
        )
    t_mean, t_median = float(t_all.mean()), float(np.median(t_all))
    rng = np.random.default_rng(seed)
    bm, bmed = _bootstrap_stats(b, resamples, rng, method)
    tm, tmed = _bootstrap_stats(t, resamples, rng, method)
    with np.errstate(divide="ignore", invalid="ignore"):
        d_mean, d_median = _rel_pct(tm, bm), _rel_pct(tmed, bmed)
    ci = _percentile_ci(d_mean)
    ci_median = _percentile_ci(d_median)
    delta_mean = float(_rel_pct(t_mean, b_mean))
    return Comparison(
        delta_mean_pct=delta_mean,
        delta_median_pct=float(_rel_pct(t_median, b_median)),
        ci95_pct=ci,
        ci95_median_pct=ci_median,
        verdict=_verdict(delta_mean, ci, min_effect_pct, lower_is_better),
        base_mean=b_mean,
        base_median=b_median,
        test_mean=t_mean,
        test_median=t_median,
        n_base=int(b_all.size),
        n_test=int(t_all.size),
        resamples=resamples,
        method=method,
    )


def _percentile_ci(deltas: np.ndarray) -> tuple[float, float]:
    # A resampled base of all zeros gives inf/nan; drop those rather than poison the interval.
    finite = deltas[np.isfinite(deltas)]
    if finite.size == 0:
        return (float("nan"), float("nan"))
    lo, hi = np.percentile(finite, [2.5, 97.5])
    return (float(lo), float(hi))


def summarize(
    values: Sequence[float] | np.ndarray, name: str | None = None
) -> dict[str, float | int | None]:
    """count, mean, median, std (population, like vLLM), p90, p99 (linear interpolation).

    With `name`, keys follow vLLM's style: `mean_audio_rtf`, `p99_audio_rtf`, ... and
    `count` stays `count`. Empty input gives None for every statistic (JSON-safe).
    """
    arr = np.asarray(values, dtype=np.float64).ravel()
    stats: dict[str, float | None]
    if arr.size == 0:
        stats = dict.fromkeys(("mean", "median", "std", "p90", "p99"))
    else:
        p90, p99 = np.percentile(arr, [90, 99])
        stats = {
            "mean": float(arr.mean()),
            "median": float(np.median(arr)),
            "std": float(arr.std()),
            "p90": float(p90),
            "p99": float(p99),
        }
    out: dict[str, float | int | None] = {"count": int(arr.size)}
    out.update({(f"{k}_{name}" if name else k): v for k, v in stats.items()})
    return out
