"""`tts-bench ab`: same-day A/B of audio RTF per tier, with a verdict you can paste into a PR.

    tts-bench ab                                          # configs/ab/default.yaml
    tts-bench ab --config configs/ab/fused-prelude.yaml --tiers 32x1,64x4,128x8 --repeats 3
    tts-bench ab --config configs/ab/synthetic.yaml --test-set synthetic.delay_scale=1.2
    tts-bench ab --resume results/runs/20261129-194500-ab-3fa9c1
    tts-bench ab --report results/runs/20261129-194500-ab-3fa9c1   # a cut run's complete blocks
    tts-bench ab --config configs/ab/synthetic.yaml --until-resolved --max-repeats 8 --budget 10
    tts-bench ab --tiers 64x4 --repeats 3 --duration 60 --set bench.ramp_s=10    # steady windows
    tts-bench ab --tiers 128x8 --duration 60 --request-rate 12                   # open loop

The table goes to stdout (`--format md|table|csv|json`); progress and logs to stderr. Exit 0, or
5 when too many requests failed (bench.max_failure_fraction) and the comparison is not to be
trusted. The library call behind it is `tts_bench.ab.run_session` (planning, the run through
`tts_bench.ab.run_ab`, the record). A calibration of the config on this hardware profile
(`tts-bench calibrate`, results/baselines/*.calibration.json) is found by its key, checked against
the machine's load now, and used for one-repeat intervals and the calibrated MDE note. Under the
tables: how the verdicts were adjusted (Holm over the run's family), rough MDEs, metrics too
coarse to resolve, and what stopped --until-resolved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format, flag_sets, result_dir_option
from tts_bench.errors import ExitStatus
from tts_bench.config.limits import MAX_PROMPTS, MAX_REPEATS


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
    result_dir: str = typer.Option("results/runs", "--result-dir", callback=result_dir_option, help="Where run directories are made."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Finish a killed run (its directory); other options are ignored."),
    report: Optional[Path] = typer.Option(None, "--report", help="Tables of a recorded run's complete blocks (a cut run's too), running nothing; the run is left as it was."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
    mem: bool = typer.Option(False, "--mem", help="Sample device memory during every tier (tts-bench mem)."),
    until_resolved: bool = typer.Option(False, "--until-resolved", help="Add counterbalanced repeat pairs until every tier's 95% CI half-width is under bench.min_effect_pct / 2."),
    max_repeats: Optional[int] = typer.Option(None, "--max-repeats", help="With --until-resolved: at most this many repeats per tier (default 10)."),
    budget: Optional[float] = typer.Option(None, "--budget", help="With --until-resolved: minutes; no round starts that would end past it."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile whose calibration to use (default: cpu-<N>core)."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Calibration file (default: the matching results/baselines/*.<profile>.calibration.json)."),
    voice_cache: Optional[str] = typer.Option(None, "--voice-cache", help="Tables over the requests whose voice was a prompt-cache hit or miss only (the run record keeps all)."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Duration mode: a measured window of S seconds per phase after the ramp (bench.duration_s); default: count mode."),
    until_stable: bool = typer.Option(False, "--until-stable", help="Duration mode: extend an unstable window by sub-windows up to bench.max_duration_s."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", help="Open loop: requests/s (Poisson; the same arrival times in both arms); the tier's C caps requests in flight."),
    burstiness: Optional[float] = typer.Option(None, "--burstiness", help="With --request-rate: gamma shape of the gaps (1 = Poisson, < 1 burstier)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Also write JUnit XML here: one test case per tier x metric (tts_bench.report.ci)."),
    fail_on_slower: bool = typer.Option(False, "--fail-on-slower", help="A `slower` verdict is a JUnit failure and exits 3 (default: ab reports, exit 0)."),
    plot: bool = typer.Option(False, "--plot", help="Draw the run's plots and report.html into its run directory (tts-bench plot)."),
) -> ExitStatus:
    """A/B two arms of a config, interleaved per tier, with paired-block CIs, MDEs and verdicts."""
    from tts_bench.ab import AbRequest, run_session

    fmt = check_format(fmt)
    flags = flag_sets([("bench.disable_shuffle", disable_shuffle or None, "--disable-shuffle"),
                       ("bench.prompts_per_client", per_client, "--prompts-per-client"),
                       ("bench.duration_s", duration, "--duration"),
                       ("bench.until_stable", until_stable or None, "--until-stable")])
    request = AbRequest(
        config=config, tiers=tiers, num_prompts=num_prompts, repeats=repeats, sets=[*sets, *flags],
        base_sets=base_sets, test_sets=test_sets, result_dir=result_dir, resume=resume, report=report, mem=mem,
        until_resolved=until_resolved, max_repeats=max_repeats, budget_min=budget, profile=profile,
        calibration=calibration, voice_cache=voice_cache, request_rate=request_rate, burstiness=burstiness,
    )
    from tts_bench.report.progress import current, reporting

    with reporting("ab"):
        session = run_session(request, progress=current())
    if session.voice_cache is not None:  # a view: the run record keeps every request
        which, kept, measured = session.voice_cache
        typer.echo(f"voice cache {which}: {kept} of {measured} measured requests", err=True)
    sys.stdout.write(render_result(session.result, fmt, mem=session.mem, work=session.work,
                                   measurement=session.measurement))
    for reason in session.result.invalid_reasons:
        typer.echo(f"error: invalid run: {reason}", err=True)
    return _ci_outputs(session, junit=junit, fail_on_slower=fail_on_slower, plot=plot)


def _ci_outputs(session, *, junit: Path | None, fail_on_slower: bool, plot: bool) -> ExitStatus:
    """--junit, GITHUB_STEP_SUMMARY, --plot; exit 3 for a slower verdict with --fail-on-slower."""
    from tts_bench.report.ci import ab_suite, publish

    suite = ab_suite(session.result.to_dict(), fail_on_slower=fail_on_slower)
    publish(suite, render_result(session.result, "md", mem=session.mem, work=session.work,
                                 measurement=session.measurement), junit=junit)
    if plot:
        from tts_bench.report.plots import plot_run

        typer.echo(f"report: {plot_run(session.run_dir.path).html}", err=True)
    status = session.result.exit_status
    return ExitStatus.PERF_REGRESSION if status == ExitStatus.OK and suite.count("failure") else status


# Why one repeat is not a verdict: one-repeat A/Bs read effects that two repeats did not (D-AB-1).
SINGLE_REPEAT_NOTE = (
    "note: 1 repeat: one block has no run-to-run spread to build an interval from, so the verdict "
    "is unresolved; rerun with --repeats 2 or more (order A B, B A) or --until-resolved, or record "
    "a calibration of this case and machine (tts-bench calibrate)"
)


def render_result(result, fmt: str, *, mem=None, work=None, measurement=None) -> str:
    """The A/B result as text: RTF table (+ TTFP table, output-identity line, the mode line and
    window table, with --mem one memory table per tier and sampler, and with the embedded
    runner the stage-work table) or one JSON doc."""
    from tts_bench.ab.measurement import mode_line, window_table
    from tts_bench.report.tables import ab_table, render

    doc = result.to_dict()
    if measurement:
        doc["measurement"] = measurement
    if mem is not None:
        doc["mem"] = mem.summary()
    if work:
        doc["stage_work"] = work
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    base, test = result.arm_names
    rtf = ab_table(doc["tiers"], base_label=base, test_label=test)
    if fmt == "csv":
        return render(rtf, "csv")
    mode = f", {measurement['mode']} mode" if measurement else ""
    ttfp = ab_table(result.ttfp_rows(), metric="audio_ttfp_ms", digits=1, base_label=base, test_label=test)
    thr = ab_table(result.throughput_rows(), metric="audio_throughput", digits=2, base_label=base, test_label=test)
    identity = ", ".join(_identity_text(t) for t in doc["tiers"])
    text = (render(rtf, fmt, title=f"audio RTF (lower is faster{mode})") + "\n"
            + render(ttfp, fmt, title=f"audio TTFP ms ({mode.lstrip(', ')})" if mode else "audio TTFP ms") + "\n"
            + render(thr, fmt, title=f"audio throughput, audio s per wall s per block (higher is faster{mode})") + "\n"
            + f"identical outputs ({test} vs {base}): {identity}\n")
    if measurement:
        text += (render(window_table(measurement), fmt, title=f"per block ({measurement['mode']} mode)") + "\n"
                 + mode_line(measurement) + "\n")
    text += "".join(line + "\n" for line in notes(result, doc))
    if mem is not None:
        from tts_bench.mem.summary import mem_table, table_title

        text += "".join(render(mem_table(s), fmt, title=table_title(s)) + "\n" for s in mem.summaries())
    if work:
        from tts_bench.load.stage_work import WORK_TITLE, work_table

        text += render(work_table(work), fmt, title=WORK_TITLE) + "\n"
    return text + f"run: {doc['run_dir']}\n"


def notes(result, doc: dict) -> list[str]:
    """Lines under the tables: how the intervals were made and what stopped --until-resolved."""
    from tts_bench.report.tables import fmt_pct

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
    rough = sorted({t.tier for t in result.tiers for c in (t.rtf, t.ttfp, t.throughput)
                    if c is not None and c.mde_rough})
    if rough:
        out.append(f"note: MDE marked ~ ({', '.join(rough)}) comes from 2 blocks, one degree of freedom: "
                   "its own spread is noise; plan by an MDE from 3 or more repeats or a calibration")
    for t in result.tiers:
        for name, c in (("RTF", t.rtf), ("TTFP", t.ttfp), ("throughput", t.throughput)):
            if c is not None and c.verdict == "unresolved (metric resolution)" and c.resolution is not None:
                r = c.resolution
                out.append(f"note: {t.tier} {name} unresolved (metric resolution): {r.values} values on "
                           f"{r.levels} levels" + (f", a block mean moves in ~{r.block_step_pct:.1f}% steps"
                                                  if r.block_step_pct is not None else "")
                           + "; blocks agree by chance: use a finer clock or more requests per block")
    family = doc.get("multiple_comparisons")
    if family and family["family_size"] > 1:
        demoted = sum(c is not None and c.holm_demoted for t in result.tiers for c in (t.rtf, t.ttfp, t.throughput))
        out.append(f"verdicts: Holm-adjusted over {family['family_size']} comparisons (tiers x RTF / TTFP / "
                   f"throughput), family-wise alpha {family['alpha']:g}"
                   + (f"; {demoted} significant alone read within noise" if demoted else ""))
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
    stages = [f"{name} {tier[key]}/{tier['paired_outputs']}"
              for name, key in (("codes", "identical_codes"), ("mel", "identical_mel")) if tier.get(key) is not None]
    return text + (f" ({', '.join(stages)})" if stages else "")
