"""`tts-bench profile`: launches per talker step, code2wav step and flow-cache split, per A/B arm.

Builds both arms' stages in this process (seeded random weights, no runner processes) and counts
device kernels (CUDA) or top-level non-view operators (CPU) with the torch profiler on a fixed
small workload; see `tts_bench.profile` for what each step is. Arms and overrides work as in
`tts-bench ab`.

    tts-bench profile                                     # configs/ab/default.yaml, B = 8
    tts-bench profile --rows 1,4,8 --format md
    tts-bench profile --set stages=configs/stages/minicpmo45.yaml --rows 8 --format json

The table goes to stdout (`--format md|table|csv|json`; json is one document with the raw
counts); logs to stderr. The library call behind it is `tts_bench.profile.profile_arms`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format
from tts_bench.commands.ab import DEFAULT_CONFIG
from tts_bench.errors import ConfigError, ExitStatus


def profile(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="A/B config YAML (default: configs/ab/default.yaml if present)."),
    sets: list[str] = typer.Option([], "--set", help="Override for both arms: dotted.key=value (repeatable)."),
    base_sets: list[str] = typer.Option([], "--base-set", help="Override for the base arm only (repeatable)."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Override for the test arm only (repeatable)."),
    rows: str = typer.Option("8", "--rows", help="Batch size(s) B, comma-separated, e.g. 1,4,8."),
    chunks: int = typer.Option(3, "--chunks", help="Profiled calls per step (after warmup); counts are per call."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
) -> ExitStatus:
    """Count kernel launches (CUDA) or operators (CPU) per step for both arms, with the delta."""
    from tts_bench.ab import load_arms
    from tts_bench.profile import profile_arms

    fmt = check_format(fmt)
    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    arms = load_arms(config, sets, base_sets, test_sets)
    result = profile_arms(arms, rows=parse_rows(rows), chunks=chunks)
    sys.stdout.write(render_profile(result, fmt))
    return ExitStatus.OK


def parse_rows(text: str) -> tuple[int, ...]:
    """"1,4,8" -> (1, 4, 8); raises ConfigError on anything but positive integers."""
    try:
        rows = tuple(int(part) for part in text.split(","))
    except ValueError:
        rows = ()
    if not rows or min(rows) < 1:
        raise ConfigError(
            f"error: bad batch sizes {text!r} (--rows); write positive integers, e.g. --rows 1,4,8"
        )
    return rows


def render_profile(result, fmt: str) -> str:
    """The table in `fmt`; json is one document: the table (`columns`, `table`) plus the raw
    per-arm counts (`profiles`, see `ProfileResult.to_dict`)."""
    from tts_bench.tables import render

    title = result.title()
    if fmt != "json":
        return render(result.table(), fmt, title=title)
    table = json.loads(render(result.table(), "json", title=title))
    doc = {"title": title, "columns": table["columns"], "table": table["rows"], **result.to_dict()}
    return json.dumps(doc, indent=2) + "\n"
