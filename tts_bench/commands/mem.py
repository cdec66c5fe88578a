"""`tts-bench mem`: device memory during one tier, per arm — steady state, peak, delta, headroom.

    tts-bench mem --config configs/ab/default.yaml --tier 4x2 --warm-tier 2x1 --sampler rss,torch
    tts-bench mem --config configs/ab/fused-prelude.yaml --tier 128x8 --sampler nvml,torch
    tts-bench mem --config configs/ab/synthetic.yaml --tier 8x1 --interval 0.1 --format json

Each arm runs on a fresh backend: the warm tier first (not sampled), then the tier with the
samplers running every `--interval` s (its warmup requests are marked and left out of the
steady state). The first sampler named is the primary: its table comes first and its summary is
the top level of `--format json` (`sampler`, `interval_s`, `arms.<arm>.steady_median_mib`, ...);
every sampler gets its own table, timeline PNG (next to run.json) and JSON under `samplers`.
Flags are sugar for `--set mem.*=...`, so the run record's resolved config holds them. Exit 0,
or 5 when requests failed beyond bench.max_failure_fraction or an arm has no measure-phase
sample. The library call behind it is `tts_bench.mem.run.measure_memory`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import Yaml, check_format, flag_sets, result_dir_option
from tts_bench.errors import ExitStatus
from tts_bench.config.limits import MAX_PROMPTS


def mem(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Bench config YAML (default: the shipped configs/ab/default.yaml)."),
    tier: Optional[str] = typer.Option(None, "--tier", help="The sampled tier CxR (default: mem.tier, else the config's first bench tier)."),
    warm_tier: Optional[str] = typer.Option(None, "--warm-tier", help="Tier run first, unsampled, on the same backend; 'none' to skip (default: mem.warm_tier, 4x1)."),
    interval: Optional[float] = typer.Option(None, "--interval", help="Seconds between samples (default: mem.interval_s, 2)."),
    sampler: Optional[str] = typer.Option(None, "--sampler", help="auto | nvml | npu-smi | torch | rss; comma-separated for several, first is primary."),
    device_index: Optional[int] = typer.Option(None, "--device-index", min=0, help="GPU (NVML index) or NPU card to sample (default: mem.device_index, 0)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, max=MAX_PROMPTS, help="Measured requests per arm (default: max(bench.num_prompts, 2 x C))."),
    sets: list[str] = typer.Option([], "--set", help="Override for both arms: dotted.key=value (repeatable)."),
    base_sets: list[str] = typer.Option([], "--base-set", help="Override for the base arm only (repeatable)."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Override for the test arm only (repeatable)."),
    disable_shuffle: bool = typer.Option(False, "--disable-shuffle", help="Send prompts in file order."),
    result_dir: str = typer.Option("results/runs", "--result-dir", callback=result_dir_option, help="Where run directories are made."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Duration mode: ramp, a measured window of S seconds, drain (bench.duration_s)."),
    plot: bool = typer.Option(False, "--plot", help="Draw the run's plots and report.html (with its memory timeline) into its run directory."),
) -> ExitStatus:
    """Sample memory over one tier for both arms: steady-state median, peak, delta, headroom."""
    from tts_bench.mem.run import measure_memory

    fmt = check_format(fmt)
    flag_sets = _flag_sets(tier=tier, warm_tier=warm_tier, interval=interval, sampler=sampler,
                           device_index=device_index, disable_shuffle=disable_shuffle, duration=duration)
    from tts_bench.report.progress import reporting

    with reporting("mem"):
        result = measure_memory(config, sets=[*sets, *flag_sets], base_sets=base_sets, test_sets=test_sets,
                                num_prompts=num_prompts, result_dir=result_dir)
    sys.stdout.write(render_result(result, fmt))
    for reason in result.invalid_reasons:
        typer.echo(f"error: invalid run: {reason}", err=True)
    if plot:
        from tts_bench.report.plots import plot_run

        typer.echo(f"report: {plot_run(Path(result.run_dir)).html}", err=True)
    return result.exit_status


def _flag_sets(*, tier, warm_tier, interval, sampler, device_index, disable_shuffle, duration=None) -> list[str]:
    if warm_tier is not None and warm_tier.strip().lower() in ("none", "null", ""):
        warm_tier = Yaml("null")  # --warm-tier none: no warm phase
    return flag_sets([("mem.tier", tier, "--tier"), ("mem.warm_tier", warm_tier, "--warm-tier"),
                      ("mem.interval_s", interval, "--interval"), ("mem.sampler", sampler, "--sampler"),
                      ("mem.device_index", device_index, "--device-index"),
                      ("bench.disable_shuffle", disable_shuffle or None, "--disable-shuffle"),
                      ("bench.duration_s", duration, "--duration")])


def render_result(result, fmt: str) -> str:
    """One table per sampler (primary first) + timeline and run paths, or one JSON document."""
    from tts_bench.mem.summary import mem_table, table_title
    from tts_bench.report.tables import render

    if fmt == "json":
        return json.dumps(result.to_dict(), indent=2) + "\n"
    if fmt == "csv":
        return render(mem_table(result.summaries[0]), "csv")
    parts = [render(mem_table(s), fmt, title=table_title(s)) for s in result.summaries]
    failed = ", ".join(f"{arm} {n}" for arm, n in result.failed.items() if n)
    lines = [f"failed requests: {failed}"] if failed else []
    lines += [f"timeline: {p}" for p in result.timelines] + [f"run: {result.run_dir}"]
    return "\n".join(parts) + "\n" + "\n".join(lines) + "\n"
