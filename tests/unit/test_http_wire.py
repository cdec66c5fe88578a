"""Wire formats of /v1/audio/speech: incremental PCM/WAV/SSE decoding and the /metrics text."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest

from stages.audio import to_pcm16, wav_header, write_wav16
from tts_bench.wire import exposition
from tts_bench.wire.audio import PcmDecoder, SseDecoder, WavDecoder, WireError, encode_pcm16, sse_audio_event


def _audio(n: int = 1001, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)


def _feed_in_pieces(decoder, data: bytes, sizes=(1, 3, 2, 7, 1, 64)) -> np.ndarray:
    out, i, k = [], 0, 0
    while i < len(data):
        step = sizes[k % len(sizes)]
        out.append(decoder.feed(data[i : i + step]))
        i, k = i + step, k + 1
    return np.concatenate(out)


def test_pcm_split_at_odd_bytes_decodes_every_sample_once():
    audio = _audio()
    dec = PcmDecoder(24000)
    got = _feed_in_pieces(dec, encode_pcm16(audio))
    assert len(got) == len(audio) and dec.pending_bytes == 0
    assert np.max(np.abs(got - audio)) <= 0.5 / 32767 + 1e-7


def test_pcm16_round_trip_hashes_like_in_process_audio():
    # The load generator hashes round(x * 32767); decoding must invert that exactly.
    audio = _audio(5000, seed=3)
    decoded = PcmDecoder(24000).feed(encode_pcm16(audio))
    assert np.array_equal(to_pcm16(decoded), to_pcm16(audio))


def test_pcm_keeps_a_trailing_odd_byte_pending():
    dec = PcmDecoder(16000)
    assert len(dec.feed(b"\x01\x00\x02")) == 1 and dec.pending_bytes == 1
    assert dec.feed(b"\x00")[0] == pytest.approx(2 / 32767)


def test_streaming_wav_header_rate_wins_and_reads_to_the_end():
    audio = _audio(777)
    dec = WavDecoder()
    got = _feed_in_pieces(dec, wav_header(22050) + encode_pcm16(audio))
    assert dec.sample_rate == 22050 and len(got) == 777


def test_wav_skips_odd_sized_extra_chunks_and_reads_concatenated_files():
    a, b = _audio(10, 1), _audio(11, 2)
    list_chunk = b"LIST" + struct.pack("<I", 3) + b"abc" + b"\x00"  # odd size -> pad byte
    pcm_a = encode_pcm16(a)
    first = (wav_header(8000, len(pcm_a))[:36] + list_chunk + b"data"
             + struct.pack("<I", len(pcm_a)) + pcm_a)
    second = wav_header(16000, len(encode_pcm16(b))) + encode_pcm16(b)
    dec = WavDecoder()
    got = _feed_in_pieces(dec, first + second)
    assert len(got) == 21 and dec.sample_rate == 16000
    assert np.array_equal(to_pcm16(got), to_pcm16(np.concatenate([a, b])))


def test_float32_stereo_wav_is_mixed_to_mono():
    frames = np.array([[0.5, -0.5], [0.25, 0.75]], dtype="<f4")
    fmt = struct.pack("<HHIIHH", 3, 2, 48000, 48000 * 8, 8, 32)
    data = frames.tobytes()
    wav = (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16)
           + fmt + b"data" + struct.pack("<I", len(data)) + data)
    dec = WavDecoder()
    assert np.array_equal(dec.feed(wav), np.array([0.0, 0.5], dtype=np.float32))
    assert dec.sample_rate == 48000


def test_non_wav_bytes_and_unsupported_encodings_raise():
    with pytest.raises(WireError, match="not a WAV"):
        WavDecoder().feed(b"ID3\x04" + b"\x00" * 20)
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 8000, 1, 8)  # 8-bit PCM
    with pytest.raises(WireError, match="unsupported WAV encoding"):
        WavDecoder().feed(b"RIFF\x00\x00\x00\x00WAVEfmt " + struct.pack("<I", 16) + fmt)


def test_sse_events_split_anywhere_yield_their_audio_and_stop_at_done():
    pcm = encode_pcm16(_audio(50))
    stream = (b": keep-alive\r\n\r\n" + sse_audio_event(pcm[:40]) + b"event: x\n"
              + b"data: " + base64.b64encode(pcm[40:]) + b"\n\n"  # bare base64 payload
              + b'data: {"type": "speech.audio.done", "usage": {}}\n\n' + b"data: [DONE]\n\n"
              + sse_audio_event(b"\x01\x02"))  # after [DONE]: ignored
    dec = SseDecoder()
    got = b"".join(b"".join(dec.feed(stream[i : i + 5])) for i in range(0, len(stream), 5))
    assert got == pcm and dec.done


def test_sse_error_event_and_garbage_raise():
    with pytest.raises(WireError, match="server error event"):
        SseDecoder().feed(b'data: {"type": "error", "error": {"message": "boom"}}\n\n')
    with pytest.raises(WireError, match="not base64"):
        SseDecoder().feed(b"data: not base64!!\n\n")


def test_metrics_text_round_trips_to_memory_rows():
    stages = [{"process": "talker", "pid": 11, "allocated_bytes": 5, "reserved_bytes": 8,
               "peak_bytes": 9, "rss_bytes": 100, "source": "torch"},
              {"process": 'c2w "0"', "pid": 12, "allocated_bytes": 1, "reserved_bytes": 2,
               "peak_bytes": 3, "rss_bytes": None, "source": "torch"}]
    text = exposition.render(stages, rss_bytes=4096, counters={"requests_total": 3})
    assert "# TYPE tts_bench_requests_total counter" in text
    rows = exposition.memory_rows(exposition.parse(text))
    assert rows[0] == {"process": "serve", "pid": None, "rss_bytes": 4096, "source": "rss"}
    assert rows[1] == stages[0]
    assert rows[2] == {k: v for k, v in stages[1].items() if v is not None}


def test_metrics_keep_their_names_and_types_for_any_prometheus_reader():
    from prometheus_client.parser import text_string_to_metric_families

    stages = [{"process": "code2wav-0", "pid": 7, "source": "rss", "allocated_bytes": 1, "reserved_bytes": 2,
               "peak_bytes": 3, "rss_bytes": 4, "prompt_cache_entries": 5, "prompt_cache_bytes": 6}]
    text = exposition.render(stages, rss_bytes=1 << 40, counters={
        "requests_total": 3, "request_failures_total": 1, "requests_in_flight": 2})
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert set(samples) == {
        "process_resident_memory_bytes", "tts_bench_stage_allocated_bytes", "tts_bench_stage_reserved_bytes",
        "tts_bench_stage_peak_bytes", "tts_bench_stage_rss_bytes", "tts_bench_stage_prompt_cache_entries",
        "tts_bench_stage_prompt_cache_bytes", "tts_bench_requests_total", "tts_bench_request_failures_total",
        "tts_bench_requests_in_flight"}
    assert samples["process_resident_memory_bytes"].value == 1 << 40  # big values survive the float format
    assert samples["tts_bench_stage_prompt_cache_bytes"].labels == {"process": "code2wav-0", "pid": "7", "source": "rss"}
    assert "# TYPE tts_bench_request_failures_total counter" in text
    assert "# TYPE tts_bench_requests_in_flight gauge" in text
    assert exposition.CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_metrics_of_a_foreign_server_keep_what_parses_before_a_bad_line():
    text = ('process_resident_memory_bytes 2048\n'
            'tts_bench_stage_rss_bytes{process="talker",pid="3",source="rss"} 1e3\n'
            'vllm_thing{broken 1\n'
            'tts_bench_stage_rss_bytes{process="late",pid="4",source="rss"} 5\n')
    rows = exposition.memory_rows(exposition.parse(text))
    assert rows == [{"process": "serve", "pid": None, "rss_bytes": 2048, "source": "rss"},
                    {"process": "talker", "pid": 3, "source": "rss", "rss_bytes": 1000}]
    assert exposition.parse("") == [] and exposition.memory_rows([]) == []


def test_a_wav_file_is_the_servers_header_and_pcm_and_what_stdlib_wave_writes(tmp_path):
    # The WER gate hashes WAV files; the transcript cache keys on those hashes: the bytes must
    # not depend on which writer made them.
    import wave

    x = _audio(2001) * 1.2  # some samples clip
    write_wav16(tmp_path / "a.wav", x, 24000)
    with wave.open(str(tmp_path / "b.wav"), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000)
        w.writeframes(to_pcm16(x).astype("<i2").tobytes())
    data = (tmp_path / "a.wav").read_bytes()
    assert data == (tmp_path / "b.wav").read_bytes()
    assert data == wav_header(24000, 2 * len(x)) + encode_pcm16(x)
