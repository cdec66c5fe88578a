"""Float audio -> 16-bit PCM: the one rounding rule for the stages and the harness.

float32 samples in [-1, 1] become int16 as round(x * 32767) (numpy's round: half to even),
clipped to [-32768, 32767]. The harness hashes audio in this form (`audio_sha256`), the server
sends it over HTTP and the client scales it back by 1/32767, the WER gate writes it to WAV files,
and the stages write their packaged default voice with it: audio that crossed HTTP hashes like
audio made in-process only because every one of them uses this function. Samples are taken as
float32 first (what the stages produce), so a float64 array rounds like its float32 copy.
The WAV header is written here too (the server streams it, files get it), byte for byte what
the stdlib `wave` module writes for 16-bit mono. numpy and the stdlib only: the harness uses
this without loading torch.

    pcm = to_pcm16(samples)                     # [n] int16
    write_wav16(Path("out.wav"), samples, 24000)  # mono 16-bit PCM WAV of the same values
    wav_header(24000)                           # a streaming header (sizes 0xFFFFFFFF)
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

PCM16_SCALE = 32767.0
WAVE_FORMAT_PCM = 1


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """[n] float in [-1, 1] -> [n] int16 (clipped)."""
    scaled = np.asarray(samples, dtype=np.float32) * PCM16_SCALE
    return np.clip(np.round(scaled), -32768, 32767).astype(np.int16)


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A 44-byte header for int16 mono; `data_bytes=None` writes the streaming sizes (0xFFFFFFFF)."""
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    fmt = struct.pack("<HHIIHH", WAVE_FORMAT_PCM, 1, sample_rate, sample_rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + (
        b"data" + struct.pack("<I", data)
    )


def write_wav16(path: Path | str, samples: np.ndarray, sample_rate: int) -> None:
    """[n] float in [-1, 1] -> a mono 16-bit PCM WAV file (44-byte header, little endian)."""
    data = to_pcm16(samples).astype("<i2", copy=False).tobytes()
    Path(path).write_bytes(wav_header(sample_rate, len(data)) + data)
