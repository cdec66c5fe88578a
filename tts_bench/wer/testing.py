"""Test doubles for the WER gate: the whole gate in milliseconds, without a TTS or an ASR model.

`TextCodeBackend` "speaks" by writing each character of the text as one run of constant samples
(16 kHz); `TextCodeTranscriber` reads the runs back, so a transcript equals the synthesized text
exactly and WER is 0 unless a test degrades something. Knobs (constructor arguments):

- `drop_last_word=True`: every utterance loses its last word, or in Chinese its last ideograph
  (a degraded arm: WER / CER > 0);
- `traditional=True`: a Chinese text is spoken in traditional characters (zhconv `zh-tw`), the
  way Whisper often transcribes Mandarin: a CER scored as seed-tts-eval does is unchanged;
- `raise_for={"en_0002"}`: those request ids raise `RequestFailed("backend_error")`;
- `empty_for={...}`: those request ids finish with zero samples (`no_audio`);
- `silence_for={...}`: those ids produce one second of digital silence (the transcriber returns
  "" for it, as Whisper + VAD does: `empty_transcript`).

    backend = TextCodeBackend()
    transcriber = TextCodeTranscriber(AsrOptions())
    provenance = fake_provenance()        # an AsrProvenance that names the fake
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from tts_bench.asr.base import WHISPER_SAMPLE_RATE, AsrOptions, AsrProvenance
from tts_bench.backends.base import AudioChunk, RequestFailed, SynthesisRequest

RUN = 80  # samples per character
_OFFSET, _SCALE = 64, 256.0  # char code c -> sample (c - 64) / 256, inside [-0.25, 0.25] for ASCII
# A character past ASCII (Chinese) is three runs: this marker, then its code's high and low byte
# as (b - 128) / 256, so every sample stays well inside [-1, 1] and survives an int16 WAV.
_WIDE = 0x7F


def _codes(text: str) -> list[float]:
    out: list[float] = []
    for ch in text:
        c = ord(ch)
        if c < _WIDE:
            out.append((c - _OFFSET) / _SCALE)
        else:
            assert c <= 0xFFFF, "text-code speaks the Basic Multilingual Plane only"
            out += [(_WIDE - _OFFSET) / _SCALE, ((c >> 8) - 128) / _SCALE, ((c & 0xFF) - 128) / _SCALE]
    return out


def encode_text(text: str) -> np.ndarray:
    """[runs * RUN] float32: each character as RUN equal samples (three runs past ASCII)."""
    codes = np.array(_codes(text), dtype=np.float32)
    return np.repeat(codes, RUN).astype(np.float32)


def decode_text(audio: np.ndarray) -> str:
    """Inverse of encode_text (reads the middle sample of every run); silence -> ""."""
    # audio: [n] float32, 16 kHz
    if audio.size == 0 or not np.any(audio):
        return ""
    mids = [int(round(x * _SCALE)) for x in audio[RUN // 2 :: RUN]]
    out, i = [], 0
    while i < len(mids):
        c = mids[i] + _OFFSET
        if c == _WIDE and i + 2 < len(mids):
            c, i = ((mids[i + 1] + 128) << 8) | (mids[i + 2] + 128), i + 2
        out.append(chr(c))
        i += 1
    return "".join(out)


def _drop_last_word(text: str) -> str:
    """The text less its last space-separated word, or in Chinese its last ideograph."""
    cjk = [i for i, ch in enumerate(text) if "\u4e00" <= ch <= "\u9fff"]
    if not cjk:
        return text.rsplit(" ", 1)[0]
    return text[: cjk[-1]] + text[cjk[-1] + 1 :]


class TextCodeBackend:
    """A Backend that encodes the request text into audio (see module docstring)."""

    def __init__(self, *, drop_last_word: bool = False, raise_for=(), empty_for=(), silence_for=(),
                 traditional: bool = False) -> None:
        self.drop_last_word, self.traditional = drop_last_word, traditional
        self.raise_for, self.empty_for, self.silence_for = set(raise_for), set(empty_for), set(silence_for)
        self.started = False
        self.calls = 0

    async def start(self, replicas: int) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def describe(self) -> dict:
        return {"backend": "text-code", "drop_last_word": self.drop_last_word}

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioChunk]:
        assert self.started, "synthesize before start"
        self.calls += 1
        rid = request.request_id
        await asyncio.sleep(0)
        if rid in self.raise_for:
            raise RequestFailed("backend_error", "text-code backend told to fail")
        if rid in self.empty_for:
            return
        if rid in self.silence_for:
            yield AudioChunk(np.zeros(WHISPER_SAMPLE_RATE, dtype=np.float32), WHISPER_SAMPLE_RATE)
            return
        text = request.text
        if self.drop_last_word:
            text = _drop_last_word(text)
        if self.traditional:
            from zhconv import convert

            text = convert(text, "zh-tw")
        audio = encode_text(text)
        half = (len(audio) // 2 // RUN) * RUN  # two chunks, split on a character boundary
        for piece in (audio[:half], audio[half:]):
            if piece.size:
                yield AudioChunk(piece, WHISPER_SAMPLE_RATE)


class TextCodeTranscriber:
    """A Transcriber that decodes TextCodeBackend audio; counts calls (for cache tests)."""

    def __init__(self, options: AsrOptions) -> None:
        self.options = options
        self.calls = 0

    def provenance(self) -> AsrProvenance:
        return fake_provenance(self.options)

    def transcribe(self, audio: np.ndarray) -> str:
        self.calls += 1
        return decode_text(audio)


def fake_provenance(options: AsrOptions | None = None, *, model_sha256: str = "0" * 16) -> AsrProvenance:
    o = options or AsrOptions()
    return AsrProvenance(
        backend=o.backend, model="text-code", model_sha256=model_sha256, compute_type=o.compute_type,
        beam_size=o.beam_size, vad=o.vad, language=o.language, temperature=o.temperature,
        library_versions={"text-code": "1"},
    )
