"""One `tts-bench wer` as a library call: plan and check, generate (phase 1), evaluate (phase 2).

`run_session(WerRequest(...))` loads the arms (like `tts-bench ab`: file, `--set`, the file's
`arms:`, `--base-set` / `--test-set`; `arms="base"` keeps one), selects the prompts (each
utterance at most once), checks everything that would otherwise fail after minutes of synthesis
(`check_before_generating`: ASR backend, model and normalizer, every prompt's reference wav,
memory of embedded arms; and, unless accepting, the history's provenance), says whether a
non-inferiority margin is in reach (`notify`, before any audio is made), creates the run
directory, then runs `tts_bench.wer.runner.generate` and `evaluate`. `transcribe_only` re-scores
an earlier run instead (ASR, normalizer and gate settings from it, then `--config` / `--set`).

    session = run_session(WerRequest(config=Path("configs/wer/seed-tts-en.yaml"), arms="base"))
    session.exit_status, session.report.gate.verdict
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tts_bench.config import apply_overrides, config_hash, config_to_dict, load_arms, load_config, load_dataclass
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.inputs.prompts import check_prompt_wavs, check_text_lengths, embedded_voice_limit, load_prompts
from tts_bench.preflight import check_memory
from tts_bench.rundir.provenance import python_argv
from tts_bench.rundir.results import RunDir
from tts_bench.config.shipped import DEFAULT_WER_CONFIG, shipped_config
from tts_bench.wer import runner
from tts_bench.wer.advice import prompt_advice
from tts_bench.wer.gate import check_history_dir, read_history
from tts_bench.config.wer import WerParams, history_dir_for
from tts_bench.wer.references import check_reference_texts

log = logging.getLogger(__name__)

_ASR_MODULES = {"faster-whisper": "faster_whisper", "openai-whisper": "whisper"}


@dataclass(frozen=True)
class WerRequest:
    """What `tts-bench wer` was asked for (its flags already turned into `sets`)."""

    config: Path | None = None  # None: the shipped configs/wer/seed-tts-en.yaml
    arms: str = "base,test"  # arm names: two to compare, one for a single arm
    sets: Sequence[str] = ()
    base_sets: Sequence[str] = ()
    test_sets: Sequence[str] = ()
    disable_shuffle: bool = False
    generate_only: bool = False
    transcribe_only: Path | None = None  # re-score this earlier run (phase 2 only)
    accept: bool = False  # append the result to the history
    result_dir: Path = Path("results/runs")


@dataclass(frozen=True)
class WerSession:
    run_path: Path
    report: runner.WerReport | None  # None after generate_only
    problems: tuple[str, ...] = ()  # generate_only: arms with more failures than wer.max_failures

    @property
    def exit_status(self) -> ExitStatus:
        if self.report is None:  # the gate would call this run invalid: say so now (exit 5)
            return ExitStatus.INVALID_RUN if self.problems else ExitStatus.OK
        return self.report.gate.exit_status


def run_session(request: WerRequest, *, notify: Callable[[str], None] = log.info) -> WerSession:
    """See the module docstring; `notify` gets the lines worth saying before phase 1."""
    if request.transcribe_only is not None:
        run, params = open_run(request.transcribe_only, request.config, request.sets)
        params = replace(params, history_dir=history_dir_for(params, run.path.parent))
        if request.accept:
            try:
                check_history_dir(params.history_dir)
            except BaseException:
                run.release()
                raise
        generation = None
    else:  # everything is checked before the run directory is made
        run, params, generation = _plan(request, notify)
    with run.finishing():  # any exit (error, Ctrl-C) leaves run.json failed / interrupted
        if generation is not None:
            generated = asyncio.run(generation())
            if request.generate_only:
                return WerSession(run.path, None, tuple(runner.generation_problems(generated, params)))
        report = runner.evaluate(run, params, accept=request.accept)
    return WerSession(run.path, report)


def load_wer_arms(config: Path | None, arm_names: str, sets: Sequence[str] = (), base_sets: Sequence[str] = (),
                  test_sets: Sequence[str] = ()) -> dict[str, Any]:
    """The arms named in `arm_names` ("base,test", or one), chosen by name, in the config's arm
    order (the first is the base of the paired comparison, whatever order --arms lists them in)."""
    loaded = load_arms(config or shipped_config(DEFAULT_WER_CONFIG), sets, base_sets, test_sets)
    names = [n.strip() for n in arm_names.split(",") if n.strip()]
    if not 1 <= len(names) <= len(loaded) or len(set(names)) != len(names):
        raise ConfigError(f"error: --arms {arm_names!r} must name 1 or {len(loaded)} distinct arms; e.g. base,test")
    unknown = [n for n in names if n not in loaded]
    if unknown:
        raise ConfigError(f"error: --arms {arm_names!r}: no arm named {', '.join(map(repr, unknown))} in the config; "
                          f"its arms are {', '.join(loaded)}")
    return {n: arm for n, arm in loaded.items() if n in names}


def _plan(request: WerRequest, notify: Callable[[str], None]):
    """Arms, prompts and checks; then the run directory and phase 1 as a coroutine factory."""
    arms = load_wer_arms(request.config, request.arms, request.sets, request.base_sets, request.test_sets)
    first = next(iter(arms.values()))
    params = replace(first.wer, history_dir=history_dir_for(first.wer, request.result_dir))
    shuffle = not (request.disable_shuffle or first.bench.disable_shuffle)
    available = load_prompts(first.prompts.meta)
    prompts = runner.select_wer_prompts(available, params.num_prompts, shuffle=shuffle,
                                        seed=first.prompts.shuffle_seed)
    check_before_generating(arms, params, prompts)
    history = read_history(params.history_dir)
    if not Path(params.history_dir).is_dir():
        notify(f"no WER history at {params.history_dir} (wer.history_dir): no history check this run; "
               "--accept starts one there")
    if params.mode != "exact":  # say before minutes of synthesis whether the margin is in reach
        notify(prompt_advice(params, len(prompts), available=len(available), history=history).line())
    selection = runner.selection_doc(prompts, num_prompts=len(prompts), shuffle=shuffle)
    configs = {n: config_to_dict(c) for n, c in arms.items()}
    if not request.accept:
        runner.precheck_history(configs, selection["wer_selection"], params, history)
    else:
        check_history_dir(params.history_dir)
    run = RunDir.create(
        request.result_dir, "wer", command_line=python_argv(),
        configs=configs, config_hashes={n: config_hash(c) for n, c in arms.items()}, extra=selection,
    )
    wer_arms = [runner.WerArm(n, c) for n, c in arms.items()]

    def generation():
        return runner.generate(wer_arms, prompts, run, params, timeout_s=first.bench.timeout_s)

    return run, params, generation


def check_before_generating(arms: dict, params: WerParams, prompts: Sequence) -> None:
    """Everything that would otherwise fail after minutes of synthesis fails now, with exit 2:
    the ASR backend, model and normalizer, target texts the gate cannot score
    (`tts_bench.wer.references`) or an embedded talker cannot hold, every selected prompt's
    reference wav, and whether each embedded arm's stages fit in memory."""
    module = _ASR_MODULES.get(params.asr)
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError(f"error: ASR backend {params.asr!r} is not installed (--asr / wer.asr); "
                          f"pip install 'omni-tts-bench[speech]' (openai-whisper: [asr-reference])")
    runner.describe_asr(runner.asr_options(params))  # resolves (and hashes) the model, or exit 2
    meta = next(iter(arms.values())).prompts.meta
    check_reference_texts([(p.utt, p.text, f"{meta}:{p.line}" if p.line else str(meta)) for p in prompts],
                          params.normalizer, language=params.language)  # resolves the normalizer too: exit 2 here
    check_text_lengths(list(arms.values()), prompts, source=meta)
    check_prompt_wavs(prompts, source=meta, limit_seconds=embedded_voice_limit(list(arms.values())))
    for name, cfg in arms.items():
        check_memory(cfg, replicas=params.replicas, concurrency=params.concurrency,
                     label=f"arm {name!r} (wer.concurrency {params.concurrency}, wer.replicas {params.replicas})")


def open_run(path: Path, config: Path | None, sets: Sequence[str]) -> tuple[RunDir, WerParams]:
    """An earlier run's directory; ASR/normalizer/gate settings from it, then --config/--set."""
    run = RunDir.open(path, lock=True, flag="--transcribe-only")  # it rewrites run.json: one writer at a time
    try:
        recorded = next(iter(run.doc.get("configs", {}).values()), {}).get("wer", {})
        params = load_config(config).wer if config else load_dataclass(WerParams, recorded, source=f"{path}/run.json")
        wer_sets = [s.removeprefix("wer.") for s in sets if s.startswith("wer.")]
        return run, apply_overrides(params, wer_sets)
    except BaseException:
        run.release()
        raise
