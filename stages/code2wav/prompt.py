"""Prompt setup inputs from a reference voice: speech tokens, flow mel, speaker embedding.

Spec §4.2. A reference voice (any format `stages.audio.decode_audio` reads, any rate, up to 8
channels) is normalised once — mono, 24 kHz, truncated or zero-padded to `ref_audio_max_seconds`
so every request shares one cache origin — then:
  tokens   [Tp]       25 Hz speech tokens from 16 kHz audio (S3 tokenizer or stand-in, below)
  mel      [2*Tp, 80] 24 kHz prompt mel (`mel.prompt_mel`), replicate-padded / cropped to 2*Tp
  spk      [192]      CAM++ on the Kaldi fbank of the 16 kHz audio (`speaker.SpeakerEmbedder`)
6 s -> 150 tokens -> 300 mel frames.

Tokens: with official assets, `speech_tokenizer_v2_25hz.onnx` on CPU onnxruntime, fed the
128-bin Whisper log-mel (as the public s3tokenizer / CosyVoice frontend do). Without them, a
documented deterministic stand-in: each 40 ms (4 log-mel frames) mean is projected by a seeded
[128, vocab] Gaussian matrix and the argmax is the token. It has no phonetic meaning; it gives the
flow real-shaped, audio-dependent, reproducible prompt tokens.

Results are cached per (path, content hash) — or per waveform hash for in-memory audio — in a
small LRU. Voices are decoded by `stages.audio` (libsndfile: WAV, FLAC, OGG, MP3) and held to
`stages.admission.voice_problem`'s rules.

    builder = PromptBuilder(cfg, device=torch.device("cpu"), dtype=torch.float32, weights_dir=None)
    prompt = builder.build(None)          # the packaged default voice
    prompt.tokens.shape, prompt.mel.shape, prompt.spk_embedding.shape   # [150], [300, 80], [192]
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from stages.admission import voice_problem
from stages.audio import PromptError, decode_audio
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.mel import (
    FbankConfig,
    MelConfig,
    WhisperMelConfig,
    kaldi_fbank,
    prompt_mel,
    resample,
    whisper_log_mel,
)
from stages.code2wav.speaker import SpeakerEmbedder, onnx_session

ASSETS = Path(__file__).resolve().parent / "assets"
DEFAULT_REF_WAV = ASSETS / "default_ref.wav"
TOKEN2WAV_ASSETS = Path("assets") / "token2wav"
S3_TOKENIZER = TOKEN2WAV_ASSETS / "speech_tokenizer_v2_25hz.onnx"
OFFICIAL_DEFAULT_VOICE = Path("assets") / "HT_ref_audio.wav"
TOKENIZER_RATE = 16000  # S3 tokenizer and CAM++ fbank both read 16 kHz audio


@dataclass(frozen=True)
class PromptFeatures:
    tokens: torch.Tensor  # [Tp] long
    mel: torch.Tensor  # [2*Tp, 80]
    spk_embedding: torch.Tensor  # [192]


# ---- reference audio -------------------------------------------------------------------------


def prompt_id_of(data: bytes) -> str:
    """The prompt id of an encoded reference voice: its content hash (same bytes, same voice)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _decoded(data: bytes, where: str) -> tuple[torch.Tensor, int]:
    wav, rate = decode_audio(data, where=where)  # [C, N] float32
    return torch.from_numpy(wav), rate


def normalize_reference(wav: torch.Tensor, sample_rate: int, cfg: Code2WavConfig, *, where: str) -> torch.Tensor:
    """[C, N] or [N] at any rate -> mono float32 [max_seconds * 24 kHz] (truncate / zero-pad)."""
    if wav.dim() == 1:
        wav = wav[None]
    if wav.dim() != 2:
        raise PromptError(f"error: malformed reference audio {tuple(wav.shape)} ({where}); give 1-8 channels of audio")
    problem = voice_problem(wav.shape[0], wav.shape[-1], sample_rate, cfg.ref_audio_limit_seconds)
    if problem is not None:
        raise PromptError(f"error: reference audio {problem} ({where})")
    if not torch.isfinite(wav).all():
        raise PromptError(f"error: reference audio has NaN/inf samples ({where}); re-export the file")
    mono = resample(wav.float().mean(dim=0), sample_rate, cfg.sample_rate)
    target = int(round(cfg.ref_audio_max_seconds * cfg.sample_rate))
    if mono.shape[0] >= target:
        return mono[:target].contiguous()
    return torch.nn.functional.pad(mono, (0, target - mono.shape[0]))


# ---- tokenizers --------------------------------------------------------------------------------


class S3OnnxTokenizer:
    """Official S3 tokenizer v2 (25 Hz): feats [1, 128, T] + lengths [1] int32 -> tokens [1, T/4]."""

    def __init__(self, path: Path):
        self.session = onnx_session(path)

    def __call__(self, wav16: torch.Tensor) -> torch.Tensor:  # wav16: [N] -> [Tp] long
        feats = whisper_log_mel(wav16.cpu())[None].numpy()
        inputs = self.session.get_inputs()
        feed = {inputs[0].name: feats, inputs[1].name: np.array([feats.shape[2]], dtype=np.int32)}
        return torch.from_numpy(np.asarray(self.session.run(None, feed)[0]).reshape(-1).astype(np.int64))


class StandInTokenizer:
    """Deterministic 25 Hz stand-in: seeded projection of 40 ms log-mel means, argmax over vocab."""

    def __init__(self, vocab_size: int, token_rate_hz: int, seed: int, mel: WhisperMelConfig = WhisperMelConfig()):
        self.mel = mel
        self.frames_per_token = mel.sample_rate // mel.hop_length // token_rate_hz
        gen = torch.Generator().manual_seed(seed)
        self.projection = torch.randn(mel.n_mels, vocab_size, generator=gen)

    def __call__(self, wav16: torch.Tensor) -> torch.Tensor:  # wav16: [N] -> [Tp] long
        feats = whisper_log_mel(wav16.cpu(), self.mel)  # [128, T]
        n = feats.shape[1] // self.frames_per_token
        pooled = feats[:, : n * self.frames_per_token].reshape(feats.shape[0], n, -1).mean(-1)
        return (pooled.t() @ self.projection).argmax(dim=-1)


# ---- builder ---------------------------------------------------------------------------------


class PromptBuilder:
    """Reference audio -> `PromptFeatures` on (device, dtype), cached."""

    def __init__(
        self,
        cfg: Code2WavConfig,
        *,
        device: torch.device,
        dtype: torch.dtype,
        weights_dir: str | None,
        init_seed: int = 0,
        cache_size: int = 8,
    ):
        """The stage flags it reads (`token2wav_device_spk`, `prompt_wav`) come from `cfg.options`."""
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.speaker = SpeakerEmbedder(
            cfg.speaker, device=self.device, device_spk=cfg.options.device_spk, weights_dir=weights_dir,
            init_seed=init_seed,
        )
        self.tokenizer = self._tokenizer(weights_dir, init_seed)
        self.default_wav = self._default_wav(cfg.options.prompt_wav, weights_dir)
        self._cache: OrderedDict[tuple[str, str], PromptFeatures] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # replicas on threads share one builder

    def _tokenizer(self, weights_dir: str | None, seed: int):
        if weights_dir is None:
            return StandInTokenizer(self.cfg.flow.vocab_size, self.cfg.token_rate_hz, seed)
        path = Path(weights_dir) / S3_TOKENIZER
        if not path.is_file():
            raise PromptError(f"error: speech tokenizer not found ({path}); the official layout has {S3_TOKENIZER}")
        return S3OnnxTokenizer(path)

    @staticmethod
    def _default_wav(prompt_wav: str | None, weights_dir: str | None) -> Path:
        if prompt_wav:
            return Path(prompt_wav)
        if weights_dir is not None and (Path(weights_dir) / OFFICIAL_DEFAULT_VOICE).is_file():
            return Path(weights_dir) / OFFICIAL_DEFAULT_VOICE
        return DEFAULT_REF_WAV

    def build(self, wav_path: Path | None) -> PromptFeatures:
        """Prompt for an audio file (None = the default voice), cached by path and content hash."""
        path = Path(wav_path) if wav_path is not None else self.default_wav
        if not path.is_file():
            raise PromptError(f"error: reference audio not found ({path}); give an existing audio file")
        data = path.read_bytes()
        key = (str(path.resolve()), hashlib.sha256(data).hexdigest())
        return self._cached(key, lambda: _decoded(data, str(path)), str(path))

    def build_bytes(self, data: bytes) -> PromptFeatures:
        """Prompt for an encoded reference voice (a request's prompt wav), cached by content."""
        where = "request reference audio"
        return self._cached(("<bytes>", prompt_id_of(data)), lambda: _decoded(data, where), where)

    def build_waveform(self, wav: torch.Tensor, sample_rate: int) -> PromptFeatures:
        """Prompt for in-memory audio [C, N] or [N] (e.g. a payload's ref audio), cached by hash."""
        data = wav.detach().to("cpu", torch.float32).contiguous()
        digest = hashlib.sha256(data.numpy().tobytes() + str(sample_rate).encode()).hexdigest()
        return self._cached(("<waveform>", digest), lambda: (data, sample_rate), "in-memory reference audio")

    def _cached(self, key, load, where: str) -> PromptFeatures:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            wav, rate = load()
            features = self._features(normalize_reference(wav, rate, self.cfg, where=where))
            self._cache[key] = features
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return features

    def _features(self, wav24: torch.Tensor) -> PromptFeatures:  # wav24: [N] at 24 kHz
        wav16 = resample(wav24, self.cfg.sample_rate, TOKENIZER_RATE)
        tokens = self.tokenizer(wav16)
        mel = prompt_mel(wav24, MelConfig(sample_rate=self.cfg.sample_rate, n_mels=self.cfg.mel_bins))
        frames = self.cfg.flow.up_rate * tokens.shape[0]
        if mel.shape[0] < frames:  # replicate the last frame, as upstream pads
            mel = torch.cat([mel, mel[-1:].expand(frames - mel.shape[0], -1)])
        spk = self.speaker.embed(kaldi_fbank(wav16, FbankConfig(n_mels=self.cfg.speaker.fbank_bins)))
        return PromptFeatures(
            tokens=tokens.to(self.device, torch.long),
            mel=mel[:frames].to(self.device, self.dtype),
            spk_embedding=spk.to(self.device, self.dtype),
        )
