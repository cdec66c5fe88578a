"""Audio at the stages' edge: reading a reference voice, and the one float -> 16-bit PCM rule.

Public for the harness (with `stages.admission`, the checks a request must pass): what the
stages accept as a voice and how their audio becomes bytes are part of the system under test's
contract, so the harness uses these functions rather than copies. numpy, soundfile and the
stdlib only: importing this never loads torch, so the piper and http backends and the server's
edge check voices and write audio without it.

**Reading a voice.** One decoder for every place that takes a voice: the prompt builder
(`stages.code2wav.prompt`) and the harness's check of a prompt list (`stages.admission`), so
what the check accepts is what the stages can use; a server's `ref_audio` field is only probed,
header and length, by `probe_audio`. It is libsndfile's (via `soundfile`): WAV (PCM 8-32 bit,
float, extensible), FLAC, OGG Vorbis/Opus and MP3, at any sample rate. Integer PCM is scaled by
2^(bits-1) (8-bit unsigned around 128), as the stdlib reader this replaced did, so 16-bit
prompts decode to exactly the same floats. Errors are PromptError (the request's or the prompt
list's fault, never the stage's):

    error: cannot decode reference audio (ref_audio): Format not recognised.; give a WAV, FLAC, OGG or MP3 file

**Writing PCM.** float32 samples in [-1, 1] become int16 as round(x * 32767) (numpy's round:
half to even), clipped to [-32768, 32767]. The harness hashes audio in this form
(`audio_sha256`), the server sends it over HTTP and the client scales it back by 1/32767, the
WER gate writes it to WAV files, and the stages write their packaged default voice with it:
audio that crossed HTTP hashes like audio made in-process only because every one of them uses
`to_pcm16`. Samples are taken as float32 first (what the stages produce), so a float64 array
rounds like its float32 copy. The WAV header is byte for byte what the stdlib `wave` module
writes for 16-bit mono.

    wav, rate = decode_audio(Path("ref.wav"))                      # [1, 144000], 24000
    wav, rate = decode_audio(request_bytes, where="ref_audio")
    frames, rate = probe_audio(request_bytes, where="ref_audio")   # header only: no samples decoded
    pcm = to_pcm16(samples)                                        # [n] int16
    write_wav16(Path("out.wav"), samples, 24000)                   # mono 16-bit PCM WAV of the same values
    wav_header(24000)                                              # a streaming header (sizes 0xFFFFFFFF)
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import soundfile

FORMATS = "WAV, FLAC, OGG or MP3"
PCM16_SCALE = 32767.0
WAVE_FORMAT_PCM = 1


class PromptError(ValueError):
    """The reference audio cannot be used as a prompt (the request's fault: bad_prompt)."""


# ---------------------------------------------------------------- reading a voice


def decode_audio(source: Path | str | bytes, *, where: str | None = None) -> tuple[np.ndarray, int]:
    """An audio file (path) or its bytes -> (float32 [C, N], sample rate). Unreadable,
    undecodable or empty audio is a PromptError naming `where` (default: the path)."""
    where = where or ("reference audio bytes" if isinstance(source, bytes) else str(source))
    if isinstance(source, bytes):
        data = source
    else:
        try:
            data = Path(source).read_bytes()
        except FileNotFoundError:
            raise PromptError(f"error: reference audio not found ({where}); give an existing audio file") from None
        except OSError as exc:
            raise PromptError(
                f"error: cannot read reference audio ({where}): {exc.strerror or exc}; give a readable file"
            ) from None
    try:
        frames, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)  # [N, C]
    except (RuntimeError, ValueError, TypeError) as exc:  # LibsndfileError is a RuntimeError
        raise _undecodable(exc, where) from None
    if frames.shape[0] == 0:
        raise _empty(where)
    return np.ascontiguousarray(frames.T), int(rate)


def probe_audio(data: bytes, *, where: str) -> tuple[int, int]:
    """(frames, sample rate) of encoded audio from its header alone, with `decode_audio`'s
    errors for what it can tell without decoding (not audio, no samples). For a server's edge:
    it must refuse a file that is not audio at once, but leave decoding to the stages, which do
    it anyway and refuse what only decoding finds (their bad_prompt)."""
    try:
        info = soundfile.info(io.BytesIO(data))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise _undecodable(exc, where) from None
    if info.frames == 0:
        raise _empty(where)
    return int(info.frames), int(info.samplerate)


def _empty(where: str) -> PromptError:
    return PromptError(f"error: reference audio is empty ({where}): no samples; give a recording of speech")


def _undecodable(exc: Exception, where: str) -> PromptError:
    # LibsndfileError carries libsndfile's own words; soundfile's checks before it, a message.
    reason = exc.error_string if isinstance(exc, soundfile.LibsndfileError) else exc
    return PromptError(f"error: cannot decode reference audio ({where}): {reason}; give a {FORMATS} file")


# ---------------------------------------------------------------- writing PCM


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
