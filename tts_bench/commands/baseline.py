"""`tts-bench baseline update`: build a case's perf baseline from N clean runs.

    tts-bench baseline update --case configs/cases/synthetic.yaml --run 3     # run the case 3x, build
    tts-bench baseline update --case configs/cases/synthetic.yaml --from results/runs/A results/runs/B
    tts-bench baseline update --case configs/cases/synthetic.yaml --from results/runs/C --tighten-only

Refuses (exit 5) runs with failed or missing requests and runs of another case, backend,
profile or config (or with extra overrides). `--tighten-only` keeps the old file unless the new
baseline is faster on audio_rtf in every tier. The file is then reviewed and committed. The library
call behind it is `tts_bench.gate.baseline.update_baseline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import result_dir_option
from tts_bench.errors import ExitStatus

app = typer.Typer(help="Perf-gate baselines: build, tighten.", no_args_is_help=True)


@app.command("update")
def update(
    case: Path = typer.Option(..., "--case", help="The case file (configs/cases/*.yaml)."),
    runs_from: list[Path] = typer.Option([], "--from", help="Run directories (also as trailing arguments)."),
    more: Optional[list[Path]] = typer.Argument(None, help="More run directories.", show_default=False),
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile (default: cpu-<N>core)."),
    tighten_only: bool = typer.Option(False, "--tighten-only", help="Keep the old baseline unless the new one is faster."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output file (default: results/baselines/<case>.<profile>.json)."),
    run: int = typer.Option(0, "--run", min=0, max=100, help="First run the case this many times (added to --from)."),
    result_dir: str = typer.Option("results/runs", "--result-dir", callback=result_dir_option, help="Where --run makes run directories."),
) -> ExitStatus:
    """Build a baseline from N runs of a case (pooled samples, per-run dispersion, provenance)."""
    from tts_bench.gate.baseline import update_baseline

    decision = update_baseline(
        case, runs_from=[*runs_from, *(more or [])], run=run, profile=profile, tighten_only=tighten_only,
        out=out, result_dir=result_dir, on_run=lambda i, path: typer.echo(f"run {i + 1}/{run}: {path}", err=True),
    )
    typer.echo(decision.reason)
    return ExitStatus.OK
