"""`tts-bench gate`: judge a run against a committed baseline; CI reads the exit code.

    tts-bench gate --run-case configs/cases/tiny-embedded.yaml --profile cpu-2core
    tts-bench gate --run-case configs/cases/synthetic.yaml --set synthetic.delay_scale=1.2   # exits 3
    tts-bench gate --baseline results/baselines/synthetic.cpu-2core.json --current results/runs/<run>
    tts-bench gate --run-case configs/cases/tiny-embedded.yaml --report-only    # CI on noisy CPUs

Exit 0 pass, 3 perf regression (some metric `worse`; 0 with --report-only), 4 accuracy
regression (--wer-run), 5 invalid run (failed/missing requests, provenance mismatch), 1 error.
Marks and thresholds: `tts_bench.gate.judge`. Table on stdout (`--format md|table|csv|json`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.errors import ConfigError, ExitStatus

FORMATS = ("md", "table", "csv", "json")


def gate(
    run_case: Optional[Path] = typer.Option(None, "--run-case", help="Run this case file's bench, then gate it."),
    current: Optional[Path] = typer.Option(None, "--current", help="Gate this recorded run directory."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="Baseline JSON [default: results/baselines/<case>.<profile>.json]."),
    case: Optional[Path] = typer.Option(None, "--case", help="Case file for thresholds with --current [default: the one the run recorded]."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile, e.g. cpu-2core, h200 [default: cpu-<N>core]."),
    arm: Optional[str] = typer.Option(None, "--arm", help="Arm of an `ab` run to gate [default: its test arm]."),
    sets: list[str] = typer.Option([], "--set", help="Extra override on top of the case (recorded, reported): dotted.key=value."),
    wer_run: Optional[Path] = typer.Option(None, "--wer-run", help="A `tts-bench wer` run whose verdict is folded in (exit 4)."),
    report_only: bool = typer.Option(False, "--report-only", "--no-fail-on-perf", help="Report perf verdicts, exit 0 on them (still 4/5)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json [default: table on a TTY, else md]."),
    result_dir: Path = typer.Option(Path("results/runs"), "--result-dir", help="Where --run-case makes its run directory."),
) -> ExitStatus:
    """Gate a run against a baseline: per metric Δ%, threshold, Mann-Whitney p, mark."""
    from tts_bench.gate import case as cases
    from tts_bench.gate.baseline import load_baseline
    from tts_bench.gate.judge import judge
    from tts_bench.gate.samples import read_run

    fmt = _check_format(fmt)
    if (run_case is None) == (current is None):
        raise ConfigError("error: give exactly one of --run-case and --current (tts-bench gate); "
                          "e.g. --run-case configs/cases/synthetic.yaml")
    profile = profile or cases.default_profile()
    if run_case is not None:
        loaded = cases.load_case(run_case)
        base_path = baseline or cases.baseline_path(loaded.case, profile)
        base_doc = load_baseline(base_path)  # before the run: a missing baseline fails fast
        current = _run(loaded, sets, profile, result_dir)
    else:
        loaded = _case_for(case, current)
    cur = read_run(current, arm=arm, profile=profile)
    case_cfg = loaded.case if loaded else cases.Case(name=cur.provenance.case or "adhoc", config="-")
    if run_case is None:
        base_path = baseline or cases.baseline_path(case_cfg, profile)
        base_doc = load_baseline(base_path)
    report = judge(base_doc, cur, case_cfg.thresholds, alpha=case_cfg.alpha,
                   min_samples=case_cfg.min_samples, wer_doc=_wer_doc(wer_run))
    sys.stdout.write(render_report(report, fmt, report_only=report_only, baseline=str(base_path)))
    status = report.exit_status(report_only=report_only)
    for reason in report.invalid_reasons:
        typer.echo(f"error: invalid run: {reason}", err=True)
    if report_only and report.regressions:
        typer.echo(f"warning: {len(report.regressions)} perf regression(s) reported only (--report-only)", err=True)
    return status


def _check_format(fmt: str | None) -> str:
    from tts_bench.tables import default_format

    if fmt is None:
        return default_format(sys.stdout)
    if fmt not in FORMATS:
        raise ConfigError(f"error: unknown format {fmt!r} (--format); valid: {', '.join(FORMATS)}")
    return fmt


def _run(loaded, sets, profile: str, result_dir: Path) -> Path:
    from tts_bench.gate.bench import run_case
    from tts_bench.gate.case import resolve_case

    run = run_case(resolve_case(loaded, sets), profile=profile, result_dir=result_dir)
    typer.echo(f"run: {run.path}", err=True)
    return run.path


def _case_for(case: Path | None, current: Path):
    """--case, else the case file the run recorded (if it still exists), else None (defaults)."""
    from tts_bench.gate.case import load_case

    if case is not None:
        return load_case(case)
    try:
        recorded = (json.loads((Path(current) / "run.json").read_text()).get("case") or {}).get("file")
    except (OSError, ValueError):
        recorded = None
    if recorded and Path(recorded).is_file():
        return load_case(recorded)
    typer.echo("warning: no case file (--case); using default thresholds", err=True)
    return None


def _wer_doc(path: Path | None) -> dict | None:
    if path is None:
        return None
    from tts_bench.results import RunDir

    doc = RunDir.open(path).doc.get("wer")
    if not doc:
        raise ConfigError(f"error: {path} holds no WER result (--wer-run); pass a finished tts-bench wer run")
    return doc


def render_report(report, fmt: str, *, report_only: bool, baseline: str) -> str:
    from tts_bench.gate.judge import gate_table
    from tts_bench.tables import render

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
