"""One `tts-bench ab` invocation as a library call: plan (or reopen) the run, run it, record it.

`run_session(AbRequest(...))` is what the command calls: it loads both arms (file, `--set`, the
file's `arms:`, `--base-set` / `--test-set`), fixes the plan (CLI options over the config's
bench section: tiers, repeats, prompts, the `--until-resolved` rule, the hardware profile and
the calibration found for it), checks memory and prompts before the run directory exists,
runs `tts_bench.ab.run.run_ab` with the memory hooks when asked, records the status and result
in run.json, and, with `voice_cache`, returns the view over one kind of request (the record
keeps every request). `--resume` reopens a run instead; its run.json fixes the arms and plan
(`plan_from_run`). `--report` reads a run's complete blocks without running anything
(`tts_bench.ab.report`).

    session = run_session(AbRequest(config=Path("configs/ab/synthetic.yaml"), tiers="2x1", repeats=2))
    session.result.exit_status, session.run_dir.path
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tts_bench.ab.measurement import measurement_doc
from tts_bench.ab.position import odd_repeats_warning
from tts_bench.ab.report import report_blocks
from tts_bench.ab.run import AbProgress, run_ab
from tts_bench.config.paths import resolve_profile
from tts_bench.load.arrivals import OpenLoop
from tts_bench.ab.summary import AbResult, check_voice_cache, voice_cache_view
from tts_bench.verdicts.calibration import Calibration, RunConditions, find_calibration, load_calibration
from tts_bench.config import BenchConfig, Tier, config_hash, config_to_dict, load_arms, load_dataclass, parse_tiers
from tts_bench.errors import ConfigError
from tts_bench.inputs.prompts import check_bench_prompts, load_prompts
from tts_bench.load.phases import HookChain
from tts_bench.mem.hooks import make_ab_hooks
from tts_bench.preflight import check_arms
from tts_bench.rundir.provenance import python_argv
from tts_bench.rundir.results import RunDir
from tts_bench.config.shipped import DEFAULT_AB_CONFIG, shipped_config
from tts_bench.load.stage_work import StageWorkHooks
from tts_bench.verdicts.until_resolved import DEFAULT_MAX_REPEATS, UntilResolved

log = logging.getLogger(__name__)


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
    open_loop: OpenLoop | None = None  # --request-rate / --burstiness: shared by both arms
    conditions: dict[str, Any] | None = None  # load, CPUs, machine when planned (calibration check)

    def to_dict(self) -> dict[str, Any]:
        return {"arms": list(self.arms), "tiers": [t.label for t in self.tiers],
                "repeats": self.repeats, "num_prompts": self.num_prompts,
                "until_resolved": self.until.to_dict() if self.until else None,
                "profile": self.profile, "calibration": self.calibration, "conditions": self.conditions,
                "open_loop": self.open_loop.to_dict() if self.open_loop else None}


def plan_from_run(run_dir: RunDir, *, flag: str = "--resume") -> AbPlan:
    """Rebuild the plan of a recorded A/B (for `flag`: --resume, --report) from its run.json."""
    doc = run_dir.doc
    if doc.get("kind") != "ab" or "ab" not in doc:
        raise ConfigError(
            f"error: {run_dir.path} is not an A/B run ({flag}); pass a directory made by tts-bench ab"
        )
    # RunDir.open checked that configs maps arm names to configs; an A/B needs exactly two.
    if len(doc["configs"]) != 2:
        raise ConfigError(
            f"error: {run_dir.run_json} records {len(doc['configs'])} arm(s) {list(doc['configs'])} in configs, "
            f"an A/B has two ({flag}); the record is damaged: rerun from scratch"
        )
    arms = {name: load_dataclass(BenchConfig, d, source=f"{run_dir.run_json}: configs.{name}")
            for name, d in doc["configs"].items()}
    plan = doc["ab"]
    try:
        until = UntilResolved.from_dict(plan["until_resolved"]) if plan.get("until_resolved") else None
        loop = OpenLoop(**plan["open_loop"]) if plan.get("open_loop") else None
        return AbPlan(arms, parse_tiers(plan["tiers"]), int(plan["repeats"]), int(plan["num_prompts"]),
                      until=until, profile=plan.get("profile"), calibration=plan.get("calibration"),
                      open_loop=loop)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a plan edited or cut short
        raise ConfigError(
            f"error: {run_dir.run_json} has a damaged ab plan ({type(exc).__name__}: {exc}) ({flag}); "
            f"rerun from scratch"
        ) from None



@dataclass(frozen=True)
class AbRequest:
    """What `tts-bench ab` was asked for; None means "the config's value" (or the default)."""

    config: Path | None = None  # None: the shipped configs/ab/default.yaml
    tiers: str | None = None
    num_prompts: int | None = None
    repeats: int | None = None
    sets: Sequence[str] = ()
    base_sets: Sequence[str] = ()
    test_sets: Sequence[str] = ()
    result_dir: Path = Path("results/runs")
    resume: Path | None = None  # finish this run; every option above is ignored
    report: Path | None = None  # tables of this run's complete blocks, running nothing (tts_bench.ab.report)
    mem: bool = False
    until_resolved: bool = False
    max_repeats: int | None = None
    budget_min: float | None = None
    profile: str | None = None
    calibration: Path | None = None
    voice_cache: str | None = None  # hit | miss: the result over those requests only
    request_rate: float | None = None  # open loop (requests/s, Poisson or gamma); None: closed loop
    burstiness: float | None = None  # gamma shape of the gaps (1 = Poisson); only with request_rate


@dataclass(frozen=True)
class AbSession:
    """A finished `tts-bench ab`: the result to show (the voice-cache view when asked), the run
    directory, the memory hooks (with --mem) and, for a view, (filter, kept, measured) counts."""

    result: AbResult
    run_dir: RunDir
    mem: Any = None  # tts_bench.mem.hooks.MemoryHooks
    voice_cache: tuple[str, int, int] | None = None
    work: list[dict] = field(default_factory=list)  # stage work per phase (tts_bench.load.stage_work)
    measurement: dict[str, Any] = field(default_factory=dict)  # mode, windows (tts_bench.ab.measurement)


def run_session(request: AbRequest, *, progress: AbProgress | None = None) -> AbSession:
    """Plan (or reopen) the run, run the A/B, record status and result; see the module docstring."""
    check_voice_cache(request.voice_cache)
    if request.report is not None:
        if request.resume is not None:
            raise ConfigError("error: --report reads a run and --resume finishes one (ab); pass one of them")
        run = RunDir.open(request.report, flag="--report")
        report = report_blocks(run, plan_from_run(run, flag="--report"))
        return AbSession(report.result, run, work=report.work, measurement=report.measurement)
    if request.resume:
        run, plan = open_plan(request.resume)
        calibration = None  # loaded from the recorded path below, where a failure is recorded
    else:
        run, plan, calibration = new_plan(request)
    with run.finishing():  # any exit (error, Ctrl-C) leaves run.json failed / interrupted
        if request.resume and plan.calibration:
            calibration = load_calibration(plan.calibration)
        mem = _mem_hooks(plan, run) if request.mem else None
        work = StageWorkHooks(run)
        result = run_ab(plan.arms, plan.tiers, repeats=plan.repeats, num_prompts=plan.num_prompts,
                        run_dir=run, progress=progress, resume=request.resume is not None,
                        hooks=HookChain(mem, work), until=plan.until, calibration=calibration,
                        open_loop=plan.open_loop)
        measured = measurement_doc(run, result, next(iter(plan.arms.values())).bench, open_loop=plan.open_loop)
        run.update(status="complete" if result.valid else "invalid",
                   result={**result.to_dict(), "measurement": measured})
    if request.voice_cache is None:
        return AbSession(result, run, mem, work=work.entries, measurement=measured)
    view, kept, n = voice_cache_view(run, plan.arms, plan.tiers, request.voice_cache,
                                     calibration=calibration)
    return AbSession(view, run, mem, (request.voice_cache, kept, n), work=work.entries, measurement=measured)


def new_plan(request: AbRequest) -> tuple[RunDir, AbPlan, Calibration | None]:
    """Load both arms, fix the plan (options over the config's bench section), make the run;
    with the calibration the plan names (read once, here)."""
    profile = resolve_profile(request.profile)  # the rule of gate, calibrate and baseline
    arms = load_arms(request.config or shipped_config(DEFAULT_AB_CONFIG), request.sets, request.base_sets,
                     request.test_sets)
    base = next(iter(arms.values()))
    bench = base.bench
    prompts = load_prompts(base.prompts.meta)  # a bad meta.lst fails before the run exists
    check_bench_prompts(arms, prompts)  # a broken voice: exit 2 now, not exit 5 after the A/B
    # An explicit value is used as given (a 0 never falls back to the config: typer's min=1).
    num_prompts = bench.num_prompts if request.num_prompts is None else request.num_prompts
    tiers = parse_tiers(bench.tiers if request.tiers is None else request.tiers)
    _check_tier_prompts(bench, tiers, num_prompts)
    conditions = RunConditions.now()
    calibration = _calibration(request.calibration, arms, profile, num_prompts, tiers, conditions)
    repeats = bench.repeats if request.repeats is None else request.repeats
    _check_same_windows(arms)
    plan = AbPlan(arms, tiers, repeats, num_prompts, until=_until_rule(request, bench, repeats), profile=profile,
                  calibration=calibration.path if calibration else None, conditions=conditions.to_dict(),
                  open_loop=_open_loop(request))
    check_arms(arms, plan.tiers)  # before the run directory exists and before any stage starts
    odd = None if plan.until else odd_repeats_warning(repeats)  # --until-resolved runs whole pairs
    if odd:
        log.warning("%s", odd)
    others = sorted({c.backend for c in arms.values()} - {"embedded"}) if request.voice_cache else []
    if others:  # only the stage runner reports prompt-cache hits
        raise ConfigError(f"error: --voice-cache {request.voice_cache}: the {', '.join(others)} backend does not "
                          f"report voice-cache hits or misses; drop --voice-cache or use the embedded backend")
    run = RunDir.create(
        request.result_dir, "ab", command_line=python_argv(),
        configs={n: config_to_dict(c) for n, c in arms.items()},
        config_hashes={n: config_hash(c) for n, c in arms.items()}, extra={"ab": plan.to_dict()},
    )
    return run, plan, calibration


WINDOW_KEYS = ("duration_s", "ramp_s", "window_s", "stability_pct", "until_stable", "max_duration_s",
               "warmup_phase", "seed")


def _check_same_windows(arms: dict[str, BenchConfig]) -> None:
    """Both arms of a block measure the same window (and draw the same arrivals and seeds)."""
    (a, ca), (b, cb) = arms.items()
    for key in WINDOW_KEYS:
        if getattr(ca.bench, key) != getattr(cb.bench, key):
            raise ConfigError(f"error: bench.{key} differs between the arms ({a}: {getattr(ca.bench, key)}, "
                              f"{b}: {getattr(cb.bench, key)}) (--base-set / --test-set / arms:); a block compares "
                              f"like with like: set it for both arms")


def _open_loop(request: AbRequest) -> OpenLoop | None:
    if request.request_rate is None:
        if request.burstiness is not None:
            raise ConfigError("error: --burstiness only applies with --request-rate (tts-bench ab); add "
                              "--request-rate or drop --burstiness")
        return None
    try:
        return OpenLoop(request.request_rate, 1.0 if request.burstiness is None else request.burstiness)
    except ValueError as exc:
        raise ConfigError(f"error: {exc} (--request-rate / --burstiness); fix the value") from None


def _check_tier_prompts(bench, tiers: tuple[Tier, ...], num_prompts: int) -> None:
    """The per-tier limit on measured prompts, for the tiers that run (`--tiers` replaces the
    config's, which the loader checked) with K from --prompts-per-client or bench.*."""
    try:
        bench.check_tier_prompts(tiers, num_prompts)
    except ValueError as exc:
        raise ConfigError(f"error: {exc} (--tiers, --prompts-per-client or --set bench.prompts_per_client); "
                          "lower the prompts per client or the tier's concurrency") from None


def _until_rule(request: AbRequest, bench, repeats: int) -> UntilResolved | None:
    """--until-resolved [--max-repeats K] [--budget MIN] as a rule (None without the flag);
    `repeats` (--repeats, else bench.repeats) must fit under the cap, or the first round would
    be cut to it without a word."""
    if not request.until_resolved:
        if request.max_repeats is not None or request.budget_min is not None:
            raise ConfigError("error: --max-repeats and --budget only apply with --until-resolved (tts-bench ab); "
                              "add --until-resolved or drop them")
        return None
    try:
        max_repeats = DEFAULT_MAX_REPEATS if request.max_repeats is None else request.max_repeats  # 0 is refused
        rule = UntilResolved(bench.min_effect_pct / 2.0, max_repeats, request.budget_min,
                             min_repeats=bench.until_resolved_min_repeats)
    except ValueError as exc:
        raise ConfigError(f"error: {exc} (--until-resolved); fix the value") from None
    if repeats > max_repeats:
        given = "--repeats" if request.repeats is not None else "bench.repeats"
        raise ConfigError(f"error: {given} {repeats} is above --max-repeats {max_repeats} (tts-bench ab "
                          "--until-resolved); the first round would be cut to the cap: lower it or raise "
                          "--max-repeats")
    return rule


def _calibration(given: Path | None, arms: dict[str, BenchConfig], profile: str,
                 num_prompts: int, tiers: tuple[Tier, ...], conditions: RunConditions | None = None) -> Calibration | None:
    """--calibration, else the calibration in results/baselines whose key matches an arm.

    A file given explicitly must pass the same test the lookup applies (`Calibration.mismatch`)
    and cover every tier: another config's or machine's spread would give a confident verdict
    for noise it never measured, and a tier it lacks would quietly stay unresolved."""
    configs = [config_to_dict(c) for c in arms.values()]
    if given is None:
        return find_calibration(configs, profile=profile, num_prompts=num_prompts, conditions=conditions)
    cal = load_calibration(given)
    why = cal.mismatch(configs, profile=profile, num_prompts=num_prompts, conditions=conditions)
    missing = [t.label for t in tiers if t.label not in cal.tiers]
    if why is None and missing:
        why = f"it has no entry for tier {', '.join(missing)} (it covers {', '.join(cal.tiers) or 'none'})"
    if why is not None:
        raise ConfigError(
            f"error: calibration {given} does not apply to this run: {why} (--calibration); pass a "
            f"calibration recorded for this config, profile, prompt count, tiers and machine load "
            f"(tts-bench calibrate), or drop --calibration"
        )
    return cal


def open_plan(path: Path) -> tuple[RunDir, AbPlan]:
    """Reopen a recorded A/B; its run.json fixes the arms and the plan."""
    run = RunDir.open(path, lock=True)  # a second writer of the same run exits 2 here
    try:
        plan = plan_from_run(run)
        check_arms(plan.arms, plan.tiers)
    except BaseException:
        run.release()
        raise
    run.update(status="running", error=None)
    return run, plan


def _mem_hooks(plan: AbPlan, run: RunDir) -> Any:
    # The memory sampler (tts_bench.mem) provides the hooks; see tts_bench.load.phases for the protocol.
    return make_ab_hooks(next(iter(plan.arms.values())), run)
