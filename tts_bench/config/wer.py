"""The `wer:` section of a bench config (see configs/wer/): ASR, normalizer, generation and gate.

    wer:
      asr: faster-whisper        # or openai-whisper (the reference implementation)
      asr_model: tiny.en         # tiny.en | base | a CTranslate2 model dir | a .pt checkpoint
      normalizer: seed-tts       # or whisper (English only)
      language: en               # en: WER over words; zh: CER over characters (seed-tts-eval's test-zh)
      num_prompts: 80
      mode: auto                 # exact | noninferiority | auto (exact when the audio is identical)
      margin_points: 3.5         # non-inferiority: upper 95% bound of mean ΔWER must be below this

Modes (`tts_bench.wer.gate`): `exact` is the seed's protocol (every transcript and audio hash
equal to the other arm's and to the history's); `noninferiority` passes when the upper bound of
the paired ΔWER interval is under `margin_points` percentage points; `auto` picks exact for a
comparison whose audio is byte-identical and non-inferiority otherwise (non-deterministic
synthesis, GPU rounding).

The defaults (80 prompts, 3.5 points) come from 24 A/As and 6 degraded runs of piper at its
default noise with faster-whisper tiny.en (results/wer-gate/figures.md): 20 prompts cannot both
pass A/As and fail the degraded arm at any margin; 80 prompts at 3.5 points do.

`language: zh` scores a Chinese set as seed-tts-eval does (`tts_bench.wer.language`): the ASR
decodes in Chinese, so it needs the multilingual Whisper `base` (tiny.en is English-only and is
refused), and every margin, delta and history comparison is then in CER points.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tts_bench.config.limits import MAX_CONCURRENCY, MAX_PROMPTS, MAX_REPLICAS, MAX_SEED, check_range

Mode = Literal["exact", "noninferiority", "auto"]


@dataclass(frozen=True)
class WerParams:
    asr: Literal["faster-whisper", "openai-whisper"] = "faster-whisper"
    asr_model: str = "tiny.en"  # tiny.en | base | a model directory / checkpoint path
    compute_type: str = "int8"  # faster-whisper compute type (float32 matches openai-whisper)
    beam_size: int = 5
    vad: bool = True
    cpu_threads: int = 0  # ASR threads; 0 = library default (does not change transcripts)
    asr_workers: int = 2  # clips transcribed at once (faster-whisper); transcripts unchanged
    normalizer: Literal["seed-tts", "whisper"] = "seed-tts"
    language: Literal["en", "zh"] = "en"  # en: WER (words); zh: CER (characters)
    num_prompts: int = 80  # capped at the set's size: a WER set is never cycled
    concurrency: int = 4  # requests in flight while generating (phase 1)
    replicas: int = 1  # backend replicas while generating
    seed: int = 42  # per-request synthesis seed
    mode: Mode = "auto"
    margin_points: float = 3.5  # non-inferiority margin on mean ΔWER, percentage points
    max_failures: int = 0  # per arm; more -> invalid run (exit 5)
    # "" (default): `wer-history` beside the run's result dir (--result-dir results/runs ->
    # results/wer-history), so the history follows the runs from any working folder
    # (`history_dir_for`); a path given is taken as given.
    history_dir: str = ""
    cache_dir: str = ""  # transcript cache; "" = <tts-bench cache>/transcripts

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"wer.num_prompts must be >= 1, got {self.num_prompts}")
        if self.beam_size < 1:
            raise ValueError(f"wer.beam_size must be >= 1, got {self.beam_size}")
        if self.concurrency < 1 or self.replicas < 1:
            raise ValueError("wer.concurrency and wer.replicas must be >= 1")
        if self.asr_workers < 1:
            raise ValueError(f"wer.asr_workers must be >= 1, got {self.asr_workers}")
        if self.cpu_threads < 0:
            raise ValueError(f"wer.cpu_threads must be >= 0, got {self.cpu_threads}")
        if not self.margin_points > 0:
            raise ValueError(f"wer.margin_points must be > 0, got {self.margin_points}")
        if self.max_failures < 0:
            raise ValueError(f"wer.max_failures must be >= 0, got {self.max_failures}")
        _check_sizes(self)
        _check_language(self)


def _check_language(p: WerParams) -> None:
    """A Chinese set needs a multilingual model and seed-tts-eval's normalizer."""
    if p.language == "en":
        return
    if p.asr_model.endswith(".en"):
        raise ValueError(f"wer.asr_model {p.asr_model!r} is English-only and wer.language is {p.language!r}: "
                         "use wer.asr_model: base (Whisper base, multilingual)")
    if p.normalizer != "seed-tts":
        raise ValueError(f"wer.normalizer {p.normalizer!r} is English-only and wer.language is {p.language!r}: "
                         "use wer.normalizer: seed-tts")


def _check_sizes(p: WerParams) -> None:
    """Upper bounds (tts_bench.config.limits): a typo must be a usage error, not an OOM."""
    check_range("wer.num_prompts", p.num_prompts, 1, MAX_PROMPTS)
    check_range("wer.concurrency", p.concurrency, 1, MAX_CONCURRENCY)
    check_range("wer.replicas", p.replicas, 1, MAX_REPLICAS)
    check_range("wer.seed", p.seed, 0, MAX_SEED)


def history_dir_for(params: WerParams, result_dir: Path) -> str:
    """`wer.history_dir` as a path: as given when set, else `<result_dir>/../wer-history`."""
    return params.history_dir or str(Path(result_dir).parent / "wer-history")
