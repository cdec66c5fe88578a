"""`tts-bench plot`: draw the plots and report.html of recorded runs (old ones too).

    tts-bench plot results/runs/20261204-101500-ab-3fa9c1
    tts-bench plot results/runs/*-ab-*            # several at once

Per tier and arm: RTF and TTFP ECDFs, the per-block deltas with their interval and MDE (A/B
runs), audio throughput over the measured phase, and the memory timeline where the run drew
one; PNGs and a self-contained report.html go into each run directory, whose report path is
printed on stdout. The library call is `tts_bench.report.plots.plot_run`; `--plot` on ab, wer, mem and
gate calls it for the run they just made.
"""

from __future__ import annotations

from pathlib import Path

import typer

from tts_bench.errors import ExitStatus


def plot(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories (each holds run.json and requests.jsonl)."),
) -> ExitStatus:
    """Draw a run's plots (PNGs) and report.html into its run directory."""
    from tts_bench.report.plots import plot_run

    for run_dir in run_dirs:
        typer.echo(str(plot_run(run_dir).html))
    return ExitStatus.OK
