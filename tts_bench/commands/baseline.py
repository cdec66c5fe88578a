"""`tts-bench baseline update`: build a case's perf baseline from N clean runs.

    tts-bench gate --run-case configs/cases/synthetic.yaml        # x N (or tts-bench baseline run)
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
    profile: Optional[str] = typer.Option(None, "--profile", help="Hardware profile [default: cpu-<N>core]."),
    tighten_only: bool = typer.Option(False, "--tighten-only", help="Keep the old baseline unless the new one is faster."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output file [default: results/baselines/<case>.<profile>.json]."),
) -> ExitStatus:
    """Build a baseline from N runs of a case (pooled samples, per-run dispersion, provenance)."""
    from tts_bench.config import config_to_dict
    from tts_bench.gate import case as cases
    from tts_bench.gate.baseline import build_baseline, write_baseline
    from tts_bench.gate.samples import read_run, sut_hash

    paths = [*runs_from, *(more or [])]
    if not paths:
        raise ConfigError("error: no runs given (baseline update --from); pass run directories made by "
                          "tts-bench gate --run-case")
    loaded = cases.load_case(case)
    profile = profile or cases.default_profile()
    sut = sut_hash(config_to_dict(cases.resolve_case(loaded).case_config))
    doc = build_baseline([read_run(p, profile=profile) for p in paths],
                         case=loaded.case.name, profile=profile, sut=sut)
    decision = write_baseline(doc, out or cases.baseline_path(loaded.case, profile), tighten_only=tighten_only)
    typer.echo(decision.reason)
    return ExitStatus.OK
