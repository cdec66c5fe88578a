"""`tts-bench baseline update`: build a case's perf baseline from N clean runs.

    tts-bench baseline update --case configs/cases/synthetic.yaml --run 3     # run the case 3x, build
    tts-bench baseline update --case configs/cases/synthetic.yaml --from results/runs/A results/runs/B
    tts-bench baseline update --case configs/cases/synthetic.yaml --from results/runs/C --tighten-only

Refuses (exit 5) runs with failed or missing requests and runs of another case, backend,
profile or config (or with extra overrides). `--tighten-only` keeps the old file unless the new
baseline is faster on audio_rtf in every tier. The file is then reviewed and committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tts_bench.errors import ConfigError, ExitStatus

app = typer.Typer(help="Perf-gate baselines: build, tighten.", no_args_is_help=True)


@app.command("update")
def update(
    case: Path = typer.Option(..., "--case", help="The case file (configs/cases/*.yaml)."),
    runs_from: list[Path] = typer.Option([], "--from", help="Run directories (also as trailing arguments)."),
    more: Optional[list[Path]] = typer.Argument(None, help="More run directories.", show_default=False),
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile (default: cpu-<N>core)."),
    tighten_only: bool = typer.Option(False, "--tighten-only", help="Keep the old baseline unless the new one is faster."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output file (default: results/baselines/<case>.<profile>.json)."),
    run: int = typer.Option(0, "--run", help="First run the case this many times (added to --from)."),
    result_dir: Path = typer.Option(Path("results/runs"), "--result-dir", help="Where --run makes run directories."),
) -> ExitStatus:
    """Build a baseline from N runs of a case (pooled samples, per-run dispersion, provenance)."""
    from tts_bench.config import config_to_dict
    from tts_bench.gate import case as cases
    from tts_bench.gate.baseline import build_baseline, write_baseline
    from tts_bench.gate.samples import read_run, sut_hash

    loaded = cases.load_case(case)
    profile = profile or cases.default_profile()
    paths = [*runs_from, *(more or []), *_run_case(loaded, run, profile, result_dir)]
    if not paths:
        raise ConfigError("error: no runs given (baseline update --from); pass run directories made by "
                          "tts-bench gate --run-case, or --run N")
    sut = sut_hash(config_to_dict(cases.resolve_case(loaded).case_config))
    doc = build_baseline([read_run(p, profile=profile) for p in paths],
                         case=loaded.case.name, profile=profile, sut=sut)
    doc["case_file"] = str(case)  # lets `gate --current <ab run>` find the thresholds
    decision = write_baseline(doc, out or cases.baseline_path(loaded.case, profile), tighten_only=tighten_only)
    typer.echo(decision.reason)
    return ExitStatus.OK


def _run_case(loaded, times: int, profile: str, result_dir: Path) -> list[Path]:
    from tts_bench.gate.bench import run_case
    from tts_bench.gate.case import resolve_case

    out = []
    for i in range(times):
        run = run_case(resolve_case(loaded), profile=profile, result_dir=result_dir)
        typer.echo(f"run {i + 1}/{times}: {run.path}", err=True)
        out.append(run.path)
    return out
