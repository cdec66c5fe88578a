"""The server side of every OpenAI `response_format`: float32 chunks in, container bytes out,
chunk by chunk, with the `speed` time-stretch and the output rate on the way.

| format | container / codec (PyAV = FFmpeg) | rate out | streamed |
|---|---|---|---|
| `pcm` | raw s16le mono | 24 kHz (the OpenAI API's, D-PCM-1), resampled if the backend's differs | yes |
| `wav` | RIFF, s16 mono; size 0xFFFFFFFF when streamed | the backend's | yes |
| `mp3` | `mp3` muxer, libmp3lame (no ID3 tag, no Xing frame) | the backend's | yes, frame by frame |
| `aac` | `adts` muxer, FFmpeg's aac | the backend's | yes, frame by frame |
| `opus` | `ogg` muxer, libopus, 20 ms pages | 48 kHz (Opus's) | yes, page by page |
| `flac` | `flac` muxer | the backend's | yes, frame by frame; streamed, the STREAMINFO's totals (sample count, MD5) stay unset, since the muxer would seek back to write them at the end |

A whole answer (`"stream": false`) is muxed into a seekable buffer instead, so its headers are
complete (FLAC's totals, mp3's Xing frame). Nothing streamed is written only at the end: each encoder's delay (a frame: 1152 samples for mp3, 1024
for aac, 20 ms for opus, 4608 for flac) is held back until the next chunk or `finish()`.

Resampler: FFmpeg's libswresample through PyAV's `AudioResampler`, stateful across chunks, so a
stream resampled chunk by chunk has no seams (scipy's `resample_poly` per chunk would).
`speed` (0.25-4.0, D-SPEED-1 in results/decisions.md): FFmpeg's `atempo` filter (a WSOLA time-stretch that keeps the pitch), one
instance per factor in [0.5, 2] (`tempo_steps`). Measured on the piper voice
(`scripts/speed_listen_test.py`, results/cpu/serve-speed-atempo.json): durations are exact at
every speed; Whisper tiny.en transcribes 0.25-2.0 as well as 1.0 (WER 0.15-0.27 against 0.27),
3.0 poorly (0.77) and 4.0 not at all; the full OpenAI range is served, as OpenAI's own 4x is
hard to follow too.

At speed 1 with the backend's own rate, `pcm` and `wav` are exactly `encode_pcm16` of the samples
(audio that crosses HTTP hashes like in-process audio).

    enc = AudioEncoder("mp3", in_rate=24000, speed=1.0)
    for chunk in chunks:
        out.write(enc.feed(chunk))       # bytes, possibly empty
    out.write(enc.finish())

PyAV is imported where a codec, the resampler or the time-stretch runs (a tenth of a second):
`pcm` and `wav` at the backend's rate and speed 1 never load it, nor does importing this module
(the server's request parsing reads FORMATS from it).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from stages.audio import wav_header
from tts_bench.wire.audio import encode_pcm16

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
PCM_RATE = 24000  # the OpenAI speech API's raw PCM rate
SPEED_RANGE = (0.25, 4.0)  # the OpenAI speech API's
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus", "aac": "audio/aac",
                 "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}


@dataclass(frozen=True)
class _Container:
    muxer: str
    codec: str
    rate: int | None  # None: the input rate
    options: tuple[tuple[str, str], ...] = ()


_CONTAINERS = {
    # No ID3v2 tag and no Xing frame: both would need the end of the stream (a seek back).
    "mp3": _Container("mp3", "libmp3lame", None, (("id3v2_version", "0"), ("write_xing", "0"))),
    "aac": _Container("adts", "aac", None),
    # The ogg muxer's default page is 1 s: the first audio would wait a second for its page.
    "opus": _Container("ogg", "libopus", 48000, (("page_duration", "20000"),)),
    "flac": _Container("flac", "flac", None),
}


def output_rate(fmt: str, in_rate: int) -> int:
    """The sample rate of `fmt`'s answer for a backend that produces `in_rate`."""
    if fmt == "pcm":
        return PCM_RATE
    container = _CONTAINERS.get(fmt)
    return container.rate or in_rate if container else in_rate


def tempo_steps(speed: float) -> list[float]:
    """`speed` as a product of atempo factors, each in [0.5, 2] (one instance stays in the range
    where its WSOLA window is tuned)."""
    steps: list[float] = []
    while speed > 2.0:
        steps.append(2.0)
        speed /= 2.0
    while speed < 0.5:
        steps.append(0.5)
        speed /= 0.5
    return [*steps, speed]


class _Sink:
    """A non-seekable file for PyAV's muxers: what they write is drained after each chunk."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def seekable(self) -> bool:  # muxers then skip the rewrite of their headers at the end
        return False

    def drain(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


class _Tempo:
    """atempo over float32 mono frames, streaming (the filter keeps its own overlap state)."""

    def __init__(self, rate: int, speed: float) -> None:
        import av

        self.graph = av.filter.Graph()
        node = src = self.graph.add_abuffer(sample_rate=rate, format="flt", layout="mono",
                                            time_base=Fraction(1, rate))
        for step in tempo_steps(speed):
            nxt = self.graph.add("atempo", f"{step:.6f}")
            node.link_to(nxt)
            node = nxt
        sink = self.graph.add("abuffersink")
        node.link_to(sink)
        self.graph.configure()
        self._src, self._sink = src, sink

    def process(self, frame) -> list:  # frame: av.AudioFrame | None (None: flush)
        import av

        self._src.push(frame)
        out = []
        while True:
            try:
                out.append(self._sink.pull())
            except (BlockingIOError, av.error.EOFError):
                return out


class AudioEncoder:
    """float32 mono chunks at `in_rate` -> `fmt` bytes (see the module docstring)."""

    def __init__(self, fmt: str, in_rate: int, *, speed: float = 1.0, streaming: bool = True) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unsupported response_format {fmt!r}; valid: {', '.join(FORMATS)}")
        self.fmt, self.in_rate, self.speed = fmt, in_rate, speed
        self.rate = output_rate(fmt, in_rate)
        self._streaming = streaming
        self._samples_in = 0
        self._plain = fmt in ("pcm", "wav") and self.rate == in_rate and speed == 1
        self._tempo = _Tempo(in_rate, speed) if speed != 1 else None
        self._pcm_parts: list[bytes] = []  # a whole (non-streamed) wav: its size goes in the header
        self._header_sent = False
        self._container = self._stream = self._sink = None
        self._resampler = None
        if fmt in _CONTAINERS:
            self._open_container(_CONTAINERS[fmt])
        elif not self._plain:
            import av

            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=self.rate)

    @property
    def needs_codec(self) -> bool:
        """Whether chunks go through FFmpeg (a codec, the resampler or the time-stretch)."""
        return not self._plain

    @property
    def content_type(self) -> str:
        return f"audio/pcm; rate={self.rate}" if self.fmt == "pcm" else CONTENT_TYPES[self.fmt]

    def _open_container(self, spec: _Container) -> None:
        import av

        # A whole answer is written to a seekable buffer, so the muxers complete their headers
        # at the end (FLAC's sample count and MD5, mp3's Xing frame for gapless players).
        self._sink = _Sink() if self._streaming else io.BytesIO()
        options = dict(spec.options) if self._streaming else {"id3v2_version": "0"} if spec.muxer == "mp3" else {}
        self._container = av.open(self._sink, "w", format=spec.muxer, options=options)
        self._stream = self._container.add_stream(spec.codec, rate=self.rate, layout="mono")
        codec_format = self._stream.codec_context.format.name
        self._resampler = av.AudioResampler(format=codec_format, layout="mono", rate=self.rate)

    def feed(self, samples: np.ndarray) -> bytes:
        # samples: [n] float32 in [-1, 1]
        if self._plain:
            return self._pcm_out(encode_pcm16(samples))
        import av

        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, np.float32)[None, :],
                                           format="flt", layout="mono")
        frame.sample_rate, frame.pts = self.in_rate, self._samples_in
        frame.time_base = Fraction(1, self.in_rate)
        self._samples_in += len(samples)
        return self._frames_out(self._tempo.process(frame) if self._tempo else [frame])

    def finish(self) -> bytes:
        """The held-back tail and the container's trailer; for a whole wav, the whole file."""
        out = b""
        if not self._plain:
            out = self._frames_out(self._tempo.process(None) if self._tempo else [], flush=True)
        if self.fmt == "wav" and not self._streaming:
            pcm = b"".join(self._pcm_parts) + out
            return wav_header(self.rate, len(pcm)) + pcm
        if self.fmt == "wav" and not self._header_sent:
            out = self._pcm_out(out)
        return out

    def _pcm_out(self, pcm: bytes) -> bytes:
        if self.fmt == "wav" and not self._streaming:
            self._pcm_parts.append(pcm)
            return b""
        if self.fmt == "wav" and not self._header_sent:
            self._header_sent = True
            return wav_header(self.rate) + pcm
        return pcm

    def _frames_out(self, frames: list, *, flush: bool = False) -> bytes:
        assert self._resampler is not None
        resampled = [r for f in frames for r in self._resampler.resample(f)]
        if flush:
            resampled += self._resampler.resample(None)
        if self._container is None:  # pcm or wav through the resampler / tempo
            return self._pcm_out(b"".join(bytes(r.planes[0])[: r.samples * 2] for r in resampled))
        for r in resampled:
            r.pts = None  # the encoder counts samples itself
            self._container.mux(self._stream.encode(r))
        if flush:
            self._container.mux(self._stream.encode(None))
            self._container.close()
        if isinstance(self._sink, io.BytesIO):
            return self._sink.getvalue() if flush else b""
        return self._sink.drain()

