"""`tts-bench calibrate`: A/A runs of a case, recorded next to its baseline for `ab` and `gate`.

    tts-bench calibrate synthetic --runs 200                     # configs/cases/synthetic.yaml
    tts-bench calibrate configs/cases/tiny-embedded.yaml --runs 40 --profile cpu-2core
    tts-bench calibrate synthetic --runs 2 --no-write --fail-on-false-verdict   # the CI check

Writes `results/baselines/<case>.<profile>.calibration.json` and `.md` (`--out DIR`; not with
`--no-write`) and prints the markdown on stdout; one line per A/A on stderr. Exit 0; 3 with
`--fail-on-false-verdict` when some A/A read faster/slower (`--test-set` perturbs the test arm,
to see the check fail); 5 when no A/A was valid; 2, before the first A/A, for what `ab` would
refuse (a per-arm bench.* in `--test-set`, a tier listed twice, prompts or stages that cannot
run), a `--profile` that is no file name, or an `--out` that cannot be written. The library call
behind it is `tts_bench.gate.calibrate.calibrate_case`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import result_dir_option
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.config.limits import MAX_CALIBRATION_RUNS, MAX_REPEATS

def calibrate(
    case: str = typer.Argument(..., help="A case file, or a case name under configs/cases/."),
    runs: int = typer.Option(..., "--runs", min=1, max=MAX_CALIBRATION_RUNS, help="A/A runs (the shipped figures: synthetic >= 200, tiny-embedded >= 40)."),
    repeats: int = typer.Option(2, "--repeats", min=1, max=MAX_REPEATS, help="Blocks (repeats) per A/A, counterbalanced."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile (default: cpu-<N>core)."),
    sets: list[str] = typer.Option([], "--set", help="Override on top of the case, both arms (recorded): dotted.key=value."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Perturb the test arm only (the A/A is then an A/B: checks the check)."),
    out: Path = typer.Option(Path("results/baselines"), "--out", help="Where the calibration files go."),
    no_write: bool = typer.Option(False, "--no-write", help="Print only; leave the calibration files alone."),
    fail_on_false_verdict: bool = typer.Option(False, "--fail-on-false-verdict", help="Exit 3 when some A/A reads faster/slower (CI)."),
    result_dir: Optional[str] = typer.Option(None, "--result-dir", callback=result_dir_option, help="Keep the A/A run directories here (default: a temporary directory)."),
    fmt: str = typer.Option("md", "--format", help="md | json (the whole document)."),
) -> ExitStatus:
    """Run A/As of a case: false-verdict rate (Clopper-Pearson) and run-to-run variance."""
    from tts_bench.gate.calibrate import calibrate_case

    if fmt not in ("md", "json"):
        raise ConfigError(f"error: unknown format {fmt!r} (--format); valid: md, json")
    if runs < 1 or repeats < 1:
        raise ConfigError(f"error: --runs and --repeats must be >= 1, got {runs} and {repeats} (tts-bench calibrate)")
    from tts_bench.report.progress import reporting

    with reporting("calibrate"):
        done = calibrate_case(case, runs=runs, repeats=repeats, profile=profile, sets=sets, test_sets=test_sets,
                              out=out, write=not no_write, result_dir=result_dir,
                              on_run=lambda i, row: typer.echo(_row_line(i, runs, row), err=True))
    if done.written is not None:
        typer.echo(f"wrote {done.written}", err=True)
    sys.stdout.write(json.dumps(done.doc, indent=2) + "\n" if fmt == "json" else done.markdown)
    status = done.exit_status(fail_on_false_verdict=fail_on_false_verdict)
    if status == ExitStatus.PERF_REGRESSION:
        fv = done.doc["false_verdicts"]
        typer.echo(f"error: {fv['count']} of {fv['of']} A/A runs read faster/slower (--fail-on-false-verdict)", err=True)
    return status


def _row_line(i: int, runs: int, row: dict) -> str:
    from tts_bench.report.tables import fmt_ci, fmt_pct

    tiers = "; ".join(f"{t} {fmt_pct(d['delta_pct'])} {fmt_ci(d['ci95_pct'])} {d['verdict']}"
                      for t, d in row["tiers"].items())
    load = row["load_before"][0] if row["load_before"] else "n/a"
    return f"A/A {i + 1}/{runs}: {tiers} ({row['wall_s']:.1f} s, load {load})"
