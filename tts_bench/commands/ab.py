"""`tts-bench ab`: same-day A/B of audio RTF per tier, with a verdict you can paste into a PR.

    tts-bench ab                                          # configs/ab/default.yaml
    tts-bench ab --config configs/ab/fused-prelude.yaml --tiers 32x1,64x4,128x8 --repeats 3
    tts-bench ab --config configs/ab/synthetic.yaml --test-set synthetic.delay_scale=1.2
    tts-bench ab --resume results/runs/20261129-194500-ab-3fa9c1

The table goes to stdout (`--format md|table|csv|json`); progress and logs to stderr. Exit 0, or
5 when too many requests failed (bench.max_failure_fraction) and the comparison is not to be
trusted. The library call behind it is `tts_bench.ab.run_ab`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format
from tts_bench.errors import ExitStatus
from tts_bench.limits import MAX_PROMPTS, MAX_REPEATS
from tts_bench.shipped import shipped_config

DEFAULT_CONFIG = "ab/default.yaml"  # shipped (tts_bench.shipped): the same from any folder


def ab(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="A/B config YAML (default: the shipped configs/ab/default.yaml)."),
    tiers: Optional[str] = typer.Option(None, "--tiers", help="Comma-separated CxR tiers, e.g. 32x1,64x4,128x8."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, max=MAX_PROMPTS, help="Measured requests per tier, arm and repeat."),
    per_client: Optional[int] = typer.Option(None, "--prompts-per-client", min=1, max=MAX_PROMPTS, help="Measured requests per tier = K x concurrency (overrides --num-prompts per tier)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, max=MAX_REPEATS, help="Interleaved repeats per arm, counterbalanced (A B, B A, ...)."),
    sets: list[str] = typer.Option([], "--set", help="Override for both arms: dotted.key=value (repeatable)."),
    base_sets: list[str] = typer.Option([], "--base-set", help="Override for the base arm only (repeatable)."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Override for the test arm only (repeatable)."),
    disable_shuffle: bool = typer.Option(False, "--disable-shuffle", help="Send prompts in file order."),
    result_dir: Path = typer.Option(Path("results/runs"), "--result-dir", help="Where run directories are made."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Finish a killed run (its directory); other options are ignored."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
    mem: bool = typer.Option(False, "--mem", help="Sample device memory during every tier (tts-bench mem)."),
) -> ExitStatus:
    """A/B two arms of a config, interleaved per tier, with bootstrap CIs and verdicts."""
    from tts_bench import ab as lib

    fmt = check_format(fmt)
    shuffle_set = ["bench.disable_shuffle=true"] if disable_shuffle else []
    if per_client is not None:
        shuffle_set.append(f"bench.prompts_per_client={per_client}")
    run, plan = _open_run(resume) if resume else _new_run(
        config, tiers=tiers, num_prompts=num_prompts, repeats=repeats, sets=[*sets, *shuffle_set],
        base_sets=base_sets, test_sets=test_sets, result_dir=result_dir)
    with run.finishing():  # any exit (error, Ctrl-C) leaves run.json failed / interrupted
        hooks = _mem_hooks(plan, run) if mem else None
        with _progress() as progress:
            result = lib.run_ab(plan.arms, plan.tiers, repeats=plan.repeats, num_prompts=plan.num_prompts,
                                run_dir=run, progress=progress, resume=resume is not None, hooks=hooks)
        run.update(status="complete" if result.valid else "invalid", result=result.to_dict())
    sys.stdout.write(render_result(result, fmt, mem=hooks))
    for reason in result.invalid_reasons:
        typer.echo(f"error: invalid run: {reason}", err=True)
    return result.exit_status


def _new_run(config, *, tiers, num_prompts, repeats, sets, base_sets, test_sets, result_dir):
    """Load both arms, fix the plan (CLI options over the config's bench section), make the run."""
    from tts_bench.ab import AbPlan, load_arms
    from tts_bench.config import config_hash, config_to_dict, parse_tiers
    from tts_bench.preflight import check_arms
    from tts_bench.prompts import load_prompts
    from tts_bench.results import RunDir, python_argv

    if config is None:
        config = shipped_config(DEFAULT_CONFIG)
    arms = load_arms(config, sets, base_sets, test_sets)
    bench = next(iter(arms.values())).bench
    load_prompts(next(iter(arms.values())).prompts.meta)  # a bad meta.lst fails before the run exists
    # An explicit value is used as given (a 0 never falls back to the config: typer's min=1).
    plan = AbPlan(arms, parse_tiers(bench.tiers if tiers is None else tiers),
                  bench.repeats if repeats is None else repeats,
                  bench.num_prompts if num_prompts is None else num_prompts)
    check_arms(arms, plan.tiers)  # before the run directory exists and before any stage starts
    run = RunDir.create(
        result_dir, "ab", command_line=python_argv(),
        configs={n: config_to_dict(c) for n, c in arms.items()},
        config_hashes={n: config_hash(c) for n, c in arms.items()}, extra={"ab": plan.to_dict()},
    )
    return run, plan


def _open_run(path: Path):
    """Reopen a recorded A/B; its run.json fixes the arms and the plan."""
    from tts_bench.ab import plan_from_run
    from tts_bench.preflight import check_arms
    from tts_bench.results import RunDir

    run = RunDir.open(path, lock=True)  # a second writer of the same run exits 2 here
    try:
        plan = plan_from_run(run)
        check_arms(plan.arms, plan.tiers)
    except BaseException:
        run.release()
        raise
    run.update(status="running", error=None)
    return run, plan


def _mem_hooks(plan, run):
    # The memory sampler (tts_bench.mem) provides the hooks; see tts_bench.ab for the protocol.
    from tts_bench.errors import ConfigError

    try:
        from tts_bench.mem.ab_hooks import make_ab_hooks
    except ImportError:
        raise ConfigError("error: --mem is not available in this build (tts-bench ab); run without --mem") from None
    return make_ab_hooks(next(iter(plan.arms.values())), run)


# Measured: a fused-prelude A/B at 128x8 on an H200 read "slower, +8.9% [+4.4%, +13.7%]" with one
# repeat and "+0.2% [-4.2%, +5.0%], within noise" with two (results/h200/README.md).
SINGLE_REPEAT_NOTE = (
    "note: 1 repeat: the CI covers request-to-request noise only, not run-to-run drift, so a "
    "verdict can be wrong; rerun with --repeats 2 or more (order A B, B A)"
)


def render_result(result, fmt: str, *, mem=None) -> str:
    """The A/B result as text: RTF table (+ TTFP table, output-identity line and, with --mem,
    one memory table per tier and sampler) or one JSON doc."""
    from tts_bench.tables import ab_table, render

    doc = result.to_dict()
    if mem is not None:
        doc["mem"] = mem.summary()
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    base, test = result.arm_names
    rtf = ab_table(doc["tiers"], base_label=base, test_label=test)
    if fmt == "csv":
        return render(rtf, "csv")
    ttfp_rows = [{**t, **{k: (t["ttfp"] or {}).get(k) for k in ("delta_mean_pct", "ci95_pct", "verdict")},
                  "duration_mismatch": False, "note": ""} for t in doc["tiers"]]
    for row, tier in zip(ttfp_rows, doc["tiers"]):
        if tier["invalid_reasons"]:  # as for RTF: no speed verdict on a tier with failures
            row["verdict"] = "invalid"
    ttfp = ab_table(ttfp_rows, metric="audio_ttfp_ms", digits=1, base_label=base, test_label=test)
    identity = ", ".join(_identity_text(t) for t in doc["tiers"])
    text = (render(rtf, fmt, title="audio RTF (lower is faster)") + "\n"
            + render(ttfp, fmt, title="audio TTFP ms") + "\n"
            + f"identical outputs ({test} vs {base}): {identity}\n")
    if result.single_repeat:
        text += SINGLE_REPEAT_NOTE + "\n"
    if mem is not None:
        from tts_bench.mem.summary import mem_table, table_title

        text += "".join(render(mem_table(s), fmt, title=table_title(s)) + "\n" for s in mem.summaries())
    return text + f"run: {doc['run_dir']}\n"


def _identity_text(tier: dict) -> str:
    text = f"{tier['tier']}: {tier['identical_outputs']}/{tier['paired_outputs']}"
    if tier.get("identical_codes") is not None:
        text += f" (codes {tier['identical_codes']}/{tier['paired_outputs']})"
    return text


class _RichProgress:
    """One rich task per (tier, arm, repeat) on stderr; nothing when stderr is not a terminal."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import Progress

        self._progress = Progress(console=Console(stderr=True), transient=False)
        self._task = None

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def start(self, description: str, total: int) -> None:
        self._task = self._progress.add_task(description, total=total)

    def advance(self) -> None:
        self._progress.advance(self._task)


def _progress():
    import contextlib

    return _RichProgress() if sys.stderr.isatty() else contextlib.nullcontext(None)
