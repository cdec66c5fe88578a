"""Code2wav dimensions, streaming contract and rates (MiniCPM-o 4.5 token2wav, spec §1, §4).

Defaults are the real checkpoint values. Rates are related, not independent: the codec runs at
25 Hz, the flow upsamples x2 to 50 Hz mel, and HiFT makes 480 samples per mel frame at 24 kHz;
those derived numbers are properties so no module writes `24000 / 480` by hand.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from stages.code2wav.options import Code2WavOptions


@dataclass(frozen=True)
class FlowEncoderConfig:
    """UpsampleConformerEncoderV2 (spec §4.3)."""

    vocab_size: int = 6561
    input_size: int = 512
    output_size: int = 80
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    num_up_blocks: int = 4
    pre_lookahead_len: int = 3
    up_rate: int = 2
    max_relpos_len: int = 5000

    @property
    def head_dim(self) -> int:
        return self.input_size // self.attention_heads


@dataclass(frozen=True)
class DiTConfig:
    """CFM estimator: DiT with adaLN-zero (spec §4.4)."""

    in_channels: int = 320
    out_channels: int = 80
    hidden_size: int = 512
    depth: int = 16
    num_heads: int = 8
    head_dim: int = 64
    mlp_ratio: float = 4.0
    time_embed_dim: int = 256  # sinusoidal timestep features before the MLP
    time_scale: float = 1000.0  # t in [0, 1] is scaled by this before the sinusoid


@dataclass(frozen=True)
class HiFTConfig:
    """HiFT (NSF + iSTFTNet) vocoder (spec §1, §4.5)."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16
    istft_hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_predictor_channels: int = 512
    mel_cache_frames: int = 8

    @property
    def samples_per_frame(self) -> int:
        # 8 * 5 * 3 * hop 4 = 480 samples per mel frame.
        n = self.istft_hop_len
        for r in self.upsample_rates:
            n *= r
        return n

    @property
    def source_cache_samples(self) -> int:
        return self.mel_cache_frames * self.samples_per_frame


@dataclass(frozen=True)
class SpeakerConfig:
    """CAM++ speaker embedding (192-d) and the flow's projection of it."""

    embedding_dim: int = 192
    fbank_bins: int = 80


@dataclass(frozen=True)
class Code2WavConfig:
    """Everything stage 2 needs; `extra` holds the stage flags, `options` them parsed."""

    token_rate_hz: int = 25
    mel_bins: int = 80
    codec_chunk_frames: int = 25
    # New codes in a stream's first payload; 0: codec_chunk_frames like every other. Fewer codes
    # make the first audio come sooner (the talker emits them at token_rate_hz), at the price of a
    # shorter first chunk and later chunk boundaries shifted by the difference (upstream's
    # `initial_codec_chunk_frames`). At least `min_initial_chunk_frames`: the first chunk must
    # outlast the vocoder's held-back tail, or it would emit no audio.
    initial_codec_chunk_frames: int = 0
    codec_left_context_frames: int = 3
    silence_code: int = 4218
    n_timesteps: int = 10
    cfg_rate: float = 0.7
    prompt_keep_frames: int = 100  # estimator caches are trimmed to prompt + this many frames
    ref_audio_max_seconds: float = 6.0  # every reference voice is cut or padded to this
    # Reference audio longer than this is refused (bad_prompt) rather than decoded and cut.
    ref_audio_limit_seconds: float = 60.0
    # Voices whose prompt setup a replica keeps (LRU by audio content; the default voice is
    # kept besides). A setup holds the prompt's estimator caches: ~0.4 GiB at full size, fp32
    # (upstream's token2wav_runtime_prompt_cache_size is 4 too).
    prompt_cache_size: int = 4
    noise_frames: int = 30000  # fixed CFM noise buffer: 600 s at 50 Hz
    noise_temperature: float = 1.0
    flow: FlowEncoderConfig = field(default_factory=FlowEncoderConfig)
    dit: DiTConfig = field(default_factory=DiTConfig)
    hift: HiFTConfig = field(default_factory=HiFTConfig)
    speaker: SpeakerConfig = field(default_factory=SpeakerConfig)
    extra: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def options(self) -> Code2WavOptions:
        """`extra` parsed (strictly, the environment's TF32 mode included), once: on first read,
        which for a loaded stage config is its construction (`StageConfig`). The cached value
        travels with the config (pickled into the stage processes); `replace()` parses anew."""
        return Code2WavOptions.from_extra(self.extra)

    @property
    def mel_rate_hz(self) -> int:
        return self.token_rate_hz * self.flow.up_rate

    @property
    def sample_rate(self) -> int:
        return self.hift.sampling_rate

    @property
    def chunk_mel_frames(self) -> int:
        """Mel frames of one steady payload: 25 new codes x up_rate = 50."""
        return self.codec_chunk_frames * self.flow.up_rate

    @property
    def first_chunk_frames(self) -> int:
        """New codes in a stream's first payload (`initial_codec_chunk_frames` or a full chunk)."""
        return self.initial_codec_chunk_frames or self.codec_chunk_frames

    def chunk_codes(self, chunk_seq: int) -> int:
        """New codes the non-final payload `chunk_seq` of a stream carries."""
        return self.first_chunk_frames if chunk_seq == 0 else self.codec_chunk_frames

    @property
    def min_initial_chunk_frames(self) -> int:
        """The fewest new codes a first chunk may bring and still emit audio: its mel frames
        (codes x up_rate) must exceed the HiFT frames whose audio is held back for the cross-fade."""
        return self.hift.mel_cache_frames // self.flow.up_rate + 1

    def __post_init__(self) -> None:
        if self.mel_rate_hz * self.hift.samples_per_frame != self.hift.sampling_rate:
            raise ValueError(
                "code2wav rates disagree: token_rate_hz * flow.up_rate * hift samples per frame "
                f"= {self.mel_rate_hz * self.hift.samples_per_frame}, "
                f"hift.sampling_rate = {self.hift.sampling_rate}"
            )
        if not 0 < self.ref_audio_max_seconds <= self.ref_audio_limit_seconds:
            raise ValueError(
                "code2wav.ref_audio_max_seconds must be > 0 and <= code2wav.ref_audio_limit_seconds"
            )
        if self.prompt_cache_size < 1:
            raise ValueError(f"code2wav.prompt_cache_size must be >= 1, got {self.prompt_cache_size}")
        for name in ("n_timesteps", "codec_chunk_frames", "prompt_keep_frames", "noise_frames"):
            if getattr(self, name) <= 0:
                raise ValueError(f"code2wav.{name} must be positive, got {getattr(self, name)}")
        initial = self.initial_codec_chunk_frames
        if initial and not self.min_initial_chunk_frames <= initial <= self.codec_chunk_frames:
            raise ValueError(
                f"code2wav.initial_codec_chunk_frames must be 0 (a full first chunk) or between "
                f"{self.min_initial_chunk_frames} (the first chunk must outlast the vocoder's "
                f"{self.hift.mel_cache_frames} held-back mel frames) and codec_chunk_frames "
                f"({self.codec_chunk_frames}), got {initial}"
            )
        if self.prompt_keep_frames % self.flow.up_rate:
            raise ValueError(
                "code2wav.prompt_keep_frames must be a multiple of flow.up_rate (the token-rate "
                "conformer layers are trimmed at half that length)"
            )
        if not 0 <= self.silence_code < self.flow.vocab_size:
            raise ValueError("code2wav.silence_code must be a valid flow token id")
        if self.codec_left_context_frames != self.flow.pre_lookahead_len:
            raise ValueError(
                "code2wav.codec_left_context_frames must equal flow.pre_lookahead_len "
                "(the lookahead tokens are re-sent as the next payload's left context)"
            )
