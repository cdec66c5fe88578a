"""`tts-bench wer`: the seed-tts WER gate — generate all audio, then transcribe on CPU, then judge.

    tts-bench wer --config configs/wer/seed-tts-en.yaml                 # piper, 20 prompts, 2 arms
    tts-bench wer --config configs/wer/seed-tts-en.yaml --test-set piper.noise_scale=1.5
    tts-bench wer --asr openai-whisper --transcribe-only results/runs/20261129-201500-wer-3fa9c1
    tts-bench wer --config configs/wer/seed-tts-en.yaml --accept        # record the new baseline

Arms work like `tts-bench ab` (`--set` both, `--base-set`/`--test-set` one; `--arms base` runs a
single arm). Exit 0 pass, 4 accuracy regression, 5 invalid run (failures above wer.max_failures,
or history recorded with another ASR setup). The library behind it is `tts_bench.wer.runner`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format
from tts_bench.errors import ConfigError, ExitStatus

DEFAULT_CONFIG = Path("configs/wer/seed-tts-en.yaml")


def wer(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="WER config YAML (default: configs/wer/seed-tts-en.yaml if present)."),
    meta: Optional[str] = typer.Option(None, "--meta", help="A seed-tts meta.lst (prompt wavs relative to it) or builtin:seed-tts-en."),
    disable_shuffle: bool = typer.Option(False, "--disable-shuffle", help="Use prompts in file order (the seed's gate does)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", help="Prompts per arm (default: wer.num_prompts)."),
    arms: str = typer.Option("base,test", "--arms", help="Arm names: two to compare, one for a single arm."),
    sets: list[str] = typer.Option([], "--set", help="Override for every arm: dotted.key=value (repeatable)."),
    base_sets: list[str] = typer.Option([], "--base-set", help="Override for the base arm only (repeatable)."),
    test_sets: list[str] = typer.Option([], "--test-set", help="Override for the test arm only (repeatable)."),
    asr: Optional[str] = typer.Option(None, "--asr", help="faster-whisper | openai-whisper (default: wer.asr)."),
    asr_model: Optional[str] = typer.Option(None, "--asr-model", help="tiny.en | base | <model dir or .pt> (default: wer.asr_model)."),
    normalizer: Optional[str] = typer.Option(None, "--normalizer", help="seed-tts | whisper (default: wer.normalizer)."),
    generate_only: bool = typer.Option(False, "--generate-only", help="Only synthesize the audio (phase 1)."),
    transcribe_only: Optional[Path] = typer.Option(None, "--transcribe-only", help="Only transcribe + score this earlier WER run directory."),
    accept: bool = typer.Option(False, "--accept", "--record-history", help="Append this run to the WER history (wer.history_dir)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="md | table | csv | json (default: table on a TTY, else md)."),
    result_dir: Path = typer.Option(Path("results/runs"), "--result-dir", help="Where run directories are made."),
) -> ExitStatus:
    """Seed-tts WER gate: per-arm mean/median/corpus WER, failures, paired ΔWER and a verdict."""
    from tts_bench.wer import runner

    fmt = check_format(fmt)
    overrides = _overrides(meta, num_prompts, asr, asr_model, normalizer)
    if transcribe_only is not None:
        run, params = _open_run(transcribe_only, config, [*sets, *overrides])
    else:
        run, params = _generate(config, arms, [*sets, *overrides], base_sets=base_sets, test_sets=test_sets,
                                disable_shuffle=disable_shuffle, result_dir=result_dir, accept=accept)
        if generate_only:
            typer.echo(f"generated: {run.path}", err=True)
            return ExitStatus.OK
    report = runner.evaluate(run, params, accept=accept)
    from tts_bench.wer.report import render_report

    sys.stdout.write(render_report(report, fmt))
    typer.echo(f"run: {run.path}", err=True)
    raise typer.Exit(int(report.gate.exit_status))


def _overrides(meta, num_prompts, asr, asr_model, normalizer) -> list[str]:
    # Flags are sugar for --set, so the resolved config (and its hash) records them.
    pairs = [("prompts.meta", meta), ("wer.num_prompts", num_prompts), ("wer.asr", asr),
             ("wer.asr_model", asr_model), ("wer.normalizer", normalizer)]
    return [f"{k}={_quote(v)}" for k, v in pairs if v is not None]


def _quote(v) -> str:
    return f"'{v}'" if isinstance(v, str) else str(v)


def _arms(config, arm_names, sets, base_sets, test_sets) -> dict:
    from tts_bench.ab import load_arms

    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    loaded = list(load_arms(config, sets, base_sets, test_sets).values())
    names = [n.strip() for n in arm_names.split(",") if n.strip()]
    if not 1 <= len(names) <= len(loaded) or len(set(names)) != len(names):
        raise ConfigError(f"error: --arms {arm_names!r} must name 1 or {len(loaded)} distinct arms; e.g. base,test")
    return dict(zip(names, loaded))


def _generate(config, arm_names, sets, *, base_sets, test_sets, disable_shuffle, result_dir, accept):
    from tts_bench.config import config_hash, config_to_dict
    from tts_bench.prompts import load_prompts
    from tts_bench.results import RunDir, python_argv
    from tts_bench.wer import runner
    from tts_bench.wer.advice import prompt_advice

    arms = _arms(config, arm_names, sets, base_sets, test_sets)
    first = next(iter(arms.values()))
    params = first.wer
    shuffle = not (disable_shuffle or first.bench.disable_shuffle)
    available = load_prompts(first.prompts.meta)
    prompts = runner.select_wer_prompts(available, params.num_prompts, shuffle=shuffle,
                                        seed=first.prompts.shuffle_seed)
    if params.mode != "exact":  # say before minutes of synthesis whether the margin is in reach
        typer.echo(prompt_advice(params, len(prompts), available=len(available)).line(), err=True)
    selection = runner.selection_doc(prompts, num_prompts=len(prompts), shuffle=shuffle)
    configs = {n: config_to_dict(c) for n, c in arms.items()}
    if not accept:
        runner.precheck_history(configs, selection["wer_selection"], params)
    run = RunDir.create(
        result_dir, "wer", command_line=python_argv(),
        configs=configs, config_hashes={n: config_hash(c) for n, c in arms.items()}, extra=selection,
    )
    wer_arms = [runner.WerArm(n, c) for n, c in arms.items()]
    asyncio.run(runner.generate(wer_arms, prompts, run, params, timeout_s=first.bench.timeout_s))
    return run, params


def _open_run(path: Path, config, sets):
    """An earlier run's directory; ASR/normalizer/gate settings from it, then --config/--set."""
    from tts_bench.config import apply_overrides, load_config, load_dataclass
    from tts_bench.results import RunDir
    from tts_bench.wer.params import WerParams

    run = RunDir.open(path)
    recorded = next(iter(run.doc.get("configs", {}).values()), {}).get("wer", {})
    params = load_config(config).wer if config else load_dataclass(WerParams, recorded, source=f"{path}/run.json")
    wer_sets = [s.removeprefix("wer.") for s in sets if s.startswith("wer.")]
    return run, apply_overrides(params, wer_sets)
