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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from tts_bench.commands._common import check_format
from tts_bench.errors import ConfigError, ExitStatus


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
    result_dir: Path = typer.Option(Path("results/runs"), "--result-dir", help="Where --run-case makes its run directory."),
) -> ExitStatus:
    """Gate a run against a baseline: per metric Δ%, threshold, Mann-Whitney p, mark."""
    from tts_bench.gate.judge import judge
    from tts_bench.gate.samples import read_run

    fmt = check_format(fmt)
    if (run_case is None) == (current is None):
        raise ConfigError("error: give exactly one of --run-case and --current (tts-bench gate); "
                          "e.g. --run-case configs/cases/synthetic.yaml")
    target = _target(run_case=run_case, current=current, baseline=baseline, case=case, profile=profile,
                     sets=sets, result_dir=result_dir)
    c = target.case
    report = judge(target.baseline_doc, read_run(target.current, arm=arm, profile=target.profile),
                   c.thresholds, alpha=c.alpha, min_samples=c.min_samples, wer_doc=_wer_doc(wer_run),
                   calibration=_calibration(target))
    doc = {**report.to_dict(report_only=report_only), "baseline_file": str(target.baseline_path)}
    if run_case is not None:  # the run keeps its own verdict
        from tts_bench.results import RunDir

        RunDir.open(target.current).update(gate=doc)
    sys.stdout.write(render_report(report, fmt, report_only=report_only, baseline=str(target.baseline_path)))
    for reason in report.invalid_reasons:
        typer.echo(f"error: invalid run: {reason}", err=True)
    if report_only and report.regressions:
        typer.echo(f"warning: {len(report.regressions)} perf regression(s) reported only (--report-only)", err=True)
    return report.exit_status(report_only=report_only)


@dataclass(frozen=True)
class _Target:
    """What to gate: the run, its case (thresholds), the baseline and the hardware profile."""

    current: Path
    case: Any  # tts_bench.gate.case.Case
    baseline_path: Path
    baseline_doc: dict
    profile: str


def _target(*, run_case, current, baseline, case, profile, sets, result_dir) -> _Target:
    """--run-case: load the baseline first (a missing one fails before the run), then run.
    --current: the case from --case, else the run's recorded case, else the baseline's."""
    from tts_bench.gate import case as cases
    from tts_bench.gate.baseline import load_baseline

    profile = profile or cases.default_profile()
    if run_case is not None:
        loaded = cases.load_case(run_case)
        base_path = baseline or cases.baseline_path(loaded.case, profile)
        base_doc = load_baseline(base_path)
        return _Target(_run(loaded, sets, profile, result_dir), loaded.case, base_path, base_doc, profile)
    loaded = _case_for(case, current)
    recorded = (loaded.case.name if loaded else None) or _recorded(current).get("name") or "adhoc"
    base_path = baseline or cases.baseline_path(cases.Case(name=recorded, config="-"), profile)
    base_doc = load_baseline(base_path)
    if loaded is None and Path(base_doc.get("case_file") or "-").is_file():
        loaded = cases.load_case(base_doc["case_file"])  # the case the baseline was built for
    if loaded is None:
        typer.echo("warning: no case file (--case); using default thresholds", err=True)
    return _Target(Path(current), loaded.case if loaded else cases.Case(name=recorded, config="-"),
                   base_path, base_doc, profile)


def _calibration(target: _Target):
    """The case's A/A calibration next to the baseline, when it was made with the baseline's
    config (the same `sut_hash` as the baseline)."""
    from tts_bench.calibration import calibration_path, load_calibration

    path = calibration_path(target.case.name, target.profile, target.baseline_path.parent)
    if not path.is_file():
        return None
    try:
        cal = load_calibration(path)
    except ConfigError as exc:  # an older format: the gate still runs, on the U test alone
        typer.echo(f"warning: {exc}; gating without it", err=True)
        return None
    if cal.doc.get("sut_hash") != target.baseline_doc.get("sut_hash"):
        typer.echo(f"warning: {path} was recorded for another config of the case; not used", err=True)
        return None
    return cal


def _recorded(current: Path) -> dict:
    """The `case` section of a run's run.json ({} for runs not made by --run-case)."""
    try:
        return json.loads((Path(current) / "run.json").read_text()).get("case") or {}
    except (OSError, ValueError):
        return {}


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
    recorded = _recorded(current).get("file")
    if recorded and Path(recorded).is_file():
        return load_case(recorded)
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
