"""Launch accounting per A/B arm on a fixed small in-process workload (`tts-bench profile`).

For each arm the stages are built in this process from the arm's `stages` config (seeded random
weights, `runner.device` / `runner.dtype`); no runner processes, no load generator. At each
batch size B, the workloads of `stages.profiling` count launches (device kernels on CUDA,
top-level non-view aten operators on CPU) of four steps:

* `talker_step`: one talker decode step with B active rows (after prefill, warmed up;
  `stages.profiling.talker_step`);
* `code2wav_step`: one code2wav decode of B streams' steady 28-code payloads, the flow caches
  already at their steady (trimmed) shape (`stages.profiling.code2wav_step`);
* `cache_split`: the part of the flow-cache split the two implementations differ in: storing a
  B-row chunk's conformer cnn/att and estimator cnn caches into the rows' pool slots (4 per row,
  or 3 in all when batched; `stages.profiling.cache_split`), in the arm's own split mode
  (`code2wav.extra.code2wav_batched_cache_split`);
* `cache_split_total`: that plus the estimator attention stores of all Euler steps (trimmed to
  prompt + keep frames), which both implementations share.

The same profiler run also times the named ranges of `stages.profiling.ranges`: the talker
step, the whole decode and its parts (flow encoder, CFM, HiFT): device ms on CUDA, host cpu_ms
on CPU. With `tier=CxR` the talker is also measured at B = C and code2wav at
b = min(max_num_seqs, ceil(C / R)), and `tts_bench.profile.split.TierSplit` turns those into
time per second of audio per component. This module tabulates what the workloads return.

Cost: each arm's stages are built once (talker slots = the largest B, cache positions = what
the workload needs, not runner.max_seq_len); each B then re-feeds fresh streams to the steady
cache shape. Phases log their wall time at INFO.

    arms = load_arms(Path("configs/ab/default.yaml"))
    result = profile_arms(arms, rows=(1, 4, 8), chunks=3, tier=parse_tier("128x8"))
    print(render(result.table(), "md"))
    print(render(result.split.table(), "md", title=result.split.title()))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from stages.profiling.build import build_code2wav, build_talker, placement, prepare_prompt
from stages.profiling.cache_split import count_cache_split, split_mode
from stages.profiling.code2wav_step import measure_code2wav_step
from stages.profiling.launches import LaunchCount, RangeTimes
from stages.profiling.talker_step import measure_talker_step, profile_text, talker_cache_len, talker_positions
from tts_bench.config import BenchConfig, Tier
from tts_bench.errors import ConfigError
from tts_bench.preflight import check_memory
from tts_bench.report import progress
from tts_bench.profile.split import TierPlan, TierSplit

if TYPE_CHECKING:
    from stages.config import StageConfig
    from stages.profiling.build import TalkerEngine, Token2Wav  # what the builds return

log = logging.getLogger(__name__)

STEPS = ("talker_step", "code2wav_step", "cache_split", "cache_split_total")


@dataclass(frozen=True)
class ArmProfile:
    """One arm's launch counts at one batch size."""

    arm: str
    rows: int
    device: str
    split: str  # "batched" | "per-row"
    counts: dict[str, LaunchCount]  # by step name (STEPS)
    # Time inside the step's ranges (RANGES), from the same profiler run as the counts.
    times: dict[str, RangeTimes] = field(default_factory=dict)


@dataclass(frozen=True)
class StageTiming:
    """One arm's range times for one step at one B (tier runs at a B outside `rows` too)."""

    arm: str
    step: str  # "talker_step" | "code2wav_step"
    rows: int
    times: RangeTimes


@dataclass(frozen=True)
class ProfileResult:
    arms: tuple[str, str]  # (base, test)
    rows: tuple[int, ...]
    chunks: int
    profiles: list[ArmProfile]
    timings: list[StageTiming] = field(default_factory=list)
    split: TierSplit | None = None  # with profile_arms(..., tier=...)

    def get(self, arm: str, rows: int) -> ArmProfile:
        return next(p for p in self.profiles if p.arm == arm and p.rows == rows)

    def table(self) -> pd.DataFrame:
        """One row per (B, step): unit, both arms' launches per call, and the delta. On a device
        the memcpy/memset launches (a contiguous clone is a memcpy, not a kernel) get their own
        column, `copies base / test`, so kernels + copies is every launch the step issued."""
        base, test = self.arms
        with_copies = any(c.copies_per_call for p in self.profiles for c in p.counts.values())
        records = []
        for b in self.rows:
            pa, pb = self.get(base, b), self.get(test, b)
            for step in STEPS:
                ca, cb = pa.counts[step], pb.counts[step]
                record = {
                    "B": b, "step": step, "unit": ca.unit,
                    base: _num(ca.per_call), test: _num(cb.per_call),
                    "delta": _signed(cb.per_call - ca.per_call), "delta %": _pct(ca.per_call, cb.per_call),
                }  # fmt: skip
                if with_copies:
                    record["copies base / test"] = f"{_num(ca.copies_per_call)} / {_num(cb.copies_per_call)}"
                records.append(record)
        return pd.DataFrame.from_records(records)

    def title(self) -> str:
        """What the table counts: device, calls per count, each arm's cache split."""
        splits = ", ".join(f"{arm} {self.get(arm, self.rows[0]).split}" for arm in self.arms)
        device = self.profiles[0].device
        return f"launches per call on {device} ({self.chunks} profiled calls each; cache split: {splits})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "profile",
            "arms": list(self.arms),
            "rows": list(self.rows),
            "chunks": self.chunks,
            "profiles": [
                {"arm": p.arm, "rows": p.rows, "device": p.device, "split": p.split,
                 "counts": {k: asdict(v) for k, v in p.counts.items()},
                 "times": {k: asdict(v) for k, v in p.times.items()}}
                for p in self.profiles
            ],  # fmt: skip
            "timings": [asdict(t) for t in self.timings],
            "tier_split": None if self.split is None else self.split.to_dict(),
        }


def _num(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.2f}"


def _signed(x: float) -> str:
    return "0" if x == 0 else ("+" if x > 0 else "-") + _num(abs(x))


def _pct(a: float, b: float) -> str:
    if a == 0 or a == b:
        return "" if a == 0 else "0.0%"
    return ("+" if b > a else "-") + f"{abs(b - a) / a * 100:.1f}%"


# ---------------------------------------------------------------- the library call


def profile_arms(
    arms: Mapping[str, BenchConfig], rows: int | Sequence[int] = 8, chunks: int = 3, *,
    tier: Tier | None = None, talker_context: int = 0,
) -> ProfileResult:
    """Count launches per step for both arms at each B in `rows`, `chunks` profiled calls each.

    With `tier` (C x R), also time the talker step at B = C and the code2wav decode at
    B = min(max_num_seqs, ceil(C / R)) and derive the per-second-of-audio split (TierSplit).
    `talker_context`: cache positions each talker row holds before the profiled steps (its
    condition length); attention reads the cache up to the longest row, so this sets kv_len.
    """
    rows = (rows,) if isinstance(rows, int) else tuple(rows)
    _check_args(arms, rows, chunks, talker_context)
    check_profile_memory(arms, rows, chunks, tier=tier, talker_context=talker_context)
    profiles: list[ArmProfile] = []
    timings: list[StageTiming] = []
    for name, cfg in arms.items():
        p, t = profile_stages(
            cfg.stages, rows=rows, chunks=chunks, arm=name, tier=tier, talker_context=talker_context
        )
        profiles += p
        timings += t
    names = (*arms,)
    split = None
    if tier is not None:  # the base arm's max_num_seqs and rates (arms differ in flags, not dims)
        base = arms[names[0]].stages
        plan = TierPlan.of(tier, base.runner.max_num_seqs, base.code2wav)
        split = TierSplit.build(plan, (names[0], names[1]), timings)
    return ProfileResult((names[0], names[1]), rows, chunks, profiles, timings, split)


def _check_args(
    arms: Mapping[str, BenchConfig], rows: tuple[int, ...], chunks: int, context: int
) -> None:
    if len(arms) != 2:
        raise ConfigError(
            f"error: profile needs exactly two arms, got {len(arms)} (arms); give base and test"
        )
    if not rows or min(rows) < 1:
        raise ConfigError(f"error: rows must be >= 1, got {list(rows)} (--rows); e.g. --rows 1,4,8")
    if chunks < 1:
        raise ConfigError(f"error: chunks must be >= 1, got {chunks} (--chunks); e.g. --chunks 3")
    if context < 0:
        raise ConfigError(
            f"error: talker context must be >= 0, got {context} (--talker-context); e.g. 256"
        )
    others = {name: arm.backend for name, arm in arms.items() if arm.backend != "embedded"}
    if others:  # another backend's config still has a stages section: the host's full-size default
        listed = ", ".join(f"arm {name!r} runs the {backend} backend" for name, backend in others.items())
        raise ConfigError(f"error: profile needs an embedded config: {listed} (--config / backend); it builds "
                          "the embedded stages of each arm: pass a config with backend: embedded, e.g. "
                          "configs/ab/default.yaml, or --set backend=embedded")
    text = profile_text(context)
    for arm in arms.values():  # before any arm builds its stages (minutes on a device)
        _check_context(arm.stages, text, chunks)


def check_profile_memory(arms: Mapping[str, BenchConfig], rows: Sequence[int], chunks: int, *,
                         tier: Tier | None = None, talker_context: int = 0) -> None:
    """The memory preflight of `ab` and `serve` (`tts_bench.preflight.check_memory`) for what a
    profile builds in this process: one talker with a slot per profiled row and a cache of the
    positions the workload needs, one code2wav decoding the largest B (no replica processes)."""
    positions = talker_positions(profile_text(talker_context), chunks)
    for name, cfg in arms.items():
        runner = cfg.stages.runner
        plan = None if tier is None else TierPlan.of(tier, runner.max_num_seqs, cfg.stages.code2wav)
        talker_rows = max(rows) if plan is None else max(*rows, plan.talker_rows)
        code2wav_rows = max(rows) if plan is None else max(*rows, plan.code2wav_rows)
        sized = replace(runner, talker_max_batch=talker_rows, max_num_seqs=code2wav_rows,
                        max_seq_len=talker_cache_len(positions, runner.max_seq_len))
        check_memory(replace(cfg, stages=replace(cfg.stages, runner=sized)), replicas=1,
                     concurrency=max(talker_rows, code2wav_rows),
                     label=f"arm {name!r} profiled at B = {', '.join(map(str, rows))} (--rows, --tier)")


def profile_stages(
    stages: StageConfig, *, rows: Sequence[int], chunks: int, arm: str,
    tier: Tier | None = None, talker_context: int = 0,
) -> tuple[list[ArmProfile], list[StageTiming]]:
    """One arm: build talker + code2wav once (the largest B needed), then measure at each B.

    Phases are logged with their wall time (stderr), so a run cut short by a timeout still
    shows where its time went.
    """
    runner = stages.runner
    place = placement(runner)
    split = split_mode(stages.code2wav)
    plan = None if tier is None else TierPlan.of(tier, runner.max_num_seqs, stages.code2wav)
    talker_rows = max(rows) if plan is None else max(*rows, plan.talker_rows)
    text = profile_text(talker_context)
    with _phase(f"profile {arm}: build talker ({talker_rows} slots) on {place.device} ({runner.dtype})"):
        _check_context(stages, text, chunks)
        talker = build_talker(stages, place, rows=talker_rows, text=text, chunks=chunks)
    with _phase(f"profile {arm}: build code2wav (split {split})"):
        t2w = build_code2wav(stages, place)
    with _phase(f"profile {arm}: prompt setup"):
        prepare_prompt(t2w)
    profiles, timings = [], []
    progress.task(f"{arm} rows", len(rows))
    for b in rows:
        progress.advance(0 if b == rows[0] else 1)  # between measurements, never inside one
        with _phase(f"profile {arm}: B={b}"):
            talk = measure_talker_step(talker, b, chunks, text=text)
            dec = measure_code2wav_step(t2w, b, chunks, tag=arm)
            counts = {"talker_step": talk.launches, "code2wav_step": dec.launches,
                      **count_cache_split(t2w, b, chunks)}  # fmt: skip
        times = {"talker_step": talk.times, "code2wav_step": dec.times}
        profiles.append(ArmProfile(arm, b, str(place.device), split, counts, times))
        timings += [StageTiming(arm, step, b, t) for step, t in times.items()]
    progress.advance()
    if plan is not None:
        timings += _tier_timings(plan, talker, t2w, chunks, arm=arm, rows=rows, text=text)
    return profiles, timings


def _tier_timings(
    plan: TierPlan, talker: TalkerEngine, t2w: Token2Wav, chunks: int, *, arm: str,
    rows: Sequence[int], text: str,
) -> list[StageTiming]:
    """Range times at the tier's B for the steps the `rows` loop did not already measure."""
    out = []
    if plan.talker_rows not in rows:
        with _phase(f"profile {arm}: tier talker B={plan.talker_rows}"):
            m = measure_talker_step(talker, plan.talker_rows, chunks, text=text)
        out.append(StageTiming(arm, "talker_step", plan.talker_rows, m.times))
    if plan.code2wav_rows not in rows:
        with _phase(f"profile {arm}: tier code2wav B={plan.code2wav_rows}"):
            m = measure_code2wav_step(t2w, plan.code2wav_rows, chunks, tag=arm)
        out.append(StageTiming(arm, "code2wav_step", plan.code2wav_rows, m.times))
    return out


def _check_context(stages: StageConfig, text: str, chunks: int) -> None:
    """The profiled rows' condition and steps must fit the talker's cache (runner.max_seq_len)."""
    need = talker_positions(text, chunks)
    limit = stages.runner.max_seq_len
    if need > limit:
        raise ConfigError(
            f"error: the profiled talker rows need {need} cache positions (their text and the steps of "
            f"--chunks) but runner.max_seq_len is {limit} (--talker-context / --chunks); lower them or "
            "raise runner.max_seq_len"
        )


@contextmanager
def _phase(what: str) -> Iterator[None]:
    """Log a phase's wall time at INFO when it ends (also when it raises)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        log.info("%s: %.1f s", what, time.perf_counter() - t0)
