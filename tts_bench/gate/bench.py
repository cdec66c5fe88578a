"""Run one case's bench (one arm, every tier x repeat) into a run directory of kind `case`.

The same machinery as `tts-bench ab` (fresh backend per tier and repeat, warmup excluded,
exactly C requests in flight, every request appended to requests.jsonl as it finishes), with one
arm instead of two. run.json's `case` section records what the gate checks: case name and file,
hardware profile, arm, the case config's system-under-test hash, extra overrides and the plan.

    run = run_case(resolve_case(load_case(path)), profile="cpu-2core", result_dir=Path("results/runs"))
    read_run(run.path)     # -> tts_bench.gate.samples.RunSamples
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from tts_bench.config import BenchConfig, Tier, config_hash, config_to_dict, parse_tiers
from tts_bench.config.sut import sut_hash
from tts_bench.gate.case import ResolvedCase
from tts_bench.load.phases import run_fresh_phase
from tts_bench.inputs.prompts import check_bench_prompts, load_prompts, select_bench_prompts
from tts_bench.load.plan import cycle_jobs, plan_jobs
from tts_bench.rundir.records import PhaseLabels
from tts_bench.rundir.provenance import python_argv
from tts_bench.rundir.results import RunDir
from tts_bench.load.windows import WindowPlan
from tts_bench.mem.hooks import make_ab_hooks
from tts_bench.preflight import check_arms

log = logging.getLogger(__name__)


def _create_run(rc: ResolvedCase, profile: str, result_dir: Path) -> RunDir:
    cfg, bench = rc.config, rc.config.bench
    plan = {"tiers": list(bench.tiers), "num_prompts": bench.num_prompts, "repeats": bench.repeats,
            "per_tier": {t.label: _num_prompts(rc, t) * bench.repeats for t in bench.tier_list}}
    case_doc = {
        "name": rc.loaded.case.name, "file": str(rc.loaded.path), "profile": profile, "arm": rc.arm,
        "sut_hash": sut_hash(config_to_dict(rc.case_config)), "extra_sets": list(rc.extra_sets),
        "plan": plan,
    }
    return RunDir.create(result_dir, "case", command_line=python_argv(),
                         configs={rc.arm: config_to_dict(cfg)},
                         config_hashes={rc.arm: config_hash(cfg)}, extra={"case": case_doc})


def _mem_hooks(rc: ResolvedCase, run: RunDir):
    if not rc.loaded.case.bench.mem:
        return None
    return make_ab_hooks(rc.config, run, arms_per_tier=1)


def _num_prompts(rc: ResolvedCase, tier) -> int:
    """Measured prompts per phase: bench.num_prompts, or K*C with bench.prompts_per_client."""
    bench = rc.config.bench
    return bench.prompts_for(tier.concurrency, bench.num_prompts)


def preflight_arms(arms: dict[str, BenchConfig]) -> tuple[Tier, ...]:
    """The checks `tts-bench ab` makes before its run directory exists (`ab.session.new_plan`):
    the tiers (each once), the prompts each arm will send and whether its stages fit. Without
    them a case that cannot run leaves a `failed` run directory behind. Returns the tiers."""
    base = next(iter(arms.values()))
    tiers = parse_tiers(base.bench.tiers)  # bench.tier_list would run a tier listed twice twice
    check_bench_prompts(arms, load_prompts(base.prompts.meta))
    check_arms(arms, tiers)
    return tiers


def run_case(rc: ResolvedCase, *, profile: str, result_dir: Path) -> RunDir:
    """Run the case's bench; returns the finished run directory (status `complete`)."""
    tiers = preflight_arms({rc.arm: rc.config})
    run = _create_run(rc, profile, Path(result_dir))
    hooks = _mem_hooks(rc, run)
    bench = rc.config.bench
    window = WindowPlan.from_bench(bench)  # `--set bench.duration_s=S`: duration-mode phases, as ab runs them

    async def main() -> None:
        for tier in tiers:
            prompts = select_bench_prompts(rc.config, _num_prompts(rc, tier))
            for repeat in range(bench.repeats):
                log.info("case %s: %s r%d", rc.loaded.case.name, tier.label, repeat)
                labels = PhaseLabels(rc.arm, tier.label, repeat)
                jobs = plan_jobs(prompts, labels, seed=bench.seed, warmup=bench.warmup_for(tier.concurrency),
                                 voices=rc.config.prompts.voices)
                if window is not None:  # duration mode: the prompts cycle through the window
                    jobs = (jobs[0], cycle_jobs(prompts, labels, seed=bench.seed, voices=rc.config.prompts.voices))
                await run_fresh_phase(rc.config, tier, labels, jobs, run_dir=run, hooks=hooks, window=window)

    with run.finishing():  # an error or Ctrl-C leaves the run failed / interrupted, not running
        asyncio.run(main())
        run.update(status="complete")
    return run
