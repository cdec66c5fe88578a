"""Streaming contract: Chunker payload layout and payload validation errors."""

from __future__ import annotations

import pytest

from stages.code2wav.streaming import Chunker, Code2WavPayloadError, CodecPayload, validate_payload
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

CFG = tiny_config()
SIL = CFG.silence_code


def test_chunker_sends_left_context_plus_25_new_codes():
    ch = Chunker(CFG, "r1", prompt_id="p")
    codes = list(range(60))
    payloads = ch.push(codes[:10]) + ch.push(codes[10:])
    assert [p.chunk_seq for p in payloads] == [0, 1]
    assert payloads[0].codes == (SIL, SIL, SIL, *codes[:25])
    assert payloads[1].codes == (*codes[22:25], *codes[25:50])
    final = ch.finish()
    assert final.last_chunk and final.chunk_seq == 2 and final.prompt_id == "p"
    assert final.codes == (*codes[47:50], *codes[50:60])
    assert all(not p.last_chunk and len(p.codes) == 28 for p in payloads)


def test_final_flush_with_nothing_pending_is_left_context_only():
    ch = Chunker(CFG, "r1")
    ch.push(range(25))
    final = ch.finish()
    assert final.codes == (22, 23, 24) and final.last_chunk
    empty = Chunker(CFG, "r2").finish()
    assert empty.codes == (SIL, SIL, SIL) and empty.chunk_seq == 0
    with pytest.raises(RuntimeError):
        ch.push([1])


def test_validate_accepts_the_chunkers_stream():
    ch = Chunker(CFG, "r1")
    prev = None
    for p in [*ch.push(range(70)), ch.finish()]:
        validate_payload(p, prev, CFG)
        prev = p.chunk_seq


@pytest.mark.parametrize(
    ("payload", "prev", "match"),
    [
        (CodecPayload("bad", 2, (1,) * 28, False), 0, "chunk_seq 2 out of order, expected 1"),
        (CodecPayload("bad", 1, (1,) * 28, False), None, "expected 0"),
        (CodecPayload("bad", 0, (1, 2, 3), False), None, "non-final chunk has 3 codes, needs >= 4"),
        (CodecPayload("bad", 0, (), True), None, "final chunk has 0 codes"),
        (CodecPayload("bad", 0, (1, 6561, 2, 3), False), None, "code 6561 outside"),
        (CodecPayload("bad", 0, (1, -1, 2, 3), False), None, "code -1 outside"),
    ],
)
def test_bad_payloads_raise_a_typed_error_naming_the_request(payload, prev, match):
    with pytest.raises(Code2WavPayloadError, match=match) as info:
        validate_payload(payload, prev, CFG)
    assert "request 'bad'" in str(info.value) and str(info.value).startswith("error: ")
    assert info.value.request_id == "bad"
