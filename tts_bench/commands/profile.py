"""`tts-bench profile`: launches per talker step, code2wav step and flow-cache split, per A/B arm,
and with `--tier CxR` the split of device time over talker / flow encoder / CFM / HiFT.

Builds both arms' stages in this process (seeded random weights, no runner processes) and counts
device kernels (CUDA) or top-level non-view operators (CPU) with the torch profiler on a fixed
small workload; see `tts_bench.profile.run` for what each step is. Arms and overrides work as in
`tts-bench ab`. `--tier 128x8` also profiles the talker at B = 128 and code2wav at
B = min(max_num_seqs, ceil(128 / 8)) = 8 and prints the time each component takes per second of
audio for all streams (device ms on CUDA, host cpu_ms on CPU).

    tts-bench profile                                     # configs/ab/default.yaml, B = 8
    tts-bench profile --rows 1,4,8 --format md
    tts-bench profile --set stages=configs/stages/minicpmo45.yaml --rows 8 --tier 128x8 \
        --talker-context 256 --chunks 2 --format json

The tables go to stdout (`--format md|table|csv|json`; json is one document with the raw
counts and times); logs, with each phase's wall time, to stderr. The library call behind it is
`tts_bench.profile.run.profile_arms`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.config.limits import MAX_PROFILE_ROWS
from tts_bench.config.shipped import DEFAULT_AB_CONFIG, shipped_config


def profile(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="A/B config YAML (default: the shipped configs/ab/default.yaml)."),
    sets: list[str] = typer.Option([], "--set", help="Override for both arms: dotted.key=value (repeatable)."),
    base_sets: list[str] = typer.Option([], "--base-set", help="Override for the base arm only (repeatable)."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Override for the test arm only (repeatable)."),
    rows: str = typer.Option("8", "--rows", help="Batch size(s) B, comma-separated, e.g. 1,4,8."),
    chunks: int = typer.Option(3, "--chunks", min=1, max=10_000, help="Profiled calls per step (after warmup); counts are per call."),
    tier: Optional[str] = typer.Option(None, "--tier", help="CxR, e.g. 128x8: also split time per second of audio at that tier."),
    talker_context: int = typer.Option(0, "--talker-context", min=0, max=1_000_000, help="Cache positions per talker row before the profiled steps (sets kv_len); 0: a short text."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
) -> ExitStatus:
    """Count kernel launches (CUDA) or operators (CPU) per step for both arms, with the delta."""
    from tts_bench.profile.run import profile_arms

    fmt = check_format(fmt)
    if config is None:
        config = shipped_config(DEFAULT_AB_CONFIG)
    from tts_bench.config import load_arms

    arms = load_arms(config, sets, base_sets, test_sets)
    from tts_bench.report.progress import reporting

    with reporting("profile"):
        result = profile_arms(
            arms, rows=parse_rows(rows), chunks=chunks,
            tier=None if tier is None else parse_profile_tier(tier), talker_context=talker_context,
        )  # fmt: skip
    sys.stdout.write(render_profile(result, fmt))
    return ExitStatus.OK


def parse_rows(text: str) -> tuple[int, ...]:
    """"1,4,8" -> (1, 4, 8); raises ConfigError on anything but positive integers."""
    try:
        rows = tuple(int(part) for part in text.split(","))
    except ValueError:
        rows = ()
    if not rows or min(rows) < 1 or max(rows) > MAX_PROFILE_ROWS:
        raise ConfigError(
            f"error: bad batch sizes {text!r} (--rows); write integers in 1..{MAX_PROFILE_ROWS}, e.g. --rows 1,4,8"
        )
    if len(set(rows)) != len(rows):
        raise ConfigError(f"error: batch sizes {text!r} repeat one (--rows); list each B once")
    return rows


def parse_profile_tier(text: str):
    """"128x8" -> Tier(128, 8); raises ConfigError naming --tier on anything else."""
    from tts_bench.config import parse_tier

    return parse_tier(text, where="--tier")


def render_profile(result, fmt: str) -> str:
    """The launch table in `fmt`, then the tier split if any; json is one document: the launch
    table (`columns`, `table`), the split table (`split_title`, `split_columns`, `split_table`)
    and the raw per-arm counts and times (see `ProfileResult.to_dict`)."""
    from tts_bench.report.tables import render

    title, split = result.title(), result.split
    if fmt != "json":
        text = render(result.table(), fmt, title=title)
        if split is not None:
            text += "\n" + render(split.table(), fmt, title=split.title())
        return text
    table = json.loads(render(result.table(), "json", title=title))
    doc = {"title": title, "columns": table["columns"], "table": table["rows"]}
    if split is not None:
        s = json.loads(render(split.table(), "json", title=split.title()))
        doc |= {"split_title": split.title(), "split_columns": s["columns"], "split_table": s["rows"]}
    return json.dumps({**doc, **result.to_dict()}, indent=2) + "\n"
