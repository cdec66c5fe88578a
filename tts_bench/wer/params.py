"""The `wer:` section of a bench config (see configs/wer/): ASR, normalizer, generation and gate.

    wer:
      asr: faster-whisper        # or openai-whisper (the reference implementation)
      asr_model: tiny.en         # tiny.en | base | a CTranslate2 model dir | a .pt checkpoint
      normalizer: seed-tts       # or whisper
      num_prompts: 20
      tolerance_points: 0.5      # mean ΔWER CI upper bound allowed, percentage points
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tts_bench.limits import (
    MAX_CONCURRENCY, MAX_PROMPTS, MAX_REPLICAS, MAX_RESAMPLES, MAX_SEED, check_range,
)


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
    num_prompts: int = 20
    concurrency: int = 4  # requests in flight while generating (phase 1)
    replicas: int = 1  # backend replicas while generating
    seed: int = 42  # per-request synthesis seed
    tolerance_points: float = 0.5  # mean WER delta CI upper bound allowed, in percentage points
    max_failures: int = 0  # per arm; more -> invalid run (exit 5)
    bootstrap_resamples: int = 2000
    history_dir: str = "results/wer-history"
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
        if self.tolerance_points < 0:
            raise ValueError(f"wer.tolerance_points must be >= 0, got {self.tolerance_points}")
        if self.max_failures < 0 or self.bootstrap_resamples < 1:
            raise ValueError("wer.max_failures must be >= 0 and wer.bootstrap_resamples >= 1")
        _check_sizes(self)


def _check_sizes(p: WerParams) -> None:
    """Upper bounds (tts_bench.limits): a typo must be a usage error, not an OOM."""
    check_range("wer.num_prompts", p.num_prompts, 1, MAX_PROMPTS)
    check_range("wer.concurrency", p.concurrency, 1, MAX_CONCURRENCY)
    check_range("wer.replicas", p.replicas, 1, MAX_REPLICAS)
    check_range("wer.bootstrap_resamples", p.bootstrap_resamples, 1, MAX_RESAMPLES)
    check_range("wer.seed", p.seed, 0, MAX_SEED)
