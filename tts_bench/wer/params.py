"""The `wer:` section of a bench config (see configs/wer/)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class WerParams:
    asr: Literal["faster-whisper", "openai-whisper"] = "faster-whisper"
    asr_model: str = "tiny.en"  # tiny.en | base | a model directory / checkpoint path
    compute_type: str = "int8"  # faster-whisper compute type
    beam_size: int = 5
    vad: bool = True
    normalizer: Literal["seed-tts", "whisper"] = "seed-tts"
    num_prompts: int = 20
    tolerance_points: float = 0.5  # mean WER delta CI upper bound allowed, in percentage points
    max_failures: int = 0
    bootstrap_resamples: int = 2000
    history_dir: str = "results/wer-history"

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"wer.num_prompts must be >= 1, got {self.num_prompts}")
        if self.beam_size < 1:
            raise ValueError(f"wer.beam_size must be >= 1, got {self.beam_size}")
