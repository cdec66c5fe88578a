"""Talker -> code2wav streaming contract (spec §4.6): payloads, the chunker, validation.

A payload carries 3 left-context codes + 25 new codes. The flow encoder's pre-lookahead eats 3
right-context tokens and emits nothing for them, so the next payload re-sends those 3 as its
left context: a steady 28-code payload yields (28 - 3) x 2 = 50 mel frames = 1.0 s. The first
payload's left context is 3 silence codes (4218), and its new codes are
`code2wav.initial_codec_chunk_frames` where that is set (a shorter first chunk: earlier first
audio); the final flush (`last_chunk=True`) is the left context plus whatever is pending
(possibly nothing).

    chunker = Chunker(cfg, request_id="r1")
    payloads = chunker.push(codes)          # zero or more full payloads
    payloads.append(chunker.finish())       # exactly one final payload
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stages.code2wav.config import Code2WavConfig

DEFAULT_PROMPT_ID = "default"


class Code2WavPayloadError(ValueError):
    """A payload breaks the streaming contract; the message names the request."""

    def __init__(self, request_id: str, chunk_seq: int, what: str, fix: str) -> None:
        super().__init__(f"error: {what} (request {request_id!r}, chunk {chunk_seq}); {fix}")
        self.request_id = request_id
        self.chunk_seq = chunk_seq


@dataclass(frozen=True)
class CodecPayload:
    request_id: str
    chunk_seq: int
    codes: tuple[int, ...]
    last_chunk: bool
    prompt_id: str = DEFAULT_PROMPT_ID
    seed: int = 0  # the request's sampling seed; seeds its vocoder noise (read at chunk_seq 0)
    # The request's reference voice as an encoded audio file (chunk_seq 0 only; None: the
    # prompt id alone, e.g. the default voice). `prompt_id` is then its content hash.
    prompt_audio: bytes | None = None


def validate_payload(p: CodecPayload, prev_seq: int | None, cfg: Code2WavConfig) -> None:
    """Raise Code2WavPayloadError unless `p` may follow a payload numbered `prev_seq`.

    `prev_seq` is None for a request with no live state: then only chunk_seq 0 is valid.
    """
    expected = 0 if prev_seq is None else prev_seq + 1
    if p.chunk_seq != expected:
        raise Code2WavPayloadError(
            p.request_id,
            p.chunk_seq,
            f"chunk_seq {p.chunk_seq} out of order, expected {expected}",
            "send chunks in order starting at 0 (a new stream must start at chunk_seq 0)",
        )
    need = cfg.flow.pre_lookahead_len + 1 if not p.last_chunk else 1
    if len(p.codes) < need:
        raise Code2WavPayloadError(
            p.request_id,
            p.chunk_seq,
            f"{'final' if p.last_chunk else 'non-final'} chunk has {len(p.codes)} codes, "
            f"needs >= {need}",
            "non-final chunks carry left context + new codes (use Chunker)",
        )
    bad = [c for c in p.codes if not 0 <= c < cfg.flow.vocab_size]
    if bad:
        raise Code2WavPayloadError(
            p.request_id,
            p.chunk_seq,
            f"code {bad[0]} outside [0, {cfg.flow.vocab_size})",
            "strip the talker's EOS / special ids before code2wav",
        )


def emitted_tokens(cfg: Code2WavConfig, codes: int) -> list[int]:
    """Tokens each payload of a `codes`-code stream brings out of the flow encoder, in order (the
    blocks of the non-streaming reference's block-causal masks): `first_chunk_frames`, then
    `codec_chunk_frames` while a full chunk is pending, then the final flush's left context plus
    the remainder."""
    blocks, rest = [], codes
    while rest >= (step := cfg.chunk_codes(len(blocks))):
        blocks.append(step)
        rest -= step
    return [*blocks, cfg.codec_left_context_frames + rest]


class Chunker:
    """Per-request accumulator turning a code stream into payloads (one instance per request)."""

    def __init__(
        self, cfg: Code2WavConfig, request_id: str, prompt_id: str = DEFAULT_PROMPT_ID, seed: int = 0,
        prompt_audio: bytes | None = None,
    ) -> None:
        self.cfg = cfg
        self.request_id = request_id
        self.prompt_id = prompt_id
        self.seed = seed
        self.prompt_audio = prompt_audio  # rides on the first payload only
        self._context: list[int] = [cfg.silence_code] * cfg.codec_left_context_frames
        self._pending: list[int] = []
        self._seq = 0
        self._finished = False

    def _emit(self, new: list[int], last: bool) -> CodecPayload:
        codes = tuple(self._context + new)
        audio = self.prompt_audio if self._seq == 0 else None
        payload = CodecPayload(self.request_id, self._seq, codes, last, self.prompt_id, self.seed, audio)
        self._seq += 1
        self._context = list(codes[-self.cfg.codec_left_context_frames :])
        return payload

    def push(self, codes: Iterable[int]) -> list[CodecPayload]:
        """Add codes; return one payload per full group now pending: `first_chunk_frames` codes
        for the first payload, `codec_chunk_frames` for every later one."""
        if self._finished:
            raise RuntimeError(f"Chunker for {self.request_id!r} already finished")
        self._pending.extend(int(c) for c in codes)
        out = []
        while len(self._pending) >= (n := self.chunk_frames):
            new, self._pending = self._pending[:n], self._pending[n:]
            out.append(self._emit(new, last=False))
        return out

    @property
    def chunk_frames(self) -> int:
        """New codes the next non-final payload takes."""
        return self.cfg.chunk_codes(self._seq)

    def finish(self) -> CodecPayload:
        """The final payload: left context + the remainder (possibly empty), last_chunk=True."""
        if self._finished:
            raise RuntimeError(f"Chunker for {self.request_id!r} already finished")
        self._finished = True
        new, self._pending = self._pending, []
        return self._emit(new, last=True)
