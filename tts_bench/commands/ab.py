"""`tts-bench ab`: same-day A/B of audio RTF per tier, with a verdict you can paste into a PR.

    tts-bench ab                                          # configs/ab/default.yaml
    tts-bench ab --config configs/ab/fused-prelude.yaml --tiers 32x1,64x4,128x8 --repeats 3
    tts-bench ab --config configs/ab/synthetic.yaml --test-set synthetic.delay_scale=1.2
    tts-bench ab --resume results/runs/20261129-194500-ab-3fa9c1
    tts-bench ab --config configs/ab/synthetic.yaml --until-resolved --max-repeats 8 --budget 10

The table goes to stdout (`--format md|table|csv|json`); progress and logs to stderr. Exit 0, or
5 when too many requests failed (bench.max_failure_fraction) and the comparison is not to be
trusted. The library call behind it is `tts_bench.ab.run_ab`. A calibration of the config on this
hardware profile (`tts-bench calibrate`, results/baselines/*.calibration.json) is found by its
key and used for one-repeat intervals and the calibrated MDE note.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.limits import MAX_PROMPTS, MAX_REPEATS
from tts_bench.shipped import shipped_config

DEFAULT_CONFIG = "ab/default.yaml"  # shipped (tts_bench.shipped): the same from any folder


def ab(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="A/B config YAML (default: the shipped configs/ab/default.yaml)."),
    tiers: Optional[str] = typer.Option(None, "--tiers", help="Comma-separated CxR tiers, e.g. 32x1,64x4,128x8."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, max=MAX_PROMPTS, help="Measured requests per tier, arm and repeat."),
    per_client: Optional[int] = typer.Option(None, "--prompts-per-client", min=1, max=MAX_PROMPTS, help="Measured requests per tier = K x concurrency (overrides --num-prompts per tier)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, max=MAX_REPEATS, help="Interleaved repeats per arm, counterbalanced (A B, B A, ...)."),
    sets: list[str] = typer.Option([], "--set", help="Override for both arms: dotted.key=value (repeatable)."),
    base_sets: list[str] = typer.Option([], "--base-set", help="Override for the base arm only (repeatable)."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Override for the test arm only (repeatable)."),
    disable_shuffle: bool = typer.Option(False, "--disable-shuffle", help="Send prompts in file order."),
    result_dir: Path = typer.Option(Path("results/runs"), "--result-dir", help="Where run directories are made."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Finish a killed run (its directory); other options are ignored."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
    mem: bool = typer.Option(False, "--mem", help="Sample device memory during every tier (tts-bench mem)."),
    until_resolved: bool = typer.Option(False, "--until-resolved", help="Add counterbalanced repeat pairs until every tier's 95% CI half-width is under bench.min_effect_pct / 2."),
    max_repeats: Optional[int] = typer.Option(None, "--max-repeats", help="With --until-resolved: at most this many repeats per tier (default 10)."),
    budget: Optional[float] = typer.Option(None, "--budget", help="With --until-resolved: minutes; no round starts that would end past it."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile whose calibration to use (default: cpu-<N>core)."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Calibration file (default: the matching results/baselines/*.<profile>.calibration.json)."),
    voice_cache: Optional[str] = typer.Option(None, "--voice-cache", help="Tables over the requests whose voice was a prompt-cache hit or miss only (the run record keeps all)."),
) -> ExitStatus:
    """A/B two arms of a config, interleaved per tier, with paired-block CIs, MDEs and verdicts."""
    from tts_bench import ab as lib

    fmt = check_format(fmt)
    if voice_cache not in (None, *lib.VOICE_CACHE):
        raise ConfigError(f"error: unknown voice cache filter {voice_cache!r} (--voice-cache); valid: hit, miss")
    shuffle_set = ["bench.disable_shuffle=true"] if disable_shuffle else []
    if per_client is not None:
        shuffle_set.append(f"bench.prompts_per_client={per_client}")
    until = dict(on=until_resolved, max_repeats=max_repeats, budget=budget)
    run, plan = _open_run(resume) if resume else _new_run(
        config, tiers=tiers, num_prompts=num_prompts, repeats=repeats, sets=[*sets, *shuffle_set],
        base_sets=base_sets, test_sets=test_sets, result_dir=result_dir, until=until, profile=profile,
        calibration=calibration)
    with run.finishing():  # any exit (error, Ctrl-C) leaves run.json failed / interrupted
        hooks = _mem_hooks(plan, run) if mem else None
        with _progress() as progress:
            result = lib.run_ab(plan.arms, plan.tiers, repeats=plan.repeats, num_prompts=plan.num_prompts,
                                run_dir=run, progress=progress, resume=resume is not None, hooks=hooks,
                                until=plan.until, calibration=_load_calibration(plan.calibration))
        run.update(status="complete" if result.valid else "invalid", result=result.to_dict())
    if voice_cache is not None:  # a view: the record above keeps every request
        view, kept, measured = lib.voice_cache_view(run, plan.arms, plan.tiers, voice_cache,
                                                    calibration=_load_calibration(plan.calibration))
        typer.echo(f"voice cache {voice_cache}: {kept} of {measured} measured requests", err=True)
        result = view
    sys.stdout.write(render_result(result, fmt, mem=hooks))
    for reason in result.invalid_reasons:
        typer.echo(f"error: invalid run: {reason}", err=True)
    return result.exit_status


def _new_run(config, *, tiers, num_prompts, repeats, sets, base_sets, test_sets, result_dir, until,
             profile, calibration):
    """Load both arms, fix the plan (CLI options over the config's bench section), make the run."""
    from tts_bench.ab import AbPlan
    from tts_bench.config import config_hash, config_to_dict, load_arms, parse_tiers
    from tts_bench.gate.case import default_profile
    from tts_bench.preflight import check_arms
    from tts_bench.prompts import load_prompts
    from tts_bench.results import RunDir, python_argv

    if config is None:
        config = shipped_config(DEFAULT_CONFIG)
    arms = load_arms(config, sets, base_sets, test_sets)
    bench = next(iter(arms.values())).bench
    load_prompts(next(iter(arms.values())).prompts.meta)  # a bad meta.lst fails before the run exists
    profile = profile or default_profile()
    # An explicit value is used as given (a 0 never falls back to the config: typer's min=1).
    num_prompts = bench.num_prompts if num_prompts is None else num_prompts
    plan = AbPlan(arms, parse_tiers(bench.tiers if tiers is None else tiers),
                  bench.repeats if repeats is None else repeats, num_prompts,
                  until=_until_rule(until, bench), profile=profile,
                  calibration=_calibration_path(calibration, arms, profile, num_prompts))
    check_arms(arms, plan.tiers)  # before the run directory exists and before any stage starts
    run = RunDir.create(
        result_dir, "ab", command_line=python_argv(),
        configs={n: config_to_dict(c) for n, c in arms.items()},
        config_hashes={n: config_hash(c) for n, c in arms.items()}, extra={"ab": plan.to_dict()},
    )
    return run, plan


def _until_rule(opts: dict, bench):
    """--until-resolved [--max-repeats K] [--budget MIN] as a rule (None without the flag)."""
    from tts_bench.errors import ConfigError
    from tts_bench.until_resolved import DEFAULT_MAX_REPEATS, UntilResolved

    if not opts["on"]:
        if opts["max_repeats"] is not None or opts["budget"] is not None:
            raise ConfigError("error: --max-repeats and --budget only apply with --until-resolved (tts-bench ab); "
                              "add --until-resolved or drop them")
        return None
    try:
        return UntilResolved(bench.min_effect_pct / 2.0, opts["max_repeats"] or DEFAULT_MAX_REPEATS, opts["budget"])
    except ValueError as exc:
        raise ConfigError(f"error: {exc} (--until-resolved); fix the value") from None


def _calibration_path(given: Path | None, arms: dict, profile: str, num_prompts: int) -> str | None:
    """--calibration, else the calibration in results/baselines whose key matches an arm."""
    from tts_bench.calibration import find_calibration, load_calibration
    from tts_bench.config import config_to_dict

    if given is not None:
        return load_calibration(given).path
    found = find_calibration([config_to_dict(c) for c in arms.values()], profile=profile,
                             num_prompts=num_prompts)
    return found.path if found else None


def _load_calibration(path: str | None):
    from tts_bench.calibration import load_calibration

    return load_calibration(path) if path else None


def _open_run(path: Path):
    """Reopen a recorded A/B; its run.json fixes the arms and the plan."""
    from tts_bench.ab import plan_from_run
    from tts_bench.preflight import check_arms
    from tts_bench.results import RunDir

    run = RunDir.open(path, lock=True)  # a second writer of the same run exits 2 here
    try:
        plan = plan_from_run(run)
        check_arms(plan.arms, plan.tiers)
    except BaseException:
        run.release()
        raise
    run.update(status="running", error=None)
    return run, plan


def _mem_hooks(plan, run):
    # The memory sampler (tts_bench.mem) provides the hooks; see tts_bench.ab for the protocol.
    from tts_bench.errors import ConfigError

    try:
        from tts_bench.mem.hooks import make_ab_hooks
    except ImportError:
        raise ConfigError("error: --mem is not available in this build (tts-bench ab); run without --mem") from None
    return make_ab_hooks(next(iter(plan.arms.values())), run)


# Measured: a fused-prelude A/B at 128x8 on an H200 read "slower, +8.9% [+4.4%, +13.7%]" with one
# repeat and "+0.2% [-4.2%, +5.0%], within noise" with two (results/h200/README.md).
SINGLE_REPEAT_NOTE = (
    "note: 1 repeat: one block has no run-to-run spread to build an interval from, so the verdict "
    "is unresolved; rerun with --repeats 2 or more (order A B, B A) or --until-resolved, or record "
    "a calibration of this case and machine (tts-bench calibrate)"
)


def render_result(result, fmt: str, *, mem=None) -> str:
    """The A/B result as text: RTF table (+ TTFP table, output-identity line and, with --mem,
    one memory table per tier and sampler) or one JSON doc."""
    from tts_bench.tables import ab_table, render

    doc = result.to_dict()
    if mem is not None:
        doc["mem"] = mem.summary()
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    base, test = result.arm_names
    rtf = ab_table(doc["tiers"], base_label=base, test_label=test)
    if fmt == "csv":
        return render(rtf, "csv")
    ttfp_rows = [{**t, **{k: (t["ttfp"] or {}).get(k) for k in ("delta_mean_pct", "ci95_pct", "verdict")},
                  "duration_mismatch": False, "note": ""} for t in doc["tiers"]]
    for row, tier in zip(ttfp_rows, doc["tiers"]):
        row["verdict_detail"] = (tier["ttfp"] or {}).get("verdict_detail")
        row["mde_pct"] = (tier["ttfp"] or {}).get("mde_pct")
        if tier["invalid_reasons"]:  # as for RTF: no speed verdict on a tier with failures
            row["verdict"] = row["verdict_detail"] = "invalid"
    ttfp = ab_table(ttfp_rows, metric="audio_ttfp_ms", digits=1, base_label=base, test_label=test)
    identity = ", ".join(_identity_text(t) for t in doc["tiers"])
    text = (render(rtf, fmt, title="audio RTF (lower is faster)") + "\n"
            + render(ttfp, fmt, title="audio TTFP ms") + "\n"
            + f"identical outputs ({test} vs {base}): {identity}\n")
    text += "".join(line + "\n" for line in notes(result, doc))
    if mem is not None:
        from tts_bench.mem.summary import mem_table, table_title

        text += "".join(render(mem_table(s), fmt, title=table_title(s)) + "\n" for s in mem.summaries())
    return text + f"run: {doc['run_dir']}\n"


def notes(result, doc: dict) -> list[str]:
    """Lines under the tables: how the intervals were made and what stopped --until-resolved."""
    from tts_bench.tables import fmt_pct

    out = []
    calibrated = [t for t in result.tiers if t.rtf is not None and t.rtf.interval == "calibrated"]
    cal = result.calibration
    if calibrated and cal is not None:
        out.append(f"note: 1 repeat: the intervals of {', '.join(t.tier for t in calibrated)} use the "
                   f"calibrated run-to-run SD of {cal.case} on {cal.profile} ({cal.path}, {cal.runs} A/As)")
    elif result.single_repeat:
        out.append(SINGLE_REPEAT_NOTE)
    if cal is not None:
        for tier in result.tiers:
            mdes = [(k, cal.mde_pct(tier.tier, blocks=k)) for k in (1, 2, 4, 8)]
            if mdes[0][1] is not None:
                out.append(f"calibration {cal.case}.{cal.profile} {tier.tier}: audio RTF MDE at 1/2/4/8 repeats "
                           + " / ".join(fmt_pct(m).lstrip("+") for _, m in mdes))
    ur = doc.get("until_resolved")
    if ur:
        reps = ", ".join(f"{t} {k}" for t, k in ur["repeats"].items())
        budget = f", budget {ur['budget_min']:g} min" if ur.get("budget_min") else ""
        out.append(f"until-resolved: stopped by {ur['stopped_by']} (target half-width < "
                   f"{ur['target_half_width_pct']:g}%, max repeats {ur['max_repeats']}{budget}); "
                   f"repeats {reps}; {ur['elapsed_s']:.0f} s")
    return out


def _identity_text(tier: dict) -> str:
    text = f"{tier['tier']}: {tier['identical_outputs']}/{tier['paired_outputs']}"
    if tier.get("identical_codes") is not None:
        text += f" (codes {tier['identical_codes']}/{tier['paired_outputs']})"
    return text


class _RichProgress:
    """One rich task per (tier, arm, repeat) on stderr; nothing when stderr is not a terminal."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import Progress

        self._progress = Progress(console=Console(stderr=True), transient=False)
        self._task = None

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def start(self, description: str, total: int) -> None:
        self._task = self._progress.add_task(description, total=total)

    def advance(self) -> None:
        self._progress.advance(self._task)


def _progress():
    import contextlib

    return _RichProgress() if sys.stderr.isatty() else contextlib.nullcontext(None)
