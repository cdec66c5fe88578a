"""Streaming contract: Chunker payload layout and payload validation errors."""

from __future__ import annotations

import pytest

from stages.code2wav.streaming import Chunker, Code2WavPayloadError, CodecPayload, validate_payload
from stages.runner.fakes import FakeChunker
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


def test_a_shorter_first_chunk_then_full_ones():
    cfg = tiny_config(initial_codec_chunk_frames=10)
    ch = Chunker(cfg, "r1")
    codes = list(range(70))
    payloads = ch.push(codes[:9]) + ch.push(codes[9:])
    assert [len(p.codes) for p in payloads] == [13, 28, 28]
    assert payloads[0].codes == (SIL, SIL, SIL, *codes[:10])
    assert payloads[1].codes == (*codes[7:10], *codes[10:35])
    assert payloads[2].codes == (*codes[32:35], *codes[35:60])
    final = ch.finish()
    assert final.codes == (*codes[57:60], *codes[60:70]) and final.chunk_seq == 3
    prev = None
    for p in [*payloads, final]:
        validate_payload(p, prev, cfg)
        prev = p.chunk_seq


def test_the_runners_fake_chunker_cuts_the_stream_as_the_real_one():
    for initial in (0, 7, 25):
        cfg = tiny_config(initial_codec_chunk_frames=initial)
        real, fake = Chunker(cfg, "r"), FakeChunker(cfg, "r")
        for part in (range(6), range(6, 40), range(40, 61)):
            assert [p.codes for p in real.push(part)] == [p.codes for p in fake.push(part)], initial
        assert real.finish().codes == fake.finish().codes


def test_a_first_chunk_must_outlast_the_vocoders_held_back_frames():
    cfg = tiny_config()
    shortest = cfg.min_initial_chunk_frames
    # its mel frames must exceed the HiFT frames held back for the cross-fade (8 at 2 a code)
    assert shortest * cfg.flow.up_rate > cfg.hift.mel_cache_frames >= (shortest - 1) * cfg.flow.up_rate
    for ok in (0, shortest, cfg.codec_chunk_frames):
        assert tiny_config(initial_codec_chunk_frames=ok).first_chunk_frames == (ok or cfg.codec_chunk_frames)
    for bad in (shortest - 1, cfg.codec_chunk_frames + 1, -1):
        with pytest.raises(ValueError, match=f"initial_codec_chunk_frames must be 0 .* between {shortest}.* got {bad}"):
            tiny_config(initial_codec_chunk_frames=bad)
