"""Talker dimensions and sampling defaults (MiniCPM-o 4.5 `tts_config`).

Defaults are the real checkpoint values; `configs/stages/minicpmo45-tiny.yaml` shrinks widths and
depths (never the vocabularies, ids or sampling) so CPU runs finish in seconds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from stages.talker.options import TalkerOptions


@dataclass(frozen=True)
class SamplingConfig:
    """Deploy defaults of the talker's codec sampler (spec §2.4)."""

    temperature: float = 0.8
    top_p: float = 0.85
    top_k: int = 25
    repetition_penalty: float = 1.05
    history_window: int = 16
    min_tokens: int = 50
    min_tokens_to_keep: int = 3
    # Most codes one request may emit (HF max_new_token); the final EOS sample is not counted.
    max_tokens: int = 2048
    seed: int = 42

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"talker.sampling.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"talker.sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1 or self.history_window < 1 or self.max_tokens < 1:
            raise ValueError("talker.sampling: top_k, history_window and max_tokens must be >= 1")
        if self.min_tokens < 0 or self.min_tokens_to_keep < 1:
            raise ValueError("talker.sampling: min_tokens must be >= 0, min_tokens_to_keep >= 1")
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"talker.sampling.repetition_penalty must be > 0, got {self.repetition_penalty}"
            )


@dataclass(frozen=True)
class LengthConfig:
    """Codec budget for random weights, which have no trained EOS (see `stages/talker/length.py`).

    Speech runs at about 2.5 words/s and the codec at 25 Hz, so one English word is ~10 codes;
    Mandarin runs at about 4-5 characters/s, so one CJK character is ~6 codes. With real weights
    (a weights dir) the model's own EOS decides and only `SamplingConfig.max_tokens` caps.
    """

    codes_per_word: float = 10.0
    codes_per_cjk_char: float = 6.0

    def __post_init__(self) -> None:
        if not self.codes_per_word > 0:
            raise ValueError(f"talker.length.codes_per_word must be > 0, got {self.codes_per_word}")
        if not self.codes_per_cjk_char > 0:
            raise ValueError(
                f"talker.length.codes_per_cjk_char must be > 0, got {self.codes_per_cjk_char}"
            )


@dataclass(frozen=True)
class TalkerConfig:
    """Llama backbone + codec embeddings/head + condition projector (spec §1, §2.1)."""

    hidden_size: int = 768
    num_layers: int = 20
    num_heads: int = 12
    num_kv_heads: int = 12
    intermediate_size: int = 3072
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    num_text_tokens: int = 152064
    num_audio_tokens: int = 6562
    audio_bos_token_id: int = 151687
    text_eos_token_id: int = 151692
    llm_dim: int = 4096
    # Text ids the word-level stand-in tokenizer may produce: the regular (non-special) part of
    # the Qwen vocabulary, below the first special token 151643.
    standin_text_vocab: int = 151643
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    length: LengthConfig = field(default_factory=LengthConfig)
    # Stage `extra` (strictly parsed booleans, e.g. talker_codec_fused_prelude); `options` below.
    extra: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def options(self) -> TalkerOptions:
        """`extra` parsed (strictly), once: on first read, which for a loaded stage config is its
        construction (`StageConfig`). The cached value travels with the config; `replace()`
        parses anew."""
        return TalkerOptions.from_extra(self.extra)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def eos_token_id(self) -> int:
        # The codec EOS is the last audio id (6561 for the real vocab).
        return self.num_audio_tokens - 1

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings", "num_text_tokens", "num_audio_tokens", "llm_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"talker.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"talker.hidden_size ({self.hidden_size}) must be divisible by "
                f"talker.num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError("talker.num_heads must be a multiple of talker.num_kv_heads")
        if self.head_dim % 2:
            raise ValueError(f"talker.head_dim ({self.head_dim}) must be even for rotary embedding")
        if not 0 < self.standin_text_vocab <= self.num_text_tokens:
            raise ValueError("talker.standin_text_vocab must be in (0, num_text_tokens]")
        for name in ("audio_bos_token_id", "text_eos_token_id"):
            if not 0 <= getattr(self, name) < self.num_text_tokens:
                raise ValueError(f"talker.{name} must be a valid emb_text row (< num_text_tokens)")
