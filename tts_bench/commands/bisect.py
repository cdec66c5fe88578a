"""`tts-bench bisect`: the first commit of a range that made a tier slower, by same-day A/Bs.

    tts-bench bisect --good v0.3 --bad HEAD --config configs/ab/default.yaml --tier 32x1
    tts-bench bisect --good abc123 --bad main --config bench.yaml --tier 4x1 --metric ttfp \\
        --repo ../my-server --setup "make serve PORT={port}"
    tts-bench bisect --resume results/runs/20261204-230000-bisect-1a2b3c4d

Each step checks the commit out in a temporary git worktree, serves it and the good commit
(`tts-bench serve` from each worktree, or --setup), and runs `tts-bench ab` between the two
servers with --until-resolved; a step is bad (slower), good (the interval excludes the minimum
effect) or unresolved, which stops the search and says which commits remain (never a guess).
The step table goes to stdout (`--format md|table|csv|json`), each step's run directory under
the bisect's directory, logs on stderr. Exit 0 when the search ends (whatever it found), 5 when
a step's A/B was invalid. Library: `tts_bench.bisect`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format, result_dir_option
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.config.limits import MAX_PROMPTS, MAX_REPEATS


def bisect(
    good: Optional[str] = typer.Option(None, "--good", help="A commit (ref) without the regression."),
    bad: Optional[str] = typer.Option(None, "--bad", help="A later commit (ref) with it."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Bench config, as a path inside the repository (read from each commit)."),
    tier: Optional[str] = typer.Option(None, "--tier", help="The one CxR tier A/B'd at every step, e.g. 32x1."),
    metric: str = typer.Option("rtf", "--metric", help="rtf | ttfp | throughput (where ab records a throughput verdict)."),
    repo: Optional[Path] = typer.Option(None, "--repo", help="Repository to bisect (default: the one holding the working folder)."),
    setup: Optional[str] = typer.Option(None, "--setup", help="Shell command serving a worktree on 127.0.0.1:{port} ({config}, {worktree} filled in); default: tts-bench serve."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, max=MAX_PROMPTS, help="Measured requests per arm and block."),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, max=MAX_REPEATS, help="Blocks each step starts with (then --until-resolved adds pairs)."),
    max_repeats: Optional[int] = typer.Option(None, "--max-repeats", help="At most this many blocks per step (default 10)."),
    budget: Optional[float] = typer.Option(None, "--budget", help="Minutes per step; no round starts that would end past it."),
    result_dir: str = typer.Option("results/runs", "--result-dir", callback=result_dir_option, help="Where the bisect's directory is made."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Finish a bisect (its directory); other options are ignored."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
) -> ExitStatus:
    """Binary-search a commit range for the first commit that made a tier slower."""
    from tts_bench.bisect import BisectRequest, open_bisect, run_bisect, start_bisect

    fmt = check_format(fmt)
    if resume is not None:
        run = open_bisect(resume)
    else:
        missing = [flag for flag, v in (("--good", good), ("--bad", bad), ("--config", config), ("--tier", tier)) if not v]
        if missing:
            raise ConfigError(f"error: {', '.join(missing)} missing (tts-bench bisect); pass them, or --resume DIR")
        run = start_bisect(BisectRequest(good=good, bad=bad, config=config, tier=tier, metric=metric, repo=repo,
                                         setup=setup, num_prompts=num_prompts, repeats=repeats,
                                         max_repeats=max_repeats, budget_min=budget, result_dir=result_dir))
    outcome = run_bisect(run, notify=lambda line: typer.echo(line, err=True))
    sys.stdout.write(render_bisect(run.doc, fmt, run_path=run.path))
    return ExitStatus.INVALID_RUN if outcome.invalid else ExitStatus.OK


def render_bisect(doc: dict, fmt: str, *, run_path: Path) -> str:
    """The step table and the outcome line, or the bisect document as JSON."""
    import pandas as pd

    from tts_bench.report.tables import render

    if fmt == "json":
        return json.dumps({**doc, "bisect_dir": str(run_path)}, indent=2) + "\n"
    n = len(doc["plan"]["commits"])
    rows = [{
        "step": s["step"], "commit": s["sha"][:10], "position": f"{s['position']}/{n}", "subject": s["subject"][:50],
        "delta": "n/a" if s.get("delta_pct") is None else f"{s['delta_pct']:+.1f}%",
        "95% CI": "n/a" if not s.get("ci95_pct") else f"[{s['ci95_pct'][0]:+.1f}%, {s['ci95_pct'][1]:+.1f}%]",
        "MDE": "n/a" if s.get("mde_pct") is None else f"{s['mde_pct']:.1f}%",
        "blocks": s.get("blocks"), "decision": s.get("decision", "running"),
        "run": Path(s["run_dir"]).name if s.get("run_dir") else "",
    } for s in doc["steps"]]
    table = render(pd.DataFrame(rows, dtype=object), fmt,
                   title=None if fmt == "csv" else f"bisect {doc['plan']['metric']} at {doc['plan']['tier']}, "
                                                   f"each commit against {doc['plan']['good'][:10]}")
    if fmt == "csv":
        return table
    return table + "\n" + (doc.get("result") or {}).get("text", doc.get("status", "")) + f"\nbisect: {run_path}\n"
