"""`tts-bench gate`: judge a run against a committed baseline; CI reads the exit code.

    tts-bench gate --run-case configs/cases/tiny-embedded.yaml --profile cpu-2core
    tts-bench gate --run-case configs/cases/synthetic.yaml --set synthetic.delay_scale=1.2   # exits 3
    tts-bench gate --baseline results/baselines/synthetic.cpu-2core.json --current results/runs/<run>
    tts-bench gate --run-case configs/cases/tiny-embedded.yaml --report-only    # CI on noisy CPUs

Exit 0 pass, 3 perf regression (some metric `worse`; 0 with --report-only), 4 accuracy
regression (--wer-run), 5 invalid run (failed/missing requests, provenance mismatch), 1 error.
`--case` and `--arm` go with `--current`, `--set` and `--result-dir` with `--run-case`: the other
way round exits 2 rather than being ignored; everything `--run-case` can check (baseline, tiers,
`--wer-run`, memory and prompt preflight) is checked before its bench runs, and `--current`
judges only a complete run (else 5). Marks and thresholds: `tts_bench.gate.judge`. Table on
stdout (`--format md|table|csv|json`). The library call behind it is
`tts_bench.gate.session.run_session`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format, result_dir_option
from tts_bench.errors import ExitStatus


def gate(
    run_case: Optional[Path] = typer.Option(None, "--run-case", help="Run this case file's bench, then gate it."),
    current: Optional[Path] = typer.Option(None, "--current", help="Gate this recorded run directory."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="Baseline JSON (default: results/baselines/<case>.<profile>.json)."),
    case: Optional[Path] = typer.Option(None, "--case", help="Case file for thresholds with --current (default: the one the run recorded)."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile, e.g. cpu-2core, h200 (default: cpu-<N>core)."),
    arm: Optional[str] = typer.Option(None, "--arm", help="Arm of an `ab` run to gate (default: its test arm)."),
    sets: list[str] = typer.Option([], "--set", help="Extra override on top of the case (recorded, reported): dotted.key=value."),
    wer_run: Optional[Path] = typer.Option(None, "--wer-run", help="A `tts-bench wer` run whose verdict is folded in (exit 4)."),
    report_only: bool = typer.Option(False, "--report-only", "--no-fail-on-perf", help="Report perf verdicts, exit 0 on them (still 4/5)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
    result_dir: Optional[str] = typer.Option(None, "--result-dir", callback=result_dir_option, help="Where --run-case makes its run directory (default: results/runs)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Also write JUnit XML here: one test case per tier x metric, failures = worse rows (tts_bench.report.ci)."),
    plot: bool = typer.Option(False, "--plot", help="Draw the gated run's plots and report.html into its run directory (tts-bench plot)."),
) -> ExitStatus:
    """Gate a run against a baseline: per metric Δ%, threshold, Mann-Whitney p, mark."""
    from tts_bench.gate.session import GateRequest, run_session

    fmt = check_format(fmt)
    request = GateRequest(run_case=run_case, current=current, baseline=baseline, case=case, profile=profile,
                          arm=arm, sets=sets, wer_run=wer_run, report_only=report_only, result_dir=result_dir)
    from tts_bench.report.progress import reporting

    with reporting("gate"):
        session = run_session(request, notify=lambda line: typer.echo(line, err=True))
    report = session.report
    sys.stdout.write(render_report(report, fmt, report_only=report_only, baseline=str(session.baseline_path)))
    for reason in report.invalid_reasons:
        typer.echo(f"error: invalid run: {reason}", err=True)
    if report_only and report.regressions:
        typer.echo(f"warning: {len(report.regressions)} perf regression(s) reported only (--report-only)", err=True)
    _ci_outputs(report, junit=junit, plot=plot, report_only=report_only, baseline=str(session.baseline_path))
    return report.exit_status(report_only=report_only)


def _ci_outputs(report, *, junit: Path | None, plot: bool, report_only: bool, baseline: str) -> None:
    """--junit, GITHUB_STEP_SUMMARY (the md report, only when set), --plot of the gated run."""
    from tts_bench.report.ci import gate_suite, publish

    publish(gate_suite(report.to_dict(report_only=report_only)),
            render_report(report, "md", report_only=report_only, baseline=baseline), junit=junit)
    if plot and report.current:
        from tts_bench.report.plots import plot_run

        typer.echo(f"report: {plot_run(Path(report.current)).html}", err=True)


def render_report(report, fmt: str, *, report_only: bool, baseline: str) -> str:
    from tts_bench.gate.judge import gate_table
    from tts_bench.report.tables import render

    if fmt == "json":
        return json.dumps({**report.to_dict(report_only=report_only), "baseline_file": baseline}, indent=2) + "\n"
    text = render(gate_table(report), fmt, title=None if fmt == "csv" else "perf gate")
    if fmt == "csv":
        return text
    lines = [f"verdict: {report.verdict()}" + (" (report only)" if report_only and report.regressions else "")]
    lines += [f"invalid: {r}" for r in report.invalid_reasons]
    lines += [f"accuracy: {r}" for r in report.accuracy_reasons]
    lines += [f"note: {n}" for n in report.notes]
    lines += [f"baseline: {baseline}", f"run: {report.current}"]
    return text + "\n" + "\n".join(lines) + "\n"
