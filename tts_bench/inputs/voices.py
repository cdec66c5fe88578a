"""Which reference voice each request of a phase speaks with (`prompts.voices`).

seed-tts prompt sets give every utterance a reference voice (zero-shot cloning); a replica
builds a voice's prompt setup once and reuses it by content, so how many distinct voices a
phase sends decides how often that setup cost is paid. The modes:

| mode | voice of request i | what it measures |
|---|---|---|
| `file` | its meta.lst prompt wav | the set as written (the builtin set has 3 voices) |
| `one` | the set's first prompt wav | a warm voice cache: every request after the first a hit |
| `distinct` | its prompt wav, made unique per request | a cold voice cache: every request a miss |
| `default` | none | the backend's default voice (no setup per request) |

`distinct` nudges the first 8 samples of the wav by 1-15 LSBs each, by a hash of the request's
position in the phase (so both arms of an A/B send the same bytes, and two positions share a
voice with odds of ~1 in 2.5e9): inaudible, but new content, so a content cache never hits. It
needs 16-bit PCM WAV prompt files (the builtin ones are).

    wav, audio = request_voice(prompt, "w03", mode="distinct", first=prompts[0].prompt_wav)
    audio = voice_file(Path("prompts/ref_0.wav"))   # a prompt wav's bytes, read once per path
"""

from __future__ import annotations

import functools
import hashlib
import io
import wave
from pathlib import Path
from typing import Any

from tts_bench.errors import ConfigError

VOICE_MODES = ("file", "one", "distinct", "default")
_NUDGED = 8  # samples changed per distinct voice
# Prompt wavs whose bytes stay in memory (a few hundred KB each): every voice of the builtin
# set and of a typical sweep's working set; a larger set re-reads the files it cycles through.
VOICE_FILES_CACHED = 256


def request_voice(prompt: Any, key: str, *, mode: str, first: Path | None) -> tuple[Path | None, bytes | None]:
    """(prompt_wav, prompt_audio) of one request: a file to read, or the voice's bytes."""
    if mode == "file":
        return prompt.prompt_wav, None
    if mode == "default":
        return None, None
    if mode == "one":
        return first, None
    if mode == "distinct":
        return None, None if prompt.prompt_wav is None else _nudged(Path(prompt.prompt_wav), key)
    raise ValueError(f"unknown voices mode {mode!r}; valid: {', '.join(VOICE_MODES)}")


def check_distinct_voices(paths) -> None:
    """Each prompt wav can be made `distinct` (16-bit PCM WAV, long enough): a ConfigError
    (exit 2) otherwise, raised before a run rather than at its first request."""
    for path in {Path(p) for p in paths if p is not None}:
        _nudged(path, "check")


def _nudged(path: Path, key: str) -> bytes:
    params, frames = _pcm16(path)
    samples = bytearray(frames)
    if len(samples) < 2 * _NUDGED:
        raise ConfigError(f"error: prompt wav {path} is too short (prompts.voices=distinct); fix the set")
    digest = hashlib.blake2b(key.encode(), digest_size=_NUDGED).digest()
    for k, byte in enumerate(digest):
        step = 1 + byte % 15
        old = int.from_bytes(samples[2 * k : 2 * k + 2], "little", signed=True)
        new = old + step if old + step <= 32767 else old - step
        samples[2 * k : 2 * k + 2] = new.to_bytes(2, "little", signed=True)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setparams(params)
        w.writeframes(bytes(samples))
    return out.getvalue()


@functools.lru_cache(maxsize=VOICE_FILES_CACHED)
def voice_file(path: Path) -> bytes:
    """A prompt wav's bytes, read once per path. Backends read the voice inside the timed
    window (SynthesisRequest.voice), and `file`/`one` modes send the same few files again and
    again: a disk read per request would be measured as synthesis time. Raises OSError (the
    caller says whose fault it is); a failed read is not cached."""
    return path.read_bytes()


@functools.lru_cache(maxsize=64)
def _pcm16(path: Path) -> tuple[Any, bytes]:
    try:
        with wave.open(str(path), "rb") as r:
            params, frames = r.getparams(), r.readframes(r.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise ConfigError(f"error: cannot read prompt wav {path} ({exc}) (prompts.voices=distinct); "
                          "use 16-bit PCM WAV prompts") from None
    if params.sampwidth != 2:
        raise ConfigError(f"error: prompt wav {path} is {8 * params.sampwidth}-bit "
                          "(prompts.voices=distinct); use 16-bit PCM WAV prompts")
    return params, frames
