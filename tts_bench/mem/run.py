"""`tts-bench mem` as a library call: each arm on a fresh backend, warm tier, then the sampled tier.

The procedure is the seed's (both arms identical): for each arm in order, build a fresh backend
and `start(R)` with the measured tier's R; send the warm tier (concurrency C_w, not sampled; its
R is the backend's, since a started service does not change its replica count); start the
samplers; send the tier's warmup requests (phase "warmup"), then the measured requests (phase
"measure") with exactly C in flight; stop the samplers; stop the backend. That is one
`tts_bench.load.phases.run_fresh_phase` (the phase `tts-bench ab` runs) with the warm tier as its
`before` step and `tts_bench.mem.hooks.MemoryHooks` starting and stopping the samplers. Every
request is appended to the run's JSONL as it finishes; the samples, summaries and timeline PNG
paths go into run.json under `mem`.

    plan = prepare_plan(arms, MemPlan(tier=parse_tier("128x8"), warm_tier=parse_tier("4x1"),
                                      num_prompts=128, samplers=("nvml", "torch"), interval_s=2.0))
    result = run_mem(arms, plan, run)
    result.summaries[0].to_dict()["arms"]["test"]["delta_mib"]
    result = measure_memory(Path("configs/ab/default.yaml"), sets=["mem.tier=4x2"])   # the command
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tts_bench.backends import make_backend
from tts_bench.config import BenchConfig, Tier, config_hash, config_to_dict, load_arms, parse_tier
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.load.loadgen import run_phase
from tts_bench.load.plan import cycle_jobs, plan_jobs
from tts_bench.mem.hooks import MemoryHooks
from tts_bench.mem.plot import preload, write_timeline
from tts_bench.mem.recorder import MemSeries
from tts_bench.mem.samplers import parse_sampler_names, resolve_names
from tts_bench.mem.summary import MemSummary, summarize
from tts_bench.load.phases import run_fresh_phase
from tts_bench.preflight import check_memory
from tts_bench.inputs.prompts import check_bench_prompts, load_prompts, select_bench_prompts
from tts_bench.rundir.records import PhaseLabels, RequestRecord
from tts_bench.report import progress
from tts_bench.rundir.provenance import python_argv
from tts_bench.rundir.results import RunDir
from tts_bench.config.shipped import DEFAULT_AB_CONFIG, shipped_config
from tts_bench.load.windows import WindowPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemPlan:
    """What to run; `samplers[0]` is the primary one (the table and the top-level JSON)."""

    tier: Tier
    warm_tier: Tier | None
    num_prompts: int
    samplers: tuple[str, ...] = ("auto",)
    interval_s: float = 2.0
    device_index: int = 0
    warm_prompts: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tier": self.tier.label, "warm_tier": self.warm_tier.label if self.warm_tier else None,
                "num_prompts": self.num_prompts, "samplers": list(self.samplers),
                "interval_s": self.interval_s, "device_index": self.device_index,
                "warm_prompts": self.warm_requests}

    @property
    def warm_requests(self) -> int:
        if self.warm_tier is None:
            return 0
        return self.warm_prompts or 2 * self.warm_tier.concurrency


@dataclass(frozen=True)
class MemResult:
    summaries: list[MemSummary]  # one per sampler, primary first
    run_dir: str
    timelines: list[str]
    failed: dict[str, int]  # measured requests that failed, per arm
    invalid_reasons: tuple[str, ...] = field(default=())

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.OK if not self.invalid_reasons else ExitStatus.INVALID_RUN

    def to_dict(self) -> dict[str, Any]:
        """The primary sampler's summary at the top level (sampler, interval_s, arms...), every
        sampler under `samplers`, plus the run's paths and validity."""
        primary = self.summaries[0].to_dict()
        return {
            **primary,
            "samplers": {s.sampler: s.to_dict() for s in self.summaries},
            "run_dir": self.run_dir,
            "timelines": self.timelines,
            "failed": self.failed,
            "valid": not self.invalid_reasons,
            "invalid_reasons": list(self.invalid_reasons),
        }


@dataclass
class _ArmRun:
    """One arm: what it recorded."""

    series: dict[str, MemSeries]  # by sampler
    records: list[RequestRecord]  # the measured requests


async def _warm(backend: Any, cfg: BenchConfig, arm: str, plan: MemPlan, prompts: list, run_dir: RunDir) -> None:
    if plan.warm_tier is None:
        return
    warm_prompts = [prompts[i % len(prompts)] for i in range(plan.warm_requests)]
    labels = PhaseLabels(arm, f"warm-{plan.warm_tier.label}", 0)
    _, jobs = plan_jobs(warm_prompts, labels, seed=cfg.bench.seed, warmup=0, voices=cfg.prompts.voices)
    log.info("%s: warm tier %s (%d requests, not sampled)", arm, plan.warm_tier.label, len(jobs))
    await run_phase(backend, jobs, concurrency=plan.warm_tier.concurrency, labels=labels,
                    timeout_s=cfg.bench.timeout_s, sink=lambda rec: run_dir.append_request(rec.to_dict()))


async def _run_arm(arm: str, cfg: BenchConfig, plan: MemPlan, prompts: list, run_dir: RunDir,
                   hooks: MemoryHooks) -> _ArmRun:
    """One arm on a fresh backend: the warm tier (not sampled), then the sampled tier."""
    labels = PhaseLabels(arm, plan.tier.label, 0)
    jobs = plan_jobs(prompts, labels, seed=cfg.bench.seed, warmup=cfg.bench.warmup_for(plan.tier.concurrency),
                     voices=cfg.prompts.voices)
    window = WindowPlan.from_bench(cfg.bench)  # --duration: ramp, window, drain (tts_bench.load.windows)
    if window is not None:
        jobs = (jobs[0], cycle_jobs(prompts, labels, seed=cfg.bench.seed, voices=cfg.prompts.voices))
    # The warm tier runs on the same replicas first: size them for it too, or a warm tier above
    # the sampled one's concurrency would grow the slot pools (and drop their graphs) before sampling.
    warm_c = plan.warm_tier.concurrency if plan.warm_tier is not None else 0
    # (warmup, measured); duration mode's measured jobs are a function of position, no count
    progress.task(f"{arm} {plan.tier.label}", None if window is not None else len(jobs[1]))
    result = await run_fresh_phase(cfg, plan.tier, labels, jobs, run_dir=run_dir, hooks=hooks,
                                   before=lambda backend: _warm(backend, cfg, arm, plan, prompts, run_dir),
                                   size_for=warm_c, window=window, progress=lambda _rec: progress.advance())
    series = {name: arms[arm] for name, arms in hooks.series(plan.tier.label).items() if arm in arms}
    return _ArmRun(series, result.records)


def _invalid(runs: dict[str, _ArmRun], summaries: list[MemSummary], arms: dict[str, BenchConfig]) -> list[str]:
    reasons = []
    for arm, r in runs.items():
        failed = sum(not rec.ok for rec in r.records)
        limit = arms[arm].bench.max_failure_fraction
        if r.records and failed / len(r.records) > limit:
            reasons.append(f"{arm}: {failed} of {len(r.records)} measured requests failed, "
                           f"above bench.max_failure_fraction={limit:g}")
    for s in summaries:
        for arm, a in s.arms.items():
            if a.steady_median_mib is None and a.n_samples and a.gaps == a.n_samples:
                reasons.append(f"{arm}: every {s.sampler} sample failed ({a.gaps} gaps; the warnings above say "
                               f"why); fix the sampler or pick another with --sampler (rss reads any host)")
            elif a.steady_median_mib is None:
                reasons.append(f"{arm}: no {s.sampler} sample in the measure phase "
                               f"({a.n_samples} samples, {a.gaps} gaps); lower --interval or add prompts")
    return reasons


def _check_torch_sampler(arms: dict[str, BenchConfig]) -> None:
    """`torch` reads the stage processes through the backend: refuse before any tier runs when
    an arm's backend cannot report them (building a backend starts nothing)."""
    for arm, cfg in arms.items():
        if not callable(getattr(make_backend(cfg), "memory_snapshot", None)):
            raise ConfigError(
                f"error: the {cfg.backend!r} backend of arm {arm!r} does not report allocator memory "
                f"(--sampler torch); use --sampler rss (or nvml / npu-smi on a device), or backend=embedded"
            )


def prepare_plan(arms: dict[str, BenchConfig], plan: MemPlan) -> MemPlan:
    """The plan with `auto` resolved and every sampler checked, before any backend starts."""
    plan = replace(plan, samplers=resolve_names(plan.samplers, device_index=plan.device_index))
    if "torch" in plan.samplers:
        _check_torch_sampler(arms)
    return plan


def measure_memory(
    config: Path | None, *, sets: Sequence[str] = (), base_sets: Sequence[str] = (),
    test_sets: Sequence[str] = (), num_prompts: int | None = None, result_dir: Path = Path("results/runs"),
) -> MemResult:
    """`tts-bench mem` as one call: both arms of `config` (default: the shipped
    configs/ab/default.yaml), the plan from the base arm's `mem:` section (`num_prompts` None:
    max(bench.num_prompts, 2 x C)), every check before the run directory exists, then the run."""
    arms = load_arms(config or shipped_config(DEFAULT_AB_CONFIG), sets, base_sets, test_sets)
    base = next(iter(arms.values()))
    check_bench_prompts(arms, load_prompts(base.prompts.meta))  # a bad meta.lst or voice: exit 2 now
    plan = plan_from_config(base, num_prompts)
    plan = prepare_plan(arms, plan)  # a sampler that cannot start fails before the run exists
    _check_memory(arms, plan)
    run = RunDir.create(
        result_dir, "mem", command_line=python_argv(),
        configs={n: config_to_dict(c) for n, c in arms.items()},
        config_hashes={n: config_hash(c) for n, c in arms.items()}, extra={"mem_plan": plan.to_dict()},
    )
    with run.finishing():  # any exit (error, Ctrl-C) leaves run.json failed / interrupted
        return run_mem(arms, plan, run)


def plan_from_config(base: BenchConfig, num_prompts: int | None = None) -> MemPlan:
    """The plan of the base arm's `mem:` section (the caller has read and checked its prompts)."""
    params = base.mem
    if params.tier is None:  # the config's first tier, checked by the memory preflight like any
        tier = parse_tier(base.bench.tiers[0], where="bench.tiers (the default mem.tier)")
    else:
        tier = parse_tier(params.tier, where="--tier / mem.tier")
    return MemPlan(
        tier=tier,
        warm_tier=parse_tier(params.warm_tier, where="--warm-tier / mem.warm_tier") if params.warm_tier else None,
        num_prompts=max(base.bench.num_prompts, 2 * tier.concurrency) if num_prompts is None else num_prompts,
        samplers=parse_sampler_names(params.sampler), interval_s=params.interval_s,
        device_index=params.device_index, warm_prompts=params.warm_prompts,
    )


def _check_memory(arms: dict[str, BenchConfig], plan: MemPlan) -> None:
    warm_c = plan.warm_tier.concurrency if plan.warm_tier else 0
    for name, cfg in arms.items():  # the warm tier runs on the same backend (the tier's R)
        check_memory(cfg, replicas=plan.tier.replicas, concurrency=max(plan.tier.concurrency, warm_c),
                     label=f"arm {name!r} at tier {plan.tier.label}")


def run_mem(arms: dict[str, BenchConfig], plan: MemPlan, run_dir: RunDir) -> MemResult:
    """Run every arm in order on a fresh backend and summarise, record and plot the memory;
    `plan` has been through `prepare_plan` (its samplers resolved)."""
    base_cfg = next(iter(arms.values()))
    preload()  # every arm is sampled with matplotlib already in this process (rss counts it)
    prompts = select_bench_prompts(base_cfg, plan.num_prompts)

    # Samplers start after each arm's warm tier and stop after its measured requests; the
    # summary below is this run's own (run.json `mem`), so the hooks keep the series only.
    hooks = MemoryHooks(plan.samplers, interval_s=plan.interval_s, device_index=plan.device_index,
                        arms_per_tier=len(arms))

    async def main() -> dict[str, _ArmRun]:
        return {arm: await _run_arm(arm, cfg, plan, prompts, run_dir, hooks) for arm, cfg in arms.items()}

    runs = asyncio.run(main())
    summaries = [summarize({arm: r.series[name] for arm, r in runs.items()}, tier=plan.tier.label)
                 for name in _sampler_keys(runs)]
    timelines = [str(write_timeline(s, run_dir.path / f"mem_timeline_{plan.tier.label}_{s.sampler}.png"))
                 for s in summaries]
    result = MemResult(
        summaries, str(run_dir.path), timelines,
        failed={arm: sum(not rec.ok for rec in r.records) for arm, r in runs.items()},
        invalid_reasons=tuple(_invalid(runs, summaries, arms)),
    )
    run_dir.update(
        status="complete" if not result.invalid_reasons else "invalid",
        mem={**result.to_dict(),
             "series": {name: {arm: r.series[name].to_dict() for arm, r in runs.items()}
                        for name in _sampler_keys(runs)}},
    )
    return result


def _sampler_keys(runs: dict[str, _ArmRun]) -> list[str]:
    """Samplers every arm recorded (`auto` resolves per arm, alike on one host), primary first."""
    first = next(iter(runs.values()))
    return [name for name in first.series if all(name in r.series for r in runs.values())]
