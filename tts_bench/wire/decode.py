"""The client side of the compressed `response_format`s (mp3, aac, flac, opus), decoded as bytes
arrive, so the `http` backend's TTFP is the first *decodable* audio of an mp3 or opus answer.

Each decoder has the interface of `tts_bench.wire.audio.WavDecoder` (`feed(bytes) -> float32
mono`, `sample_rate`, `pending_bytes`, and `finish()` for what the codec held back). PyAV's
codec parsers split the byte stream into packets (mp3, ADTS aac, flac frames); the Ogg pages of
opus are split here (`OggPackets`, RFC 3533), its `OpusHead` given to the decoder as extradata.
An ID3v2 tag before mp3 frames and the `fLaC` metadata blocks are skipped (FLAC's STREAMINFO
becomes the decoder's extradata).

Latency by format: mp3, aac and opus decode from their first frame or page; FFmpeg's FLAC
parser confirms a few frame headers before it hands out a frame, so a streamed flac answer's
first audio is counted some frames late (about 0.3 s of audio at 22 kHz), and its last frames
come out of `finish()`.

    dec = CompressedDecoder("mp3")
    for piece in network_reads:
        samples = dec.feed(piece)       # float32 mono, possibly empty
    tail = dec.finish()

PyAV is imported by the decoder that needs it (a tenth of a second): an answer in pcm or wav, the
usual case, never loads it.
"""

from __future__ import annotations

import struct

import numpy as np

from tts_bench.wire.audio import WireError

COMPRESSED = ("mp3", "aac", "flac", "opus")
# Content types servers use for each (lower case, without parameters).
CONTENT_TYPE_FORMATS = {"audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/aac": "aac",
                        "audio/x-aac": "aac", "audio/aacp": "aac", "audio/flac": "flac",
                        "audio/x-flac": "flac", "audio/ogg": "opus", "audio/opus": "opus"}
_DECODERS = {"mp3": "mp3", "aac": "aac", "flac": "flac", "opus": "opus"}


class OggPackets:
    """Ogg pages -> the packets they carry (continued packets joined across pages)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._packet = bytearray()

    @property
    def pending_bytes(self) -> int:
        return len(self._buf) + len(self._packet)

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= 27:
            if self._buf[:4] != b"OggS":
                raise WireError(f"not an Ogg stream (page starts with {bytes(self._buf[:4])!r})")
            nseg = self._buf[26]
            if len(self._buf) < 27 + nseg:
                break
            lacing = self._buf[27 : 27 + nseg]
            if len(self._buf) < 27 + nseg + sum(lacing):
                break
            pos = 27 + nseg
            for size in lacing:
                self._packet += self._buf[pos : pos + size]
                pos += size
                if size < 255:  # a lacing value under 255 ends a packet
                    out.append(bytes(self._packet))
                    self._packet.clear()
            del self._buf[:pos]
        return out


class CompressedDecoder:
    """mp3 / aac / flac / Ogg-opus bytes -> float32 mono at the stream's own rate."""

    def __init__(self, fmt: str) -> None:
        import av

        if fmt not in COMPRESSED:
            raise WireError(f"no decoder for {fmt!r}; decodable: {', '.join(COMPRESSED)}")
        self.fmt = fmt
        self._ctx = av.CodecContext.create(_DECODERS[fmt], "r")
        self._ogg = OggPackets() if fmt == "opus" else None
        self._head = bytearray()  # bytes before the first frame (ID3 tag, fLaC blocks)
        self._started = fmt in ("aac",)
        self._resampler = av.AudioResampler(format="flt", layout="mono")
        self._ogg_packets = 0
        self._skip = 0  # opus pre-skip: decoder priming samples at the start (OpusHead, RFC 7845)

    @property
    def sample_rate(self) -> int | None:
        return self._ctx.sample_rate or None

    @property
    def pending_bytes(self) -> int:
        return len(self._head) + (self._ogg.pending_bytes if self._ogg else 0)

    def feed(self, data: bytes) -> np.ndarray:
        if self._ogg is not None:
            return self._decode(self._opus_packets(self._ogg.feed(data)))
        if not self._started:
            data = self._skip_head(data)
            if not data:
                return np.zeros(0, dtype=np.float32)
        return self._decode(self._parse(data))

    def finish(self) -> np.ndarray:
        """What the parser and the decoder still hold (the last frame)."""
        packets: list = []
        while self._ogg is None and self._started:  # a parser flush may hand out one frame a call
            more = self._parse(b"")
            if not more:
                break
            packets += more
        return self._decode(packets, flush=True)

    def _parse(self, data: bytes) -> list:
        try:
            return list(self._ctx.parse(data))
        except Exception as exc:  # noqa: BLE001 - av.error.* for malformed streams
            raise WireError(f"{self.fmt} stream does not parse: {exc}") from None

    def _opus_packets(self, packets: list[bytes]) -> list:
        import av

        out = []
        for raw in packets:
            self._ogg_packets += 1
            if self._ogg_packets == 1:  # OpusHead: the decoder's extradata
                if not raw.startswith(b"OpusHead"):
                    raise WireError("Ogg stream is not Opus (no OpusHead)")
                self._ctx.extradata = raw
                self._skip = struct.unpack("<H", raw[10:12])[0] if len(raw) >= 12 else 0
            elif self._ogg_packets > 2:  # the second is OpusTags
                out.append(av.Packet(raw))
        return out

    def _skip_head(self, data: bytes) -> bytes:
        """Drop an ID3v2 tag (mp3) or the fLaC marker and metadata blocks (flac); returns the
        bytes after them, b"" while the head is incomplete."""
        self._head += data
        buf = self._head
        if self.fmt == "mp3":
            if len(buf) < 10:
                return b""
            skip = 0
            if buf[:3] == b"ID3":
                size = 0
                for byte in buf[6:10]:  # a syncsafe integer: 7 bits a byte
                    size = size << 7 | (byte & 0x7F)
                skip = 10 + size
            if len(buf) < skip:
                return b""
        else:  # flac
            skip = self._flac_head(buf)
            if skip is None:
                return b""
        rest = bytes(buf[skip:])
        self._head.clear()
        self._started = True
        return rest

    def _flac_head(self, buf: bytearray) -> int | None:
        if len(buf) >= 4 and buf[:4] != b"fLaC":
            raise WireError(f"not a FLAC stream (starts with {bytes(buf[:4])!r})")
        pos = 4
        while True:
            if len(buf) < pos + 4:
                return None
            last, kind = buf[pos] & 0x80, buf[pos] & 0x7F
            size = struct.unpack(">I", b"\0" + bytes(buf[pos + 1 : pos + 4]))[0]
            if len(buf) < pos + 4 + size:
                return None
            if kind == 0:  # STREAMINFO
                self._ctx.extradata = bytes(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
            if last:
                return pos

    def _decode(self, packets: list, *, flush: bool = False) -> np.ndarray:
        out: list[np.ndarray] = []
        try:
            for packet in [*packets, None] if flush else packets:
                for frame in self._ctx.decode(packet):
                    for mono in self._resampler.resample(frame):
                        out.append(mono.to_ndarray().reshape(-1))
        except Exception as exc:  # noqa: BLE001 - av.error.InvalidDataError and friends
            raise WireError(f"{self.fmt} stream does not decode: {exc}") from None
        samples = np.concatenate(out).astype(np.float32, copy=False) if out else np.zeros(0, np.float32)
        if self._skip and len(samples):
            drop = min(self._skip, len(samples))
            samples, self._skip = samples[drop:], self._skip - drop
        return samples
