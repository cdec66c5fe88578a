"""What every ASR backend implements, and the audio plumbing they share.

A `Transcriber` turns one utterance (float32 mono at Whisper's 16 kHz) into text. It is built
from `AsrOptions` (frozen; what goes into the transcript cache key) and describes itself with an
`AsrProvenance` (what goes into every WER record: comparing numbers made by different ASR
setups is refused by the gate).

Reproducibility choices, all fixed here rather than left to library defaults: temperature 0.0
only (the default fallback ladder 0.2 … 1.0 *samples* and changed transcripts between runs on
hard audio), language "en", Silero VAD on by default (Whisper invents "You" / "Thank you" on
digital silence without it).

    audio = load_wav_16k(Path("run/wavs/base/en_0001.wav"))   # [n] float32, 16 kHz
    text = transcriber.transcribe(audio)

Audio is read with libsndfile (`soundfile`: the generator writes 16-bit PCM WAV,
`stages.audio.write_wav16`; integer PCM scaled by 2^(bits-1)) and resampled with an FFT (the
method of `scipy.signal.resample`, which seed-tts-eval uses), so no ffmpeg is needed. The reader
is the gate's own, not the system under test's voice decoder: what scores the audio must not
change when the stages do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import soundfile

WHISPER_SAMPLE_RATE = 16_000  # every Whisper model's input rate (its mel front end is fixed)
ASR_BACKENDS = ("faster-whisper", "openai-whisper")


class AudioDecodeError(Exception):
    """The audio could not be read (corrupt, unsupported, zero samples): an `asr_failed`."""


@dataclass(frozen=True)
class AsrOptions:
    """Decoding options. All but `cpu_threads` change transcripts, so the provenance (and with it
    the transcript cache key) carries them."""

    backend: str = "faster-whisper"
    model: str = "tiny.en"  # tiny.en | base | a model directory (CTranslate2) | a .pt checkpoint
    compute_type: str = "int8"  # faster-whisper only; openai-whisper always runs float32 on CPU
    beam_size: int = 5
    vad: bool = True
    language: str = "en"
    temperature: float = 0.0  # a single value: no fallback sampling
    cpu_threads: int = 0  # 0 = library default; does not change transcripts, not in the key
    # Concurrent transcriptions (faster-whisper `num_workers`). Each short clip pays Whisper's
    # fixed 30 s window, so two clips decoded at once on two cores roughly double throughput;
    # transcripts are per clip and unchanged, so this is not in the key either.
    workers: int = 2

    def __post_init__(self) -> None:
        if self.backend not in ASR_BACKENDS:
            raise ValueError(f"asr backend must be one of {', '.join(ASR_BACKENDS)}, got {self.backend!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if self.temperature != 0.0:
            raise ValueError("temperature must be 0.0: sampled transcripts are not reproducible")


@dataclass(frozen=True)
class AsrProvenance:
    """Who made a transcript. Two WER results are comparable only when these match."""

    backend: str
    model: str  # the name the user asked for (tiny.en, base, or a path's file name)
    model_sha256: str  # of the weights file actually loaded (first 16 hex)
    compute_type: str
    beam_size: int
    vad: bool
    language: str
    temperature: float
    library_versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@runtime_checkable
class Transcriber(Protocol):
    """One loaded ASR model. `transcribe` takes [n] float32 mono at 16 kHz, returns plain text
    (segments joined, stripped); it raises on a decoding failure."""

    options: AsrOptions

    def provenance(self) -> AsrProvenance: ...

    def transcribe(self, audio: np.ndarray) -> str: ...


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """An audio file (16-bit PCM WAV as the generator writes it, or anything libsndfile reads)
    as [n] float32 mono in [-1, 1] and its sample rate; zero samples come back empty."""
    path = Path(path)
    if not path.is_file():
        raise AudioDecodeError(f"no such file: {path}")
    try:
        frames, rate = soundfile.read(path, dtype="float32", always_2d=True)  # [N, C]
    except (RuntimeError, ValueError, TypeError, OSError) as exc:  # LibsndfileError is a RuntimeError
        reason = exc.error_string if isinstance(exc, soundfile.LibsndfileError) else exc
        raise AudioDecodeError(f"cannot decode {path}: {reason}") from None
    samples = frames[:, 0] if frames.shape[1] == 1 else frames.mean(axis=1)
    return np.ascontiguousarray(samples, dtype=np.float32), int(rate)


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """FFT resampling of [n] float32 (band-limited: keeps the common low band, drops the rest)."""
    if rate_in == rate_out or samples.size == 0:
        return samples.astype(np.float32, copy=False)
    n_in = samples.shape[0]
    n_out = int(n_in * rate_out / rate_in)
    spectrum = np.fft.rfft(samples.astype(np.float64))
    out = np.zeros(n_out // 2 + 1, dtype=np.complex128)
    keep = min(spectrum.shape[0], out.shape[0])
    out[:keep] = spectrum[:keep]
    # irfft normalizes by n_out; the forward FFT had n_in samples: rescale to keep amplitude.
    return (np.fft.irfft(out, n_out) * (n_out / n_in)).astype(np.float32)


def load_wav_16k(path: Path) -> np.ndarray:
    """Read a WAV and resample it to 16 kHz; zero samples is an AudioDecodeError."""
    samples, rate = read_wav(path)
    if samples.size == 0:
        raise AudioDecodeError(f"{path} has zero samples")
    return resample(samples, rate, WHISPER_SAMPLE_RATE)
