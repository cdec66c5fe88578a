"""Audio as bytes: int16 PCM (hashes, WAV files) and the wire formats of `/v1/audio/speech`,
encoded whole and decoded incrementally.

Float -> int16 is `stages.audio.to_pcm16` everywhere, under that one name: the load generator
hashes it, the server sends it (`encode_pcm16`), the WER gate writes it to WAV files
(`stages.audio.write_wav16`).

Servers answer in one of three shapes, and a benchmark client must decode each *as bytes arrive*
(the arrival of the first samples is the TTFP):

- raw PCM (`response_format: pcm`): int16 little-endian mono at a rate the client must know
  (`http.sample_rate`). Network reads split samples anywhere, so `PcmDecoder` carries the partial
  frame (for s16 mono: an odd byte) into the next read.
- WAV (`response_format: wav`): a RIFF header, then PCM. A streaming server cannot know the size
  up front and writes 0 or 0xFFFFFFFF as the data size: `WavDecoder` then reads to the end of the
  stream. Some servers stream one complete WAV per chunk; a RIFF header after a finished data
  chunk starts a new file. The header's sample rate wins over any configured rate.
- Server-sent events (`Content-Type: text/event-stream`): `data:` lines carrying JSON with base64
  audio (OpenAI's `{"type": "speech.audio.delta", "audio": "..."}`; also `delta`/`data`/`chunk`
  keys or a bare base64 payload), ended by `[DONE]` or `speech.audio.done`. `SseDecoder` returns
  the audio bytes, which then go through the PCM or WAV decoder.

Landmine: s16 samples are scaled by 1/32767, the inverse of `to_pcm16` (`round(x * 32767)`), so
audio that crossed HTTP hashes exactly like audio produced in-process.

    dec = WavDecoder()
    for piece in network_reads:
        samples = dec.feed(piece)          # float32 mono, possibly empty
    dec.sample_rate                        # from the header
"""

from __future__ import annotations

import base64
import binascii
import json
import struct

import numpy as np

from stages.audio import PCM16_SCALE, to_pcm16

_UNKNOWN_SIZES = (0, 0xFFFFFFFF)  # data sizes a streaming WAV writer uses for "until the end"
_WAVE_FORMAT_PCM, _WAVE_FORMAT_FLOAT, _WAVE_FORMAT_EXTENSIBLE = 1, 3, 0xFFFE
_AUDIO_KEYS = ("audio", "delta", "data", "chunk", "b64_json")


class WireError(ValueError):
    """The server's bytes do not follow the format it declared."""


# ---------------------------------------------------------------- encoding (the server side)


def encode_pcm16(samples: np.ndarray) -> bytes:
    """float32 [-1, 1] mono -> int16 little-endian bytes (clipped)."""
    # samples: [n]
    return to_pcm16(samples).astype("<i2", copy=False).tobytes()


def sse_event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def sse_audio_event(pcm: bytes) -> bytes:
    """One OpenAI-style `speech.audio.delta` event carrying `pcm` as base64."""
    return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode()})


# ---------------------------------------------------------------- decoding (the client side)


class PcmDecoder:
    """Interleaved PCM frames -> float32 mono, carrying a partial frame across reads."""

    def __init__(self, sample_rate: int, *, channels: int = 1, float32: bool = False) -> None:
        if sample_rate < 1 or channels < 1:
            raise WireError(f"bad PCM layout: {sample_rate} Hz, {channels} channels")
        self.sample_rate = sample_rate
        self.channels = channels
        self._dtype = np.dtype("<f4") if float32 else np.dtype("<i2")
        self._frame_bytes = channels * self._dtype.itemsize
        self._carry = b""

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame still waiting for the next read."""
        return len(self._carry)

    def feed(self, data: bytes) -> np.ndarray:
        buf = self._carry + data if self._carry else bytes(data)
        whole = len(buf) - len(buf) % self._frame_bytes
        self._carry = buf[whole:]
        frames = np.frombuffer(buf, dtype=self._dtype, count=whole // self._dtype.itemsize)
        if self._dtype.kind == "i":
            frames = frames.astype(np.float32) / np.float32(PCM16_SCALE)
        frames = frames.reshape(-1, self.channels)  # [n, channels]
        mono = frames[:, 0] if self.channels == 1 else frames.mean(axis=1)
        return np.ascontiguousarray(mono, dtype=np.float32)

    def finish(self) -> np.ndarray:
        """Nothing is held back but a partial frame (`pending_bytes`): no samples are left."""
        return np.zeros(0, dtype=np.float32)


class WavDecoder:
    """RIFF/WAVE (int16 or float32, any channel count -> mono), one file or several in a row."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = "riff"  # riff -> chunks -> data | skip -> chunks ...
        self._left: int | None = 0  # bytes left in the data/skipped chunk; None = to the end
        self._pad = 0
        self._pcm: PcmDecoder | None = None

    @property
    def sample_rate(self) -> int | None:
        return self._pcm.sample_rate if self._pcm else None

    @property
    def pending_bytes(self) -> int:
        return len(self._buf) + (self._pcm.pending_bytes if self._pcm else 0)

    def feed(self, data: bytes) -> np.ndarray:
        self._buf += data
        out: list[np.ndarray] = []
        while self._step(out):
            pass
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def finish(self) -> np.ndarray:
        """As `PcmDecoder.finish`: every whole sample was returned by `feed`."""
        return np.zeros(0, dtype=np.float32)

    def _step(self, out: list[np.ndarray]) -> bool:
        """Consume what the buffer allows in the current state; False when it needs more bytes."""
        if self._state in ("data", "skip"):
            return self._body(out)
        if self._state == "riff":
            if len(self._buf) < 12:
                return False
            if self._buf[:4] != b"RIFF" or self._buf[8:12] != b"WAVE":
                raise WireError(f"not a WAV stream (starts with {bytes(self._buf[:12])!r})")
            del self._buf[:12]
            self._state = "chunks"
            return True
        return self._chunk_header()

    def _chunk_header(self) -> bool:
        if len(self._buf) < 8:
            return False
        cid, size = bytes(self._buf[:4]), struct.unpack("<I", self._buf[4:8])[0]
        if cid == b"RIFF":  # the next file of a stream of WAVs
            self._state = "riff"
            return True
        if cid == b"fmt ":
            if len(self._buf) < 8 + size:
                return False
            self._pcm = _parse_fmt(bytes(self._buf[8 : 8 + size]))
            del self._buf[: 8 + size + size % 2]
            return True
        del self._buf[:8]
        if cid == b"data":
            if self._pcm is None:
                raise WireError("WAV data chunk before its fmt chunk")
            self._state, self._left = "data", None if size in _UNKNOWN_SIZES else size
        else:  # LIST, fact, ...: skipped without buffering them whole
            self._state, self._left = "skip", size
        self._pad = size % 2
        return True

    def _body(self, out: list[np.ndarray]) -> bool:
        if not self._buf:
            return False
        take = len(self._buf) if self._left is None else min(len(self._buf), self._left)
        if self._state == "data":
            assert self._pcm is not None
            samples = self._pcm.feed(bytes(self._buf[:take]))
            if len(samples):
                out.append(samples)
        del self._buf[:take]
        if self._left is not None:
            self._left -= take
            if self._left == 0:
                self._state, self._left = ("skip", self._pad) if self._pad else ("chunks", 0)
                self._pad = 0
        return True


def _parse_fmt(body: bytes) -> PcmDecoder:
    if len(body) < 16:
        raise WireError(f"WAV fmt chunk too short ({len(body)} bytes)")
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
    if tag == _WAVE_FORMAT_EXTENSIBLE and len(body) >= 26:
        tag = struct.unpack("<H", body[24:26])[0]  # the sub-format GUID starts with the tag
    if (tag, bits) == (_WAVE_FORMAT_PCM, 16):
        return PcmDecoder(rate, channels=channels)
    if (tag, bits) == (_WAVE_FORMAT_FLOAT, 32):
        return PcmDecoder(rate, channels=channels, float32=True)
    raise WireError(f"unsupported WAV encoding (format tag {tag}, {bits} bits); "
                    "expected 16-bit PCM or 32-bit float")


class SseDecoder:
    """`text/event-stream` bytes -> the audio bytes its events carry (base64-decoded)."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        out: list[bytes] = []
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:
                self._dispatch(out)
            elif line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))
            # other fields (event:, id:, retry:) and comments (":") carry no audio
        return out

    def finish(self) -> list[bytes]:
        """Dispatch a last event the server did not terminate with a blank line."""
        out: list[bytes] = []
        if self._buf.strip():
            out.extend(self.feed(b"\n"))
        self._dispatch(out)
        return out

    def _dispatch(self, out: list[bytes]) -> None:
        payload, self._data = "\n".join(self._data), []
        if not payload or self.done:
            return
        if payload.strip() == "[DONE]":
            self.done = True
            return
        audio = _event_audio(payload)
        if audio:
            out.append(audio)


def _event_audio(payload: str) -> bytes | None:
    if payload.lstrip().startswith("{"):
        try:
            event = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise WireError(f"SSE event is not valid JSON: {exc}") from None
        if event.get("type") == "error" or event.get("error"):
            raise WireError(f"server error event: {event.get('error', event)}")
        value = next((event[k] for k in _AUDIO_KEYS if isinstance(event.get(k), str)), None)
        return _b64(value) if value else None  # e.g. speech.audio.done with usage: no audio
    return _b64(payload.strip())


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"SSE audio is not base64 (starts with {text[:20]!r})") from None
