"""`tts-bench calibrate`: A/A runs of a case, recorded next to its baseline for `ab` and `gate`.

    tts-bench calibrate synthetic --runs 200                     # configs/cases/synthetic.yaml
    tts-bench calibrate configs/cases/tiny-embedded.yaml --runs 40 --profile cpu-2core
    tts-bench calibrate synthetic --runs 2 --no-write --fail-on-false-verdict   # the CI check

Writes `results/baselines/<case>.<profile>.calibration.json` and `.md` (`--out DIR`; not with
`--no-write`) and prints the markdown on stdout; one line per A/A on stderr. Exit 0; 3 with
`--fail-on-false-verdict` when some A/A read faster/slower (`--test-set` perturbs the test arm,
to see the check fail); 5 when no A/A was valid. The library is `tts_bench.gate.calibrate`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from tts_bench.errors import ConfigError, ExitStatus

CASES_DIR = Path("configs/cases")


def calibrate(
    case: str = typer.Argument(..., help="A case file, or a case name under configs/cases/."),
    runs: int = typer.Option(..., "--runs", help="A/A runs (the shipped figures: synthetic >= 200, tiny-embedded >= 40)."),
    repeats: int = typer.Option(2, "--repeats", help="Blocks (repeats) per A/A, counterbalanced."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile (default: cpu-<N>core)."),
    sets: list[str] = typer.Option([], "--set", help="Override on top of the case, both arms (recorded): dotted.key=value."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Perturb the test arm only (the A/A is then an A/B: checks the check)."),
    out: Path = typer.Option(Path("results/baselines"), "--out", help="Where the calibration files go."),
    no_write: bool = typer.Option(False, "--no-write", help="Print only; leave the calibration files alone."),
    fail_on_false_verdict: bool = typer.Option(False, "--fail-on-false-verdict", help="Exit 3 when some A/A reads faster/slower (CI)."),
    result_dir: Optional[Path] = typer.Option(None, "--result-dir", help="Keep the A/A run directories here (default: a temporary directory)."),
    fmt: str = typer.Option("md", "--format", help="md | json (the whole document)."),
) -> ExitStatus:
    """Run A/As of a case: false-verdict rate (Clopper-Pearson) and run-to-run variance."""
    from tts_bench.calibration import calibration_path, write_calibration
    from tts_bench.gate import calibrate as lib
    from tts_bench.gate.case import default_profile, load_case

    if fmt not in ("md", "json"):
        raise ConfigError(f"error: unknown format {fmt!r} (--format); valid: md, json")
    if runs < 1 or repeats < 1:
        raise ConfigError(f"error: --runs and --repeats must be >= 1, got {runs} and {repeats} (tts-bench calibrate)")
    loaded = load_case(_case_path(case))
    profile = profile or default_profile()
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        doc = lib.run_calibration(loaded, runs=runs, repeats=repeats, profile=profile,
                                  result_dir=result_dir or Path(tmp), sets=sets, test_sets=test_sets,
                                  on_run=lambda i, row: typer.echo(_row_line(i, runs, row), err=True))
    md = lib.to_markdown(doc)
    if not no_write:
        path = write_calibration(doc, calibration_path(doc["case"], profile, out))
        path.with_suffix(".md").write_text(md, encoding="utf-8")  # <case>.<profile>.calibration.md
        typer.echo(f"wrote {path}", err=True)
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if fmt == "json" else md)
    if fail_on_false_verdict and doc["false_verdicts"]["count"]:
        typer.echo(f"error: {doc['false_verdicts']['count']} of {doc['false_verdicts']['of']} A/A runs read "
                   f"faster/slower (--fail-on-false-verdict)", err=True)
        return ExitStatus.PERF_REGRESSION
    return ExitStatus.OK if doc["valid_runs"] == doc["runs"] else ExitStatus.INVALID_RUN


def _case_path(case: str) -> Path:
    path = Path(case)
    if path.is_file() or path.suffix in (".yaml", ".yml"):
        return path
    return CASES_DIR / f"{case}.yaml"


def _row_line(i: int, runs: int, row: dict) -> str:
    from tts_bench.tables import fmt_ci, fmt_pct

    tiers = "; ".join(f"{t} {fmt_pct(d['delta_pct'])} {fmt_ci(d['ci95_pct'])} {d['verdict']}"
                      for t, d in row["tiers"].items())
    load = row["load_before"][0] if row["load_before"] else "n/a"
    return f"A/A {i + 1}/{runs}: {tiers} ({row['wall_s']:.1f} s, load {load})"
