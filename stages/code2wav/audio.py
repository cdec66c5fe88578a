"""Decoding a reference voice: an audio file or its bytes -> float32 [C, N] in ±1 and its rate.

One decoder for every place that takes a voice: the prompt builder (`stages.code2wav.prompt`),
and, through it, the harness's checks of a prompt list, so what they accept is what the stages
can use (a server's `ref_audio` field is only probed, header and length, by `probe_audio`); the
WER gate reads its generated WAVs with it too (`read_audio`, which leaves an empty file to the
caller). It is libsndfile's (via `soundfile`): WAV (PCM 8-32
bit, float, extensible), FLAC, OGG Vorbis/Opus and MP3, at any sample rate. Integer PCM is scaled
by 2^(bits-1) (8-bit unsigned around 128), as the stdlib reader this replaces did, so 16-bit
prompts decode to exactly the same floats. Only numpy and soundfile are imported here: the
harness checks voices without loading torch.

Errors are PromptError (the request's or the prompt list's fault, never the stage's):

    error: cannot decode reference audio (ref_audio): Format not recognised.; give a WAV, FLAC, OGG or MP3 file

    wav, rate = decode_audio(Path("ref.wav"))          # [1, 144000], 24000
    wav, rate = decode_audio(request_bytes, where="ref_audio")
    frames, rate = probe_audio(request_bytes, where="ref_audio")   # header only: no samples decoded
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile

from stages.code2wav.streaming import PromptError

FORMATS = "WAV, FLAC, OGG or MP3"


MAX_CHANNELS = 8  # a reference voice of more channels is refused (mixed down to mono otherwise)


def reference_problem(channels: int, samples: int, sample_rate: int, limit_seconds: float) -> str | None:
    """Why decoded audio of this shape cannot be a reference voice, or None: the stage's rules
    (1-8 channels, some samples, at most `code2wav.ref_audio_limit_seconds`), shared with the
    harness's check of a prompt set before a run."""
    if not 1 <= channels <= MAX_CHANNELS:
        return f"has {channels} channels; give 1-{MAX_CHANNELS} channels of audio"
    if samples == 0:
        return "is empty (0 samples); give 1-8 channels of audio"
    if sample_rate < 1 or samples > limit_seconds * sample_rate:
        return (f"is {samples / max(sample_rate, 1):.1f} s long, the limit is "
                f"code2wav.ref_audio_limit_seconds={limit_seconds:g}; give a shorter clip (it is cut "
                "to ref_audio_max_seconds anyway)")
    return None


def decode_audio(source: Path | str | bytes, *, where: str | None = None) -> tuple[np.ndarray, int]:
    """An audio file (path) or its bytes -> (float32 [C, N], sample rate). Unreadable,
    undecodable or empty audio is a PromptError naming `where` (default: the path)."""
    where = where or ("reference audio bytes" if isinstance(source, bytes) else str(source))
    wav, rate = read_audio(source, where=where)
    if wav.shape[1] == 0:
        raise _empty(where)
    return wav, rate


def read_audio(source: Path | str | bytes, *, where: str | None = None) -> tuple[np.ndarray, int]:
    """`decode_audio` without its rule against empty audio: zero samples come back as [C, 0]
    (the WER gate's reader tells an empty file from an undecodable one)."""
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
