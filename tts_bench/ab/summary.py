"""The A/B result: per tier, both arms' aggregates, the paired-block comparisons and the flags.

Computed from the run's recorded requests (`summarize_ab`), never from what is in memory, so a
resumed run and a finished one summarize alike. Per tier: both arms' aggregates
(`tts_bench.load.metrics`), a paired-block comparison of per-request `audio_rtf` (each repeat is a
block: `tts_bench.verdicts.stats.compare`, a t interval over the blocks, the MDE and the verdict; the same
for `audio_ttfp_ms`, and for each block's throughput, `tts_bench.ab.throughput`, higher is better;
the run's verdicts Holm-adjusted as one family), the mean RTF by position in the block
(`tts_bench.ab.position`), a duration-mismatch flag (RTF moves with output length), an
output-identity count (requests whose audio hash is equal across arms, paired by repeat and
prompt position), and the reasons the tier is invalid (too many failures): an invalid tier has
no speed verdict, for RTF, TTFP and throughput alike (`TierResult.to_dict`, `TierResult.ttfp_row`).

    result = summarize_ab(records, arms, tiers, run_dir=str(run.path))
    result.to_dict()["tiers"][0]["verdict"]          # faster | slower | within noise | invalid
    view, kept, measured = voice_cache_view(run, arms, tiers, "miss")
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tts_bench.ab.position import position_means
from tts_bench.ab.throughput import block_throughputs
from tts_bench.verdicts.calibration import Calibration
from tts_bench.config import BenchConfig, Tier
from tts_bench.errors import ConfigError, ExitStatus, InvalidRunError
from tts_bench.verdicts.holm import apply_holm
from tts_bench.load.metrics import Aggregates, aggregate
from tts_bench.rundir.records import RequestRecord, read_records
from tts_bench.rundir.results import RunDir
from tts_bench.verdicts.stats import ALPHA, Comparison, compare
from tts_bench.load.windows import window_throughputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierResult:
    tier: str
    arms: dict[str, Aggregates]
    rtf: Comparison | None
    ttfp: Comparison | None
    duration_delta_pct: float | None
    duration_mismatch: bool
    identical_outputs: int  # equal audio AND equal codes AND equal mel (where reported)
    paired_outputs: int
    invalid_reasons: tuple[str, ...] = ()
    identical_codes: int | None = None  # None when the backend reports no codec tokens
    identical_mel: int | None = None  # None when the backend reports no mel digests
    throughput: Comparison | None = None  # audio s per wall s per block; higher is faster
    block_throughputs: dict[str, dict[int, float]] = field(default_factory=dict)  # arm -> repeat -> value
    position: dict[str, Any] | None = None  # mean RTF by position in the block (tts_bench.ab.position)

    def to_dict(self) -> dict[str, Any]:
        """The tier as JSON (and as `tables.ab_table` reads it)."""
        rtf = self.rtf
        # A tier with too many failures has no verdict to trust, whatever its CI says.
        valid = rtf is not None and not self.invalid_reasons
        return {
            "tier": self.tier,
            "arms": {name: agg.to_dict() for name, agg in self.arms.items()},
            "delta_mean_pct": rtf.delta_mean_pct if rtf else None,
            "delta_median_pct": rtf.delta_median_pct if rtf else None,
            "ci95_pct": list(rtf.ci95_pct) if rtf and rtf.ci95_pct else None,
            "verdict": rtf.verdict if valid else "invalid",
            "verdict_detail": rtf.verdict_text if valid else "invalid",
            "mde_pct": rtf.mde_pct if rtf else None,
            "mde_rough": rtf.mde_rough if rtf else False,
            "blocks": rtf.blocks if rtf else 0,
            "interval": rtf.interval if rtf else "none",
            "block_sd_pct": rtf.block_sd_pct if rtf else None,
            "calibration": rtf.calibration if rtf else None,
            "ttfp": _comparison_dict(self.ttfp),
            "throughput": _comparison_dict(self.throughput),
            "block_throughputs": {a: {str(k): v for k, v in sorted(b.items())}
                                  for a, b in self.block_throughputs.items()},
            "position": self.position,
            "duration_delta_pct": self.duration_delta_pct,
            "duration_mismatch": self.duration_mismatch,
            "identical_outputs": self.identical_outputs,
            "identical_codes": self.identical_codes,
            "identical_mel": self.identical_mel,
            "paired_outputs": self.paired_outputs,
            "invalid_reasons": list(self.invalid_reasons),
        }

    def ttfp_row(self) -> dict[str, Any]:
        """The tier as `tables.ab_table` reads it for the TTFP table: `to_dict()` with the TTFP
        comparison's delta, interval, verdict and MDE in RTF's place, no duration flag (TTFP
        does not move with output length), and, as for RTF, no speed verdict on a tier with
        too many failures."""
        return self._metric_row("ttfp")

    def throughput_row(self) -> dict[str, Any]:
        """The tier for the throughput table: as `ttfp_row`, with each arm's mean / median
        of its per-block throughputs (audio s per wall s) as `mean_/median_audio_throughput`."""
        row = self._metric_row("throughput")
        row["arms"] = {a: {**row["arms"].get(a, {}), "mean_audio_throughput": _mean(list(v.values())),
                           "median_audio_throughput": _median(list(v.values()))}
                       for a, v in ((a, self.block_throughputs.get(a, {})) for a in self.arms)}
        return row

    def _metric_row(self, key: str) -> dict[str, Any]:
        row = self.to_dict()
        cmp = row[key] or {}
        row.update({k: cmp.get(k) for k in ("delta_mean_pct", "ci95_pct", "verdict")},
                   duration_mismatch=False, note="")
        row.update(verdict_detail=cmp.get("verdict_detail"), mde_pct=cmp.get("mde_pct"),
                   mde_rough=bool(cmp.get("mde_rough")))
        if self.invalid_reasons:
            row["verdict"] = row["verdict_detail"] = "invalid"
        return row


@dataclass(frozen=True)
class AbResult:
    tiers: list[TierResult]
    run_dir: str
    arm_names: tuple[str, str]
    invalid_reasons: tuple[str, ...] = field(default=())
    repeats: int = 1  # measured repeats found in the record (the fewest of any tier and arm)
    calibration: Calibration | None = None  # the matching calibration, if any (1-block intervals, MDE)
    until_resolved: dict[str, Any] | None = None  # rule, stop reason, repeats per tier
    multiple_comparisons: dict[str, Any] | None = None  # Holm: method, family size, alpha

    @property
    def single_repeat(self) -> bool:
        """One repeat: no run-to-run spread of its own to build an interval from."""
        return self.repeats < 2

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.OK if self.valid else ExitStatus.INVALID_RUN

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "arms": list(self.arm_names),
            "valid": self.valid,
            "invalid_reasons": list(self.invalid_reasons),
            "repeats": self.repeats,
            "calibration": self.calibration.describe() if self.calibration else None,
            "until_resolved": self.until_resolved,
            "multiple_comparisons": self.multiple_comparisons,
            "tiers": [t.to_dict() for t in self.tiers],
        }

    def ttfp_rows(self) -> list[dict[str, Any]]:
        """Every tier's `TierResult.ttfp_row()`: what the TTFP table shows."""
        return [t.ttfp_row() for t in self.tiers]

    def throughput_rows(self) -> list[dict[str, Any]]:
        """Every tier's `TierResult.throughput_row()`: what the throughput table shows."""
        return [t.throughput_row() for t in self.tiers]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _comparison_dict(cmp: Comparison | None) -> dict[str, Any] | None:
    if cmp is None:
        return None
    d = asdict(cmp)
    for key in ("ci95_pct", "ci95_median_pct", "block_deltas_pct"):
        d[key] = None if d[key] is None else list(d[key])
    d["verdict_detail"] = cmp.verdict_text
    return d



def _pair_key(rec: RequestRecord) -> tuple[int, str]:
    # The id without its arm prefix: the same prompt position in the other arm.
    return rec.repeat, rec.request_id[len(rec.arm) + 1 :]


def summarize_ab(
    records: Sequence[RequestRecord], arms: dict[str, BenchConfig], tiers: Sequence[Tier], *, run_dir: str,
    calibration: Calibration | None = None, blocks: Any = None,
) -> AbResult:
    """Per-tier aggregates, comparisons, flags and validity from recorded requests; `blocks`:
    read the window throughputs of these (tier, repeat) blocks only (`tts-bench ab --report`)."""
    by_tier_arm: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for r in records:
        if not r.warmup:
            by_tier_arm[(r.tier, r.arm)].append(r)
    names = tuple(arms)
    bench = arms[names[0]].bench
    thr = block_throughputs(records, windows=window_throughputs(run_dir, blocks=blocks))
    results = [
        _tier_result(tier.label, {a: by_tier_arm[(tier.label, a)] for a in names}, bench, calibration,
                     thr.get(tier.label, {}))
        for tier in tiers
    ]
    positions = position_means(records, names)
    results = [replace(t, position=positions.get(t.tier)) for t in results]
    results, family = _holm(results)
    reasons = tuple(reason for t in results for reason in t.invalid_reasons)
    repeats = min((len({r.repeat for r in rs}) for rs in by_tier_arm.values()), default=0)
    return AbResult(results, run_dir, names, reasons, repeats, calibration, multiple_comparisons=family)


_VERDICT_METRICS = ("rtf", "ttfp", "throughput")


def _holm(results: list[TierResult]) -> tuple[list[TierResult], dict[str, Any]]:
    """Holm over every verdict of the valid tiers (`tts_bench.verdicts.holm`); the family as JSON."""
    cmps = {(i, m): getattr(t, m) for i, t in enumerate(results) if not t.invalid_reasons
            for m in _VERDICT_METRICS}
    adjusted = apply_holm(cmps)
    size = sum(c is not None and c.p_value is not None for c in cmps.values())
    out = [replace(t, **{m: adjusted[(i, m)] for m in _VERDICT_METRICS}) if not t.invalid_reasons else t
           for i, t in enumerate(results)]
    return out, {"method": "holm", "family_size": size, "alpha": ALPHA,
                 "metrics": ["audio_rtf", "audio_ttfp_ms", "audio_throughput"]}


VOICE_CACHE = ("hit", "miss")


def check_voice_cache(which: str | None) -> None:
    """`--voice-cache`: None (every request), `hit` or `miss`; anything else is a ConfigError."""
    if which is not None and which not in VOICE_CACHE:
        raise ConfigError(f"error: unknown voice cache filter {which!r} (--voice-cache); valid: hit, miss")


def voice_cache_view(
    run_dir: RunDir, arms: dict[str, BenchConfig], tiers: Sequence[Tier], which: str, *,
    calibration: Calibration | None = None,
) -> tuple[AbResult, int, int]:
    """The A/B over the measured requests whose voice was a prompt-cache `which` (hit: its
    prompt setup reused; miss: built for it), with how many of all measured requests that is.
    A request the backend did not report on (failed, or a backend without voices) is left out."""
    if which is None:  # check_voice_cache lets None (no filter) through; a view needs one
        raise ConfigError("error: unknown voice cache filter None (--voice-cache); valid: hit, miss")
    check_voice_cache(which)
    records = read_records(run_dir)
    measured = [r for r in records if not r.warmup]
    kept = [r for r in measured if r.prompt_cache_hit is (which == "hit")]
    view = summarize_ab(kept, arms, tiers, run_dir=str(run_dir.path), calibration=calibration)
    return view, len(kept), len(measured)


def _by_repeat(records: Sequence[RequestRecord], metric: str) -> dict[int, list[float]]:
    groups: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r.ok:
            groups[r.repeat].append(getattr(r, metric))
    return groups


def _compare(base, test, metric: str, bench, spread=None) -> Comparison | None:
    """Blocks paired by repeat index (a repeat one arm lacks is left out by `compare`)."""
    b, t = _by_repeat(base, metric), _by_repeat(test, metric)
    keys = sorted(set(b) | set(t))
    try:
        return compare([b.get(k, []) for k in keys], [t.get(k, []) for k in keys],
                       min_effect_pct=bench.min_effect_pct, calibrated=spread)
    except InvalidRunError as exc:  # no successful requests in an arm: reported, not raised
        log.warning("%s", exc)
        return None


def _compare_throughput(thr: dict[str, dict[int, float]], names: Sequence[str], bench,
                        spread=None) -> Comparison | None:
    """Per-block throughputs paired by repeat (one value per block and arm); higher is better."""
    b, t = thr.get(names[0], {}), thr.get(names[1], {})
    keys = sorted(set(b) & set(t))
    if not keys:
        return None
    return compare([[b[k]] for k in keys], [[t[k]] for k in keys], min_effect_pct=bench.min_effect_pct,
                   lower_is_better=False, calibrated=spread)


def _spread(calibration: Calibration | None, tier: str, metric: str):
    return None if calibration is None else calibration.spread(tier, metric)


@dataclass(frozen=True)
class _Identity:
    outputs: int  # pairs with equal audio, equal codes and equal mel
    codes: int | None  # pairs with equal codes (None: the backend reports no codes)
    paired: int
    mel: int | None = None  # pairs with equal mel (None: the backend reports no mel)


def _identity(base: Sequence[RequestRecord], test: Sequence[RequestRecord]) -> _Identity:
    """Successful request pairs (same prompt, repeat) with equal audio and/or codes hashes.

    Each stage is counted apart (codes: the talker; mel: code2wav's flow; audio: the whole), so
    a change shows where it moved the output: a bit-exact change must keep the codes identical,
    while mel and audio can also differ by batch-composition-dependent GEMM rounding in code2wav
    when the two arms' requests happened to share batches differently. The talker's rows are
    batched too, so an arm that changes timing can move a near-tie sample's code (docs/ab.md).
    """
    other = {_pair_key(r): r for r in test if r.ok}
    pairs = [(r, other[_pair_key(r)]) for r in base if r.ok and _pair_key(r) in other]
    same = sum(a.audio_sha256 == b.audio_sha256 and a.codes_sha256 == b.codes_sha256
               and a.mel_sha256 == b.mel_sha256 for a, b in pairs)

    def count(field: str) -> int | None:
        if not any(getattr(a, field) for a, _ in pairs):
            return None
        return sum(getattr(a, field) == getattr(b, field) for a, b in pairs)

    return _Identity(same, count("codes_sha256"), len(pairs), count("mel_sha256"))


def _tier_result(tier: str, per_arm: dict[str, list[RequestRecord]], bench,
                 calibration: Calibration | None = None,
                 throughputs: dict[str, dict[int, float]] | None = None) -> TierResult:
    (base_name, base), (test_name, test) = per_arm.items()
    aggs = {name: aggregate(recs) for name, recs in per_arm.items()}
    reasons = []
    for name, agg in aggs.items():
        if agg.completed + agg.failed == 0:
            reasons.append(f"{tier} {name}: no measured requests")
        elif agg.failure_fraction > bench.max_failure_fraction:
            reasons.append(
                f"{tier} {name}: {agg.failed} of {agg.completed + agg.failed} requests failed "
                f"({agg.failed_by_kind}), above bench.max_failure_fraction={bench.max_failure_fraction:g}"
            )
    b_sec, t_sec = aggs[base_name].mean_audio_seconds, aggs[test_name].mean_audio_seconds
    dur = 100.0 * (t_sec / b_sec - 1.0) if b_sec and t_sec is not None else None
    ident = _identity(base, test)
    return TierResult(
        tier=tier, arms=aggs,
        rtf=_compare(base, test, "audio_rtf", bench, _spread(calibration, tier, "audio_rtf")),
        ttfp=_compare(base, test, "audio_ttfp_ms", bench, _spread(calibration, tier, "audio_ttfp_ms")),
        duration_delta_pct=dur,
        duration_mismatch=dur is not None and abs(dur) > bench.duration_mismatch_pct,
        identical_outputs=ident.outputs, paired_outputs=ident.paired,
        identical_codes=ident.codes, identical_mel=ident.mel, invalid_reasons=tuple(reasons),
        throughput=_compare_throughput(throughputs or {}, list(per_arm), bench,
                                       _spread(calibration, tier, "audio_throughput")),
        block_throughputs=dict(throughputs or {}),
    )
