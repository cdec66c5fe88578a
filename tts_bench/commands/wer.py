"""`tts-bench wer`: the seed-tts WER gate — generate all audio, then transcribe on CPU, then judge.

    tts-bench wer --config configs/wer/seed-tts-en.yaml                 # piper, 20 prompts, 2 arms
    tts-bench wer --config configs/wer/seed-tts-en.yaml --test-set piper.noise_scale=1.5
    tts-bench wer --asr openai-whisper --transcribe-only results/runs/20261129-201500-wer-3fa9c1
    tts-bench wer --config configs/wer/seed-tts-en.yaml --accept        # record the new baseline
    tts-bench wer --config configs/wer/seed-tts-zh.yaml                 # Chinese set: CER (wer.language: zh)

Arms work like `tts-bench ab` (`--set` both, `--base-set`/`--test-set` one; `--arms base` runs a
single arm). Exit 0 pass, 4 accuracy regression, 5 invalid run (failures above wer.max_failures,
or history recorded with another ASR setup). The library call behind it is
`tts_bench.wer.session.run_session` (checks, then `tts_bench.wer.runner`'s two phases).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format, flag_sets, result_dir_option
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.config.limits import MAX_PROMPTS


def wer(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="WER config YAML (default: the shipped configs/wer/seed-tts-en.yaml)."),
    meta: Optional[str] = typer.Option(None, "--meta", help="A seed-tts meta.lst (prompt wavs relative to it) or builtin:seed-tts-en."),
    disable_shuffle: bool = typer.Option(False, "--disable-shuffle", help="Use prompts in file order (the seed's gate does)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, max=MAX_PROMPTS, help="Prompts per arm (default: wer.num_prompts)."),
    arms: str = typer.Option("base,test", "--arms", help="Arm names: two to compare, one for a single arm."),
    sets: list[str] = typer.Option([], "--set", help="Override for every arm: dotted.key=value (repeatable)."),
    base_sets: list[str] = typer.Option([], "--base-set", help="Override for the base arm only (repeatable)."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Override for the test arm only (repeatable)."),
    asr: Optional[str] = typer.Option(None, "--asr", help="faster-whisper | openai-whisper (default: wer.asr)."),
    asr_model: Optional[str] = typer.Option(None, "--asr-model", help="tiny.en | base | <model dir or .pt> (default: wer.asr_model)."),
    normalizer: Optional[str] = typer.Option(None, "--normalizer", help="seed-tts | whisper (default: wer.normalizer)."),
    language: Optional[str] = typer.Option(None, "--language", help="en (WER over words) | zh (CER over characters) (default: wer.language)."),
    generate_only: bool = typer.Option(False, "--generate-only", help="Only synthesize the audio (phase 1)."),
    transcribe_only: Optional[Path] = typer.Option(None, "--transcribe-only", help="Only transcribe + score this earlier WER run directory."),
    accept: bool = typer.Option(False, "--accept", "--record-history", help="Append this run to the WER history (wer.history_dir)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
    result_dir: str = typer.Option("results/runs", "--result-dir", callback=result_dir_option, help="Where run directories are made."),
    plot: bool = typer.Option(False, "--plot", help="Draw the run's plots and report.html into its run directory (tts-bench plot)."),
) -> ExitStatus:
    """Seed-tts WER gate (CER on a Chinese set): per-arm mean/median/corpus error rate, failures, paired delta and a verdict."""
    from tts_bench.wer.session import WerRequest, run_session

    fmt = check_format(fmt)
    if generate_only and transcribe_only is not None:
        raise ConfigError("error: --generate-only and --transcribe-only name opposite halves of a run "
                          "(tts-bench wer); pass one of them, or neither for both phases")
    if generate_only and accept:
        raise ConfigError("error: --accept records a scored run in the history and --generate-only scores "
                          "nothing (tts-bench wer); accept when you score it: --transcribe-only RUN --accept")
    if transcribe_only is not None:
        _check_transcribe_only(arms=arms, meta=meta, num_prompts=num_prompts, disable_shuffle=disable_shuffle,
                               sets=sets, base_sets=base_sets, test_sets=test_sets)
    request = WerRequest(
        config=config, arms=arms, sets=[*sets, *_overrides(meta, num_prompts, asr, asr_model, normalizer, language)],
        base_sets=base_sets, test_sets=test_sets, disable_shuffle=disable_shuffle, generate_only=generate_only,
        transcribe_only=transcribe_only, accept=accept, result_dir=result_dir,
    )
    from tts_bench.report.progress import reporting

    with reporting("wer"):
        session = run_session(request, notify=lambda line: typer.echo(line, err=True))
    if session.report is None:
        typer.echo(f"generated: {session.run_path}", err=True)
        for problem in session.problems:
            typer.echo(f"error: invalid run: {problem}", err=True)
        return session.exit_status
    from tts_bench.wer.report import render_report

    sys.stdout.write(render_report(session.report, fmt))
    typer.echo(f"run: {session.run_path}", err=True)
    if plot:
        from tts_bench.report.plots import plot_run

        typer.echo(f"report: {plot_run(session.run_path).html}", err=True)
    return session.exit_status


def _check_transcribe_only(*, arms, meta, num_prompts, disable_shuffle, sets, base_sets, test_sets) -> None:
    """--transcribe-only re-scores a run as it was generated (its arms, prompts and audio): the
    options that choose those would change nothing, so they are refused rather than ignored."""
    ignored = [flag for flag, given in (
        ("--arms", arms != "base,test"), ("--meta", meta is not None), ("--num-prompts", num_prompts is not None),
        ("--disable-shuffle", disable_shuffle), ("--base-set", bool(base_sets)), ("--test-set", bool(test_sets)),
    ) if given]
    ignored += [f"--set {s}" for s in sets if not s.strip().startswith("wer.")]
    if ignored:
        raise ConfigError(f"error: --transcribe-only scores the run as it was generated, so {', '.join(ignored)} "
                          "would change nothing (tts-bench wer); drop them (--config, --set wer.*, --asr, "
                          "--asr-model, --normalizer and --language apply)")


def _overrides(meta, num_prompts, asr, asr_model, normalizer, language=None) -> list[str]:
    return flag_sets([("prompts.meta", meta, "--meta"), ("wer.num_prompts", num_prompts, "--num-prompts"),
                      ("wer.asr", asr, "--asr"), ("wer.asr_model", asr_model, "--asr-model"),
                      ("wer.normalizer", normalizer, "--normalizer"), ("wer.language", language, "--language")])
