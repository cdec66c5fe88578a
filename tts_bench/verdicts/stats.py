"""A/B statistics: paired blocks, an interval that is honest at 2-5 blocks, the minimum
detectable effect (MDE), and a verdict.

A repeat is a *block*: both arms ran back to back on the same machine, in counterbalanced order
(`tts_bench.ab.phase_order`: A B, then B A). Whole runs shift together on real machines (a warm
cache, a neighbour's load), and requests of one run share that shift, so the unit of evidence is
the block, not the request. Per block k

    d_k = ln(mean_test_k / mean_base_k)          (the same with medians for the median delta)

and the effect is their mean, reported as a percentage, `100 * (exp(mean d) - 1)`. Request noise
enters through each block's mean; run-to-run noise through the spread of the d_k. Why the log
ratio rather than `100 * (test / base - 1)` per block: swapping the arms flips its sign exactly,
a machine-wide slowdown (which scales every latency) is additive on the log scale, so block
differences are closer to normal, and the back-transformed interval can never reach -100%. For
effects of a few percent the two agree to a tenth of a percent.

The 95% interval is Student's t with K - 1 degrees of freedom over the K block differences,
`mean d +- t(0.975, K-1) * s / sqrt(K)`: exact for normal block differences whatever the mix of
run and request noise, which a percentile bootstrap is not at K = 2-5 (with two repeats a
repeat-level bootstrap has three distinct resamples and halves the between-repeat variance).
`scripts/stats_coverage.py` simulates A/A and known-effect runs with run-level shifts, request
noise and load bursts and checks the coverage (results/stats/coverage.md).

One block has no spread to estimate: the verdict is `unresolved (1 repeat)` unless a calibrated
run-to-run SD of d for this case, tier and hardware profile exists (`tts-bench calibrate`), in
which case the interval uses it, with the calibration's degrees of freedom; `tts_bench.verdicts.calibration`
hands one over only under the conditions it was made in (load, machine) and where its own
one-block A/As read faster/slower at most 5 % of the time.

The MDE is the smallest |effect| this run would resolve with 80% power at two-sided alpha 0.05:

    MDE = (t(0.975, df) + t(0.80, df)) * s / sqrt(K)     (s, df: the blocks', or the calibration's)

An MDE from 2 blocks rests on one degree of freedom: its SD is itself noise (an A/A audit saw
0.2 % to 350 % on one machine), so `mde_rough` flags an MDE from fewer than `MDE_MIN_BLOCKS`
blocks (the tables print it as `~0.5%`) rather than pooling it with a calibration's SD: the
pooled figure would describe the calibration's machine state, not this run's.

The verdict needs both significance and size (pyperf/asv practice):

    faster        CI upper bound < 0  and  delta <= -min_effect_pct
    slower        CI lower bound > 0  and  delta >= +min_effect_pct
    within noise  otherwise; the text adds what the run could not see ("could not resolve < 7.9%")
    unresolved (1 repeat)   one block and no calibration
    unresolved (metric resolution)   the values fall on a few steps (`tts_bench.verdicts.resolution`)

for lower-is-better metrics such as RTF (`lower_is_better=False` for throughput).

    cmp = compare([rtf_base_r0, rtf_base_r1, rtf_base_r2], [rtf_test_r0, rtf_test_r1, rtf_test_r2],
                  min_effect_pct=2.0)
    cmp.delta_mean_pct, cmp.ci95_pct, cmp.mde_pct, cmp.verdict_text
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tts_bench.errors import InvalidRunError
from tts_bench.verdicts.resolution import Resolution, metric_resolution

Verdict = Literal["faster", "slower", "within noise", "unresolved (1 repeat)", "unresolved (metric resolution)"]
UNRESOLVED: Verdict = "unresolved (1 repeat)"
COARSE: Verdict = "unresolved (metric resolution)"  # tts_bench.verdicts.resolution
Interval = Literal["t", "calibrated", "none"]

ALPHA = 0.05
POWER = 0.80
MDE_MIN_BLOCKS = 3  # fewer blocks: the MDE is flagged rough (its own SD has < 2 df)


# ---------------------------------------------------------------- small building blocks


def _scipy_stats():
    # Imported on first use: scipy.stats takes most of a second to import, and importing this
    # module (every command does, through tts_bench.ab) should not cost that.
    from scipy import stats

    return stats


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile; df = inf gives the normal quantile."""
    sps = _scipy_stats()
    return float(sps.norm.ppf(q) if math.isinf(df) else sps.t.ppf(q, df))


def two_sided_p(t_stat: float, df: float) -> float:
    """Two-sided p-value of a t statistic (normal when df = inf)."""
    sps = _scipy_stats()
    dist = sps.norm if math.isinf(df) else sps.t(df)
    return float(2.0 * dist.sf(abs(t_stat)))


def mann_whitney_p(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value of `x` against `y` (scipy.stats.mannwhitneyu).

    The gate's per-request test: are the current run's samples from a shifted distribution,
    without assuming normality (RTF and TTFP are skewed, with long right tails)? The method is
    pinned to the normal approximation with tie and continuity corrections, the form the gate's
    baselines and thresholds were set with: scipy's default (`auto`) switches to the exact
    distribution below 8 samples without ties and would move those p-values (0.111 instead of
    0.1113 on scipy's own example). With so few samples the test has little power anyway; the
    gate then marks a large change `~` rather than `worse`, which is the honest answer.
    """
    xa = np.asarray(x, dtype=np.float64).ravel()
    ya = np.asarray(y, dtype=np.float64).ravel()
    if xa.size == 0 or ya.size == 0:
        raise ValueError(f"mann_whitney_p needs samples on both sides, got {xa.size} and {ya.size}")
    if not (np.isfinite(xa).all() and np.isfinite(ya).all()):
        raise ValueError("mann_whitney_p got non-finite values; drop failed requests first")
    res = _scipy_stats().mannwhitneyu(xa, ya, alternative="two-sided", method="asymptotic",
                                      use_continuity=True)
    return float(res.pvalue)


def mde_log(sd: float, blocks: int, df: float, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable |mean d| (log units): (t(1-alpha/2, df) + t(power, df)) * sd / sqrt(K)."""
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * sd / math.sqrt(blocks)


def pct(log_ratio: float) -> float:
    """A log ratio as a percent change: 100 * (exp(x) - 1)."""
    return 100.0 * math.expm1(log_ratio)


def repeats_needed(
    effect_pct: float, sd_log: float, *, alpha: float = ALPHA, power: float = POWER, max_repeats: int = 1000
) -> int | None:
    """Smallest even K >= 2 whose MDE (t with K-1 df, block SD `sd_log`) is <= `effect_pct`.

    Even, because blocks come in counterbalanced pairs (A B, B A). None past `max_repeats`."""
    return samples_needed(sd_log, math.log1p(abs(effect_pct) / 100.0), alpha=alpha, power=power,
                          limit=max_repeats, step=2)


def samples_needed(sd: float, target: float, *, alpha: float = ALPHA, power: float = POWER, limit: int = 1000,
                   step: int = 2) -> int | None:
    """Smallest n in 2, 2 + step, ... <= `limit` whose MDE (t with n-1 df, SD `sd`) is <= `target`
    (`sd` and `target` in one unit: log ratio, WER points); None when even `limit` is not enough.

    The MDE falls as n grows, so the search doubles, then bisects: a tiny target needs tens of
    thousands of samples, and each MDE costs two scipy quantiles."""
    def ok(i: int) -> bool:  # i indexes the candidates: n = 2 + step * i
        n = 2 + step * i
        return mde_log(sd, n, n - 1, alpha=alpha, power=power) <= target

    last = (limit - 2) // step
    if last < 0:
        return None
    lo, hi = 0, 0
    while not ok(hi):
        if hi == last:
            return None
        lo, hi = hi + 1, min(2 * hi + 1, last)
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return 2 + step * hi


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) binomial interval of a rate, e.g. a false-verdict count."""
    if trials < 1:
        raise ValueError(f"clopper_pearson needs trials >= 1, got {trials}")
    ci = _scipy_stats().binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True)
class CalibratedSpread:
    """The run-to-run SD of one block's d for a case, tier and hardware profile (`tts-bench
    calibrate`), used when a run has a single block. `df` = A/A blocks it was estimated from."""

    sd_mean: float  # SD of ln(mean_test / mean_base) over A/A blocks
    sd_median: float  # the same for medians
    df: int
    source: str = ""  # the calibration file, for the output's note


@dataclass(frozen=True)
class BlockInterval:
    """Mean of the block log ratios and its 95% interval (log units); sd/df None when unresolved."""

    center: float
    lo: float | None
    hi: float | None
    sd: float | None
    df: float | None
    blocks: int
    interval: Interval

    @property
    def resolved(self) -> bool:
        return self.lo is not None


def block_interval(d: np.ndarray, *, calibrated_sd: float | None = None, calibrated_df: float | None = None,
                   alpha: float = ALPHA) -> BlockInterval:
    """t interval of mean(d) over K blocks; with K = 1, the calibrated SD if there is one."""
    # d: [K] log ratios, one per block
    k = int(d.size)
    center = float(d.mean())
    if k >= 2:
        sd, df, kind = float(d.std(ddof=1)), float(k - 1), "t"
    elif calibrated_sd is not None:
        sd, df, kind = float(calibrated_sd), float(calibrated_df or math.inf), "calibrated"
    else:
        return BlockInterval(center, None, None, None, None, k, "none")
    half = t_quantile(1 - alpha / 2, df) * sd / math.sqrt(k)
    return BlockInterval(center, center - half, center + half, sd, df, k, kind)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Comparison:
    """Test arm relative to base arm, in percent (negative = test lower), from paired blocks."""

    delta_mean_pct: float  # 100 * (exp(mean_k ln(mean_test_k / mean_base_k)) - 1)
    delta_median_pct: float  # the same with block medians
    ci95_pct: tuple[float, float] | None  # None: one block, no calibration
    ci95_median_pct: tuple[float, float] | None
    verdict: Verdict
    mde_pct: float | None  # smallest |delta| resolvable at 80% power, two-sided alpha 0.05
    blocks: int
    block_sd_pct: float | None  # SD of the block log ratios, as a percent (the blocks' or calibrated)
    df: float | None
    interval: Interval  # t (K-1 df) | calibrated (1 block) | none
    min_effect_pct: float
    base_mean: float
    base_median: float
    test_mean: float
    test_median: float
    n_base: int
    n_test: int
    block_deltas_pct: tuple[float, ...] = ()
    calibration: str | None = None  # the calibration file used (interval == "calibrated")
    mde_rough: bool = False  # MDE from < MDE_MIN_BLOCKS blocks' own spread: itself noise
    p_value: float | None = None  # two-sided t test of mean d = 0 (the interval's own test)
    # Set by `tts_bench.verdicts.holm.apply_holm` over a run's verdicts (None: not adjusted).
    holm_p: float | None = None
    family_size: int | None = None
    holm_demoted: bool = False  # significant alone, not after Holm: verdict within noise
    resolution: Resolution | None = None  # of the per-request values (tts_bench.verdicts.resolution)

    @property
    def significant(self) -> bool:
        if self.ci95_pct is None:
            return False
        lo, hi = self.ci95_pct
        return lo > 0 or hi < 0

    @property
    def half_width_pct(self) -> float | None:
        """Half the width of the 95% interval, in percent (None when unresolved)."""
        if self.ci95_pct is None:
            return None
        lo, hi = self.ci95_pct
        return (hi - lo) / 2.0

    @property
    def verdict_text(self) -> str:
        """The verdict as a table cell: `within noise` says what the run could not see."""
        if self.holm_demoted:
            return (f"within noise; not significant after Holm over {self.family_size} verdicts "
                    f"(p {self.p_value:.3f}, adjusted {self.holm_p:.3f})")
        if self.verdict != "within noise" or self.mde_pct is None:
            return self.verdict
        if self.mde_pct < self.min_effect_pct and not self.mde_rough:
            return f"within noise; below the {self.min_effect_pct:g}% minimum effect"
        if self.mde_rough:
            return f"within noise; could not resolve < ~{self.mde_pct:.1f}% (MDE from {self.blocks} blocks)"
        return f"within noise; could not resolve < {self.mde_pct:.1f}%"


def _blocks(groups: Sequence[np.ndarray] | np.ndarray, arm: str) -> list[np.ndarray]:
    if isinstance(groups, np.ndarray) and groups.ndim == 1:
        groups = [groups]  # one block
    out = [np.asarray(g, dtype=np.float64).ravel() for g in groups]
    if not any(g.size for g in out):
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


def _paired(base: list[np.ndarray], test: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Blocks where both arms have values (a block with one arm's phase all failed is dropped)."""
    if len(base) != len(test):
        raise ValueError(f"blocks must be paired: base has {len(base)}, test has {len(test)}")
    pairs = [(b, t) for b, t in zip(base, test) if b.size and t.size]
    if not pairs:
        raise InvalidRunError(
            "error: no block has successful requests in both arms (A/B statistics); "
            "check the run's failures before comparing"
        )
    return pairs


def _log_ratios(pairs: list[tuple[np.ndarray, np.ndarray]], stat) -> np.ndarray:
    b = np.array([stat(x) for x, _ in pairs])
    t = np.array([stat(y) for _, y in pairs])
    if (b <= 0).any() or (t <= 0).any():
        raise InvalidRunError(
            "error: a block's mean or median is <= 0 (A/B statistics); a relative delta is "
            "undefined, check the metric"
        )
    return np.log(t / b)


def _ci_pct(iv: BlockInterval) -> tuple[float, float] | None:
    return None if iv.lo is None or iv.hi is None else (pct(iv.lo), pct(iv.hi))


def _verdict(delta_pct: float, ci: tuple[float, float] | None, min_effect_pct: float,
             lower_is_better: bool) -> Verdict:
    if ci is None:
        return UNRESOLVED
    lo, hi = ci
    if hi < 0 and delta_pct <= -min_effect_pct:
        return "faster" if lower_is_better else "slower"
    if lo > 0 and delta_pct >= min_effect_pct:
        return "slower" if lower_is_better else "faster"
    return "within noise"


def compare(
    base: Sequence[np.ndarray] | np.ndarray,
    test: Sequence[np.ndarray] | np.ndarray,
    *,
    min_effect_pct: float = 2.0,
    lower_is_better: bool = True,
    calibrated: CalibratedSpread | None = None,
    alpha: float = ALPHA,
    power: float = POWER,
    check_resolution: bool = True,
) -> Comparison:
    """Compare two arms given per-block arrays of per-request values, paired by position
    (block k of `base` ran back to back with block k of `test`; a 1-D array is one block).

    `calibrated` is used only with a single block (see the module docstring); with
    `check_resolution` a metric too coarse to resolve the minimum effect is `unresolved
    (metric resolution)` (`tts_bench.verdicts.resolution`)."""
    pairs = _paired(_blocks(base, "base"), _blocks(test, "test"))
    d_mean, d_median = _log_ratios(pairs, np.mean), _log_ratios(pairs, np.median)
    cal_mean = calibrated.sd_mean if calibrated else None
    cal_median = calibrated.sd_median if calibrated else None
    df_cal = calibrated.df if calibrated else None
    iv = block_interval(d_mean, calibrated_sd=cal_mean, calibrated_df=df_cal, alpha=alpha)
    iv_med = block_interval(d_median, calibrated_sd=cal_median, calibrated_df=df_cal, alpha=alpha)
    ci = _ci_pct(iv)
    delta = pct(iv.center)
    mde = pct(mde_log(iv.sd, iv.blocks, iv.df, alpha=alpha, power=power)) if iv.sd is not None else None
    b_all = np.concatenate([b for b, _ in pairs])
    t_all = np.concatenate([t for _, t in pairs])
    res = metric_resolution([x for p in pairs for x in p], min_effect_pct=min_effect_pct) if check_resolution else None
    verdict = _verdict(delta, ci, min_effect_pct, lower_is_better)
    if res is not None and res.coarse and ci is not None:
        verdict = COARSE
    return Comparison(
        delta_mean_pct=delta,
        delta_median_pct=pct(iv_med.center),
        ci95_pct=ci,
        ci95_median_pct=_ci_pct(iv_med),
        verdict=verdict,
        mde_pct=mde,
        blocks=iv.blocks,
        block_sd_pct=pct(iv.sd) if iv.sd is not None else None,
        df=iv.df,
        interval=iv.interval,
        min_effect_pct=min_effect_pct,
        base_mean=float(b_all.mean()),
        base_median=float(np.median(b_all)),
        test_mean=float(t_all.mean()),
        test_median=float(np.median(t_all)),
        n_base=int(b_all.size),
        n_test=int(t_all.size),
        block_deltas_pct=tuple(pct(x) for x in d_mean),
        calibration=calibrated.source if calibrated and iv.interval == "calibrated" else None,
        mde_rough=iv.interval == "t" and iv.blocks < MDE_MIN_BLOCKS,
        p_value=_p_value(iv),
        resolution=res,
    )


def _p_value(iv: BlockInterval) -> float | None:
    """Two-sided p of the t test behind the interval (p < alpha exactly when it excludes 0)."""
    if iv.sd is None or iv.df is None:
        return None
    if iv.sd == 0:
        return 1.0 if iv.center == 0 else 0.0
    return two_sided_p(iv.center / (iv.sd / math.sqrt(iv.blocks)), iv.df)


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
