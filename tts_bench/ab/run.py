"""Same-day A/B of audio RTF: arms interleaved per tier on fresh backends, with statistics.

For each tier `CxR`, for each of K repeats, each arm gets a fresh backend, in counterbalanced
order (`phase_order`: A B, then B A, then A B ...: with an even K each arm runs first as often as
second, so a drift within the session, e.g. the first phase on a cold machine running slower,
cannot pose as an effect of either arm): `start(R)`, `max(2, C)` warmup requests (recorded, flagged, excluded from stats),
the measured requests with exactly C in flight, `stop()`. Both arms send the same prompts in the
same order with the same per-request seeds. Per tier the result holds both arms' aggregates
(`tts_bench.metrics`), a paired-block comparison of per-request `audio_rtf` (each repeat is a
block: `tts_bench.stats.compare`, a t interval over the blocks, the MDE and the verdict; the same
for `audio_ttfp_ms`), a duration-mismatch flag (RTF moves with output length), and an
output-identity count (requests whose audio hash is equal across arms, paired by repeat and
prompt position). A one-repeat run has no interval of its own: its verdict is `unresolved`
unless a calibration of this case and hardware profile is given (`tts_bench.calibration`).
With `until=UntilResolved(...)` blocks are added in counterbalanced pairs until every tier's
interval is narrow enough (`tts_bench.until_resolved`).

Every finished request is appended to the run's JSONL at once; the result is computed from
the JSONL, so `resume=True` finishes a killed run without repeating completed requests (a phase
with measured work left gets a fresh backend and its warmup again; warmup records already on
disk are not written twice).

Hooks: pass `hooks` with `on_phase(arm, tier, repeat, phase, backend)`; it is called with phase
"warmup" after `start`, "measure" before the measured requests, and "end" after them (before
`stop`). The memory sampler (`tts-bench ab --mem`) plugs in here.

    result = run_ab({"base": cfg_a, "test": cfg_b}, parse_tiers("2x1,4x2"),
                    repeats=2, num_prompts=8, run_dir=RunDir.create(...))
    result.to_dict()["tiers"][0]["verdict"]
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from tts_bench.calibration import Calibration
from tts_bench.config import BenchConfig, Tier, load_dataclass, parse_tiers
from tts_bench.errors import BackendError, ConfigError, ExitStatus, InvalidRunError
from tts_bench.metrics import Aggregates, aggregate
from tts_bench.phases import PhaseHooks, run_fresh_phase
from tts_bench.prompts import plan_jobs, select_bench_prompts
from tts_bench.records import Job, PhaseLabels, RequestRecord
from tts_bench.results import RunDir, request_key
from tts_bench.stats import Comparison, compare
from tts_bench.until_resolved import UntilResolved, drive

log = logging.getLogger(__name__)

class AbProgress(Protocol):
    """What the CLI's progress bar implements: one task per (tier, arm, repeat)."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self) -> None: ...


@dataclass(frozen=True)
class TierResult:
    tier: str
    arms: dict[str, Aggregates]
    rtf: Comparison | None
    ttfp: Comparison | None
    duration_delta_pct: float | None
    duration_mismatch: bool
    identical_outputs: int  # equal audio AND equal codes
    paired_outputs: int
    invalid_reasons: tuple[str, ...] = ()
    identical_codes: int | None = None  # None when the backend reports no codec tokens

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
            "blocks": rtf.blocks if rtf else 0,
            "interval": rtf.interval if rtf else "none",
            "block_sd_pct": rtf.block_sd_pct if rtf else None,
            "calibration": rtf.calibration if rtf else None,
            "ttfp": _comparison_dict(self.ttfp),
            "duration_delta_pct": self.duration_delta_pct,
            "duration_mismatch": self.duration_mismatch,
            "identical_outputs": self.identical_outputs,
            "identical_codes": self.identical_codes,
            "paired_outputs": self.paired_outputs,
            "invalid_reasons": list(self.invalid_reasons),
        }


@dataclass(frozen=True)
class AbResult:
    tiers: list[TierResult]
    run_dir: str
    arm_names: tuple[str, str]
    invalid_reasons: tuple[str, ...] = field(default=())
    repeats: int = 1  # measured repeats found in the record (the fewest of any tier and arm)
    calibration: Calibration | None = None  # the matching calibration, if any (1-block intervals, MDE)
    until_resolved: dict[str, Any] | None = None  # rule, stop reason, repeats per tier

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
            "tiers": [t.to_dict() for t in self.tiers],
        }


def _comparison_dict(cmp: Comparison | None) -> dict[str, Any] | None:
    if cmp is None:
        return None
    d = asdict(cmp)
    for key in ("ci95_pct", "ci95_median_pct", "block_deltas_pct"):
        d[key] = None if d[key] is None else list(d[key])
    d["verdict_detail"] = cmp.verdict_text
    return d


# ---------------------------------------------------------------- arms and plans

@dataclass(frozen=True)
class AbPlan:
    """What to run: the arms (ordered base, test) and the bench shape."""

    arms: dict[str, BenchConfig]
    tiers: tuple[Tier, ...]
    repeats: int
    num_prompts: int
    until: UntilResolved | None = None  # --until-resolved settings (recorded for --resume)
    profile: str | None = None  # hardware profile the calibration was looked up for
    calibration: str | None = None  # the calibration file used (one-block intervals, MDE note)

    def to_dict(self) -> dict[str, Any]:
        return {"arms": list(self.arms), "tiers": [t.label for t in self.tiers],
                "repeats": self.repeats, "num_prompts": self.num_prompts,
                "until_resolved": self.until.to_dict() if self.until else None,
                "profile": self.profile, "calibration": self.calibration}


def plan_from_run(run_dir: RunDir) -> AbPlan:
    """Rebuild the plan of a recorded A/B (for --resume) from its run.json."""
    doc = run_dir.doc
    if doc.get("kind") != "ab" or "ab" not in doc:
        raise ConfigError(
            f"error: {run_dir.path} is not an A/B run (--resume); pass a directory made by tts-bench ab"
        )
    arms = {name: load_dataclass(BenchConfig, d, source=f"{run_dir.run_json}: configs.{name}")
            for name, d in doc["configs"].items()}
    plan = doc["ab"]
    until = UntilResolved.from_dict(plan["until_resolved"]) if plan.get("until_resolved") else None
    return AbPlan(arms, parse_tiers(plan["tiers"]), int(plan["repeats"]), int(plan["num_prompts"]),
                  until=until, profile=plan.get("profile"), calibration=plan.get("calibration"))


# ---------------------------------------------------------------- planning the requests


def _pair_key(rec: RequestRecord) -> tuple[int, str]:
    # The id without its arm prefix: the same prompt position in the other arm.
    return rec.repeat, rec.request_id[len(rec.arm) + 1 :]


# ---------------------------------------------------------------- running


@dataclass
class _Runner:
    arms: dict[str, BenchConfig]
    num_prompts: int
    run_dir: RunDir
    done: set
    progress: AbProgress | None
    hooks: PhaseHooks | None
    _prompt_cache: dict[int, list[Any]] = field(default_factory=dict)

    def prompts_for(self, tier: Tier) -> list[Any]:
        """The tier's prompts (same for both arms): K*C with bench.prompts_per_client."""
        base = next(iter(self.arms.values()))
        n = base.bench.prompts_for(tier.concurrency, self.num_prompts)
        if n not in self._prompt_cache:
            self._prompt_cache[n] = select_bench_prompts(base, n)
        return self._prompt_cache[n]

    def sink(self, rec: RequestRecord) -> None:
        d = rec.to_dict()
        key = request_key(d)
        if key not in self.done:  # warmups of a resumed phase are already on disk
            self.run_dir.append_request(d)
            self.done.add(key)

    def advance(self, rec: RequestRecord) -> None:
        if self.progress is not None and not rec.warmup:
            self.progress.advance()

    async def phase(self, arm: str, tier: Tier, repeat: int) -> None:
        cfg = self.arms[arm]
        labels = PhaseLabels(arm, tier.label, repeat)
        warm, measured = plan_jobs(
            self.prompts_for(tier), labels, seed=cfg.bench.seed,
            warmup=cfg.bench.warmup_for(tier.concurrency), voices=cfg.prompts.voices,
        )  # fmt: skip
        skip = {j.request.request_id for j in measured if request_key(_key_dict(labels, j)) in self.done}
        if len(skip) == len(measured):
            log.info("%s %s r%d: already complete, skipped", arm, tier.label, repeat)
            return
        if self.progress is not None:
            self.progress.start(f"{tier.label} {arm} r{repeat}", len(measured) - len(skip))
        await run_fresh_phase(cfg, tier, labels, (warm, measured), run_dir=self.run_dir, sink=self.sink,
                              hooks=self.hooks, progress=self.advance, skip_ids=skip)


def _key_dict(labels: PhaseLabels, job: Job) -> dict[str, Any]:
    return {"arm": labels.arm, "tier": labels.tier, "repeat": labels.repeat,
            "request_id": job.request.request_id}


def phase_order(arms: Sequence[str], repeat: int) -> list[str]:
    """The arms' order within one repeat: as given on even repeats, reversed on odd ones (A B B A).

    Why: on an H200 the second of two arms ran 12-15% faster at 32x1 in two unrelated A/Bs with
    one repeat each; with plain A B A B that position effect always favours the test arm."""
    return list(arms) if repeat % 2 == 0 else list(arms)[::-1]


def run_ab(
    arms: dict[str, BenchConfig],
    tiers: Sequence[Tier],
    *,
    repeats: int,
    num_prompts: int,
    run_dir: RunDir,
    progress: AbProgress | None = None,
    resume: bool = False,
    hooks: PhaseHooks | None = None,
    until: UntilResolved | None = None,
    calibration: Calibration | None = None,
) -> AbResult:
    """Run the A/B (`arms` ordered base, test) and compute the result from the run's JSONL.

    `until`: add block pairs until resolved (`tts_bench.until_resolved`) instead of exactly
    `repeats` blocks; `calibration`: the case's A/A calibration (one-block intervals, MDE)."""
    if len(arms) != 2:
        raise ValueError(f"run_ab needs exactly two arms (base, test), got {list(arms)}")
    done = run_dir.completed_keys() if resume else set()
    runner = _Runner(arms, num_prompts, run_dir, done, progress, hooks)

    by_label = {t.label: t for t in tiers}

    async def blocks(tier: str, first: int, stop: int) -> None:
        for repeat in range(first, stop):
            for arm in phase_order(list(arms), repeat):
                try:
                    await runner.phase(arm, by_label[tier], repeat)
                except BackendError as exc:
                    # A backend that cannot start before anything was measured is a broken
                    # setup (raise: exit 1). Once requests are recorded, it is a run that
                    # stopped half-way (a server went down): report what was measured, as
                    # invalid, rather than an error with no table.
                    if not runner.done:
                        raise
                    raise _StoppedEarly(f"{arm} {tier} r{repeat}: {str(exc).removeprefix('error: ')}") from exc

    async def fixed() -> None:
        for tier in tiers:
            await blocks(tier.label, 0, repeats)

    def summary() -> AbResult:
        records = [RequestRecord.from_dict(d) for d in run_dir.iter_requests()]
        return summarize_ab(records, arms, tiers, run_dir=str(run_dir.path), calibration=calibration)

    try:
        if until is None:
            asyncio.run(fixed())
            return summary()
        stopped = asyncio.run(drive(until, blocks, [t.label for t in tiers], repeats=repeats, run_dir=run_dir,
                                    comparisons=lambda: {t.tier: t.rtf for t in summary().tiers}))
        return replace(summary(), until_resolved=stopped)
    except _StoppedEarly as early:
        reason = f"the run stopped early, backend failed: {early}; fix it, then --resume"
        result = summary()
        return replace(result, invalid_reasons=(*result.invalid_reasons, reason))


class _StoppedEarly(Exception):
    """A backend failed after requests were recorded: the run ends, as invalid."""


# ---------------------------------------------------------------- summarizing


def summarize_ab(
    records: Sequence[RequestRecord], arms: dict[str, BenchConfig], tiers: Sequence[Tier], *, run_dir: str,
    calibration: Calibration | None = None,
) -> AbResult:
    """Per-tier aggregates, comparisons, flags and validity from recorded requests."""
    by_tier_arm: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for r in records:
        if not r.warmup:
            by_tier_arm[(r.tier, r.arm)].append(r)
    names = tuple(arms)
    bench = arms[names[0]].bench
    results = [
        _tier_result(tier.label, {a: by_tier_arm[(tier.label, a)] for a in names}, bench, calibration)
        for tier in tiers
    ]
    reasons = tuple(reason for t in results for reason in t.invalid_reasons)
    repeats = min((len({r.repeat for r in rs}) for rs in by_tier_arm.values()), default=0)
    return AbResult(results, run_dir, names, reasons, repeats, calibration)


VOICE_CACHE = ("hit", "miss")


def voice_cache_view(
    run_dir: RunDir, arms: dict[str, BenchConfig], tiers: Sequence[Tier], which: str, *,
    calibration: Calibration | None = None,
) -> tuple[AbResult, int, int]:
    """The A/B over the measured requests whose voice was a prompt-cache `which` (hit: its
    prompt setup reused; miss: built for it), with how many of all measured requests that is.
    A request the backend did not report on (failed, or a backend without voices) is left out."""
    if which not in VOICE_CACHE:
        raise ConfigError(f"error: unknown voice cache filter {which!r} (--voice-cache); valid: hit, miss")
    records = [RequestRecord.from_dict(d) for d in run_dir.iter_requests()]
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


def _spread(calibration: Calibration | None, tier: str, metric: str):
    return None if calibration is None else calibration.spread(tier, metric)


@dataclass(frozen=True)
class _Identity:
    outputs: int  # pairs with equal audio and equal codes
    codes: int | None  # pairs with equal codes (None: the backend reports no codes)
    paired: int


def _identity(base: Sequence[RequestRecord], test: Sequence[RequestRecord]) -> _Identity:
    """Successful request pairs (same prompt, repeat) with equal audio and/or codes hashes.

    Codes and audio are counted apart: a bit-exact change must keep the codes identical, while
    audio can also differ by batch-composition-dependent GEMM rounding in code2wav when the two
    arms' requests happened to share batches differently.
    """
    other = {_pair_key(r): r for r in test if r.ok}
    pairs = [(r, other[_pair_key(r)]) for r in base if r.ok and _pair_key(r) in other]
    same = sum(a.audio_sha256 == b.audio_sha256 and a.codes_sha256 == b.codes_sha256 for a, b in pairs)
    has_codes = any(a.codes_sha256 for a, _ in pairs)
    codes = sum(a.codes_sha256 == b.codes_sha256 for a, b in pairs) if has_codes else None
    return _Identity(same, codes, len(pairs))


def _tier_result(tier: str, per_arm: dict[str, list[RequestRecord]], bench,
                 calibration: Calibration | None = None) -> TierResult:
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
        identical_codes=ident.codes, invalid_reasons=tuple(reasons),
    )
