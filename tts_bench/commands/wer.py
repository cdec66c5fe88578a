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
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tts_bench.commands._common import check_format
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.limits import MAX_PROMPTS
from tts_bench.shipped import shipped_config

DEFAULT_CONFIG = "wer/seed-tts-en.yaml"  # shipped (tts_bench.shipped): the same from any folder


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
        generation = None
    else:  # everything is checked before the run directory is made
        run, params, generation = _plan(config, arms, [*sets, *overrides], base_sets=base_sets,
                                        test_sets=test_sets, disable_shuffle=disable_shuffle,
                                        result_dir=result_dir, accept=accept)
    with run.finishing():  # any exit (error, Ctrl-C) leaves run.json failed / interrupted
        if generation is not None:
            asyncio.run(generation())
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
    # json.dumps: a YAML double-quoted string whatever the value holds (quotes, colons, #).
    return json.dumps(v) if isinstance(v, str) else str(v)


def _arms(config, arm_names, sets, base_sets, test_sets) -> dict:
    from tts_bench.config import load_arms

    if config is None:
        config = shipped_config(DEFAULT_CONFIG)
    loaded = list(load_arms(config, sets, base_sets, test_sets).values())
    names = [n.strip() for n in arm_names.split(",") if n.strip()]
    if not 1 <= len(names) <= len(loaded) or len(set(names)) != len(names):
        raise ConfigError(f"error: --arms {arm_names!r} must name 1 or {len(loaded)} distinct arms; e.g. base,test")
    return dict(zip(names, loaded))


def _plan(config, arm_names, sets, *, base_sets, test_sets, disable_shuffle, result_dir, accept):
    """Arms, prompts and checks; then the run directory and phase 1 as a coroutine factory."""
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
    check_before_generating(arms, params, prompts)
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

    def generation():
        return runner.generate(wer_arms, prompts, run, params, timeout_s=first.bench.timeout_s)

    return run, params, generation


_ASR_MODULES = {"faster-whisper": "faster_whisper", "openai-whisper": "whisper"}


def check_before_generating(arms: dict, params, prompts) -> None:
    """Everything that would otherwise fail after minutes of synthesis fails now, with exit 2:
    the ASR backend, model and normalizer, every selected prompt's reference wav, and whether
    each embedded arm's stages fit in memory."""
    import importlib.util

    from tts_bench.preflight import check_memory
    from tts_bench.wer import runner
    from tts_bench.wer.normalize import get_normalizer

    module = _ASR_MODULES.get(params.asr)
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError(f"error: ASR backend {params.asr!r} is not installed (--asr / wer.asr); "
                          f"pip install 'omni-tts-bench[speech]' (openai-whisper: [asr-reference])")
    runner.describe_asr(runner.asr_options(params))  # resolves (and hashes) the model, or exit 2
    get_normalizer(params.normalizer)
    from tts_bench.prompts import check_prompt_wavs

    check_prompt_wavs(prompts, source=next(iter(arms.values())).prompts.meta)
    for name, cfg in arms.items():
        check_memory(cfg, replicas=params.replicas, concurrency=params.concurrency,
                     label=f"arm {name!r} (wer.concurrency {params.concurrency}, wer.replicas {params.replicas})")


def _open_run(path: Path, config, sets):
    """An earlier run's directory; ASR/normalizer/gate settings from it, then --config/--set."""
    from tts_bench.config import apply_overrides, load_config, load_dataclass
    from tts_bench.results import RunDir
    from tts_bench.wer.params import WerParams

    run = RunDir.open(path, lock=True)  # it rewrites run.json: one writer at a time
    try:
        recorded = next(iter(run.doc.get("configs", {}).values()), {}).get("wer", {})
        params = load_config(config).wer if config else load_dataclass(WerParams, recorded, source=f"{path}/run.json")
        wer_sets = [s.removeprefix("wer.") for s in sets if s.startswith("wer.")]
        return run, apply_overrides(params, wer_sets)
    except BaseException:
        run.release()
        raise
