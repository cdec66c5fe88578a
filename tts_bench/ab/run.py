"""Same-day A/B of audio RTF: arms interleaved per tier, each phase on a fresh backend.

For each tier `CxR`, for each of K repeats, each arm gets a fresh backend, in counterbalanced
order (`phase_order`: A B, then B A, then A B ...: with an even K each arm runs first as often as
second, so a drift within the session, e.g. the first phase on a cold machine running slower,
cannot pose as an effect of either arm). Each phase is `tts_bench.load.phases.run_fresh_phase`:
`start(R)`, `max(2, C)` warmup requests (recorded, flagged, excluded from stats), the measured
requests with exactly C in flight, `stop()`. Both arms send the same prompts in the same order
with the same per-request seeds (`tts_bench.load.plan.plan_jobs`). The result is computed from the
record by `tts_bench.ab.summary.summarize_ab` (aggregates, paired-block comparisons, verdicts,
flags). A one-repeat run has no interval of its own: its verdict is `unresolved` unless a
calibration of this case and hardware profile is given (`tts_bench.verdicts.calibration`). With
`until=UntilResolved(...)` blocks are added in counterbalanced pairs until every tier's interval
is narrow enough (`tts_bench.verdicts.until_resolved`).

Every finished request is appended to the run's JSONL at once; the result is computed from
the JSONL, so `resume=True` finishes a killed run without repeating completed requests (a phase
with measured work left gets a fresh backend and its warmup again; warmup records already on
disk are not written twice).

Duration mode (`bench.duration_s`, `tts_bench.load.windows`): each phase is ramp, measured window,
drain, with the prompt set cycling (`tts_bench.load.plan.cycle_jobs`); a phase is complete when
its record is in phases.jsonl, and --resume runs a cut phase again whole (its partial records
are left out of the result). Before the first block of a tier each arm runs one discarded warm
phase on a fresh backend (`bench.warmup_phase`, default on in duration mode; repeat -1, every
record flagged warmup), so no measured block pays for cold caches. Open loop (`open_loop`,
`tts_bench.load.arrivals`): arrival times drawn per tier and repeat from bench.seed, the same in
both arms.

Hooks: pass `hooks` (`tts_bench.load.phases.PhaseHooks`: `on_phase(arm, tier, repeat, phase,
backend)`); it is called with phase "warmup" after `start`, "measure" before the measured
requests, and "end" after them (before `stop`). The memory sampler (`tts-bench ab --mem`,
`tts_bench.mem.hooks`) plugs in here.

    result = run_ab({"base": cfg_a, "test": cfg_b}, parse_tiers("2x1,4x2"),
                    repeats=2, num_prompts=8, run_dir=RunDir.create(...))
    result.to_dict()["tiers"][0]["verdict"]
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from tts_bench.ab.measurement import with_phase_validity
from tts_bench.ab.position import phase_order
from tts_bench.ab.summary import AbResult, summarize_ab
from tts_bench.load.arrivals import OpenLoop
from tts_bench.load.plan import cycle_jobs, plan_jobs
from tts_bench.verdicts.calibration import Calibration
from tts_bench.config import BenchConfig, Tier
from tts_bench.errors import BackendError
from tts_bench.load.phases import PhaseHooks, run_fresh_phase
from tts_bench.inputs.prompts import select_bench_prompts
from tts_bench.rundir.records import Job, PhaseLabels, RequestRecord, read_records
from tts_bench.rundir.results import RunDir, request_key
from tts_bench.load.windows import WindowPlan, complete_phase_ids, measured_phases, warmup_phase_on
from tts_bench.report.progress import current
from tts_bench.verdicts.until_resolved import UntilResolved, drive

log = logging.getLogger(__name__)


class AbProgress(Protocol):
    """What the CLI's progress bar implements: one task per (tier, arm, repeat)."""

    def start(self, description: str, total: int | None) -> None: ...

    def advance(self) -> None: ...


@dataclass
class _Runner:
    arms: dict[str, BenchConfig]
    num_prompts: int
    run_dir: RunDir
    done: set
    progress: AbProgress | None
    hooks: PhaseHooks | None
    open_loop: OpenLoop | None = None
    attempts: dict[tuple[str, str, int], int] = field(default_factory=dict)  # cut duration phases
    _prompt_cache: dict[int, list[Any]] = field(default_factory=dict)
    _warmed: set[str] = field(default_factory=set)

    @property
    def bench(self):
        return next(iter(self.arms.values())).bench

    @property
    def window(self) -> WindowPlan | None:
        return WindowPlan.from_bench(self.bench)

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
        warm_n = cfg.bench.warmup if self.window is not None else cfg.bench.warmup_for(tier.concurrency)
        warm, measured = plan_jobs(
            self.prompts_for(tier), labels, seed=cfg.bench.seed, warmup=warm_n or 0, voices=cfg.prompts.voices,
        )  # fmt: skip
        if self.window is not None:
            if (arm, tier.label, repeat) in measured_phases(self.run_dir):
                log.info("%s %s r%d: already complete, skipped", arm, tier.label, repeat)
                return
            await self.warm_tier(tier)
            if self.progress is not None:
                self.progress.start(f"{tier.label} {arm} r{repeat}", None)
            jobs = cycle_jobs(self.prompts_for(tier), labels, seed=cfg.bench.seed, voices=cfg.prompts.voices,
                              attempt=self.attempts.get((arm, tier.label, repeat), 0))
            await self.run(cfg, tier, labels, (warm, jobs))
            return
        skip = {j.request.request_id for j in measured if request_key(_key_dict(labels, j)) in self.done}
        if len(skip) == len(measured):
            log.info("%s %s r%d: already complete, skipped", arm, tier.label, repeat)
            return
        await self.warm_tier(tier)
        if self.progress is not None:
            self.progress.start(f"{tier.label} {arm} r{repeat}", len(measured) - len(skip))
        await self.run(cfg, tier, labels, (warm, measured), skip=skip)

    async def run(self, cfg: BenchConfig, tier: Tier, labels: PhaseLabels, jobs, *, skip=frozenset(),
                  hooks: bool = True) -> None:
        arrivals = None if self.open_loop is None else self.open_loop.times(
            seed=cfg.bench.seed, tier=tier, repeat=labels.repeat)  # the same in both arms
        await run_fresh_phase(cfg, tier, labels, jobs, run_dir=self.run_dir, sink=self.sink,
                              hooks=self.hooks if hooks else None, progress=self.advance, skip_ids=skip,
                              window=self.window, arrivals=arrivals, phase_log=True)

    async def warm_tier(self, tier: Tier) -> None:
        """Once per tier and process (so again after --resume): each arm's discarded warm phase."""
        if tier.label in self._warmed or not warmup_phase_on(self.bench):
            return
        self._warmed.add(tier.label)
        for arm, cfg in self.arms.items():
            labels = PhaseLabels(arm, tier.label, -1)
            prompts = self.prompts_for(tier)
            if self.window is not None:
                at = cycle_jobs(prompts, labels, seed=cfg.bench.seed, voices=cfg.prompts.voices)
                jobs: Any = lambda i, at=at: replace(at(i), warmup=True)  # noqa: E731
            else:
                jobs = [replace(j, warmup=True) for j in plan_jobs(prompts, labels, seed=cfg.bench.seed, warmup=0,
                                                                    voices=cfg.prompts.voices)[1]]
            log.info("%s %s: warm phase (discarded)", arm, tier.label)
            await self.run(cfg, tier, labels, ([], jobs), hooks=False)


def _key_dict(labels: PhaseLabels, job: Job) -> dict[str, Any]:
    return {"arm": labels.arm, "tier": labels.tier, "repeat": labels.repeat,
            "request_id": job.request.request_id}


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
    open_loop: OpenLoop | None = None,
) -> AbResult:
    """Run the A/B (`arms` ordered base, test) and compute the result from the run's JSONL.

    `until`: add block pairs until resolved (`tts_bench.verdicts.until_resolved`) instead of exactly
    `repeats` blocks; `calibration`: the case's A/A calibration (one-block intervals, MDE)."""
    if len(arms) != 2:
        raise ValueError(f"run_ab needs exactly two arms (base, test), got {list(arms)}")
    done = run_dir.completed_keys() if resume else set()
    if progress is None:  # calibrate's and gate's A/Bs: the command's reporter, if one is open
        progress = current()
    runner = _Runner(arms, num_prompts, run_dir, done, progress, hooks, open_loop,
                     _cut_phases(run_dir) if resume else {})

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
        records = read_records(run_dir)
        if runner.window is not None:  # a phase cut short (then run again on --resume) is not measured
            ids = complete_phase_ids(run_dir)
            records = [r for r in records if r.warmup or r.phase_id in ids]
        result = summarize_ab(records, arms, tiers, run_dir=str(run_dir.path), calibration=calibration)
        return with_phase_validity(result, run_dir)

    last: list[AbResult] = []  # the summary after the latest round (--until-resolved)

    def comparisons() -> dict[str, Any]:
        last[:] = [summary()]
        return {t.tier: t.rtf for t in last[0].tiers}

    try:
        if until is None:
            asyncio.run(fixed())
            return summary()
        stopped = asyncio.run(drive(until, blocks, [t.label for t in tiers], repeats=repeats, run_dir=run_dir,
                                    comparisons=comparisons))
        # drive() returns right after its last comparisons(): nothing was recorded since, so
        # that summary is the result (no second read of the JSONL).
        return replace(last[0], until_resolved=stopped)
    except _StoppedEarly as early:
        reason = f"the run stopped early, backend failed: {early}; fix it, then --resume"
        result = summary()
        return replace(result, invalid_reasons=(*result.invalid_reasons, reason))


def _cut_phases(run_dir: RunDir) -> dict[tuple[str, str, int], int]:
    """(arm, tier, repeat) -> how many attempts at it left records (duration mode, --resume): the
    next attempt's request ids get that number, so they do not collide with the cut one's."""
    ids: dict[tuple[str, str, int], set[str]] = {}
    for d in run_dir.iter_requests():
        if not d.get("warmup"):
            ids.setdefault((d["arm"], d["tier"], int(d["repeat"])), set()).add(d.get("phase_id", ""))
    return {k: len(v) for k, v in ids.items()}


class _StoppedEarly(Exception):
    """A backend failed after requests were recorded: the run ends, as invalid."""


