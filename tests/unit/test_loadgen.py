"""The load generator: exact concurrency, failure kinds, arrival-time metrics."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tts_bench.load import loadgen
from tts_bench.backends.base import AudioChunk, RequestFailed, SynthesisRequest
from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.config import BenchConfig, SyntheticConfig
from tts_bench.load.loadgen import run_phase
from tts_bench.load.send import run_request
from tts_bench.rundir.records import Job, PhaseLabels, RequestRecord

LABELS = PhaseLabels("base", "4x1", 0)


def synth(**kw) -> SyntheticBackend:
    params = dict(chunk_seconds=0.5, first_chunk_delay_s=0.004, chunk_delay_s=0.002, seconds_per_word=0.25)
    return SyntheticBackend(BenchConfig(backend="synthetic", synthetic=SyntheticConfig(**{**params, **kw})))


def jobs(n: int, text: str = "one two three four five six", warmup: bool = False) -> list[Job]:
    return [Job(SynthesisRequest(f"r{i:03d}", text), f"utt{i % 3}", warmup=warmup) for i in range(n)]


async def _run(backend, js, concurrency=4, timeout_s=5.0, **kw):
    await backend.start(1)
    try:
        return await run_phase(backend, js, concurrency=concurrency, labels=LABELS, timeout_s=timeout_s, **kw)
    finally:
        await backend.stop()


def test_exactly_c_requests_in_flight_until_the_queue_drains():
    backend = synth()
    result = asyncio.run(_run(backend, jobs(23), concurrency=4))
    assert len(result.records) == 23 and all(r.ok for r in result.records)
    assert backend.max_in_flight == 4
    # The first four ramp up; every later request starts with exactly C in flight (itself included).
    assert backend.in_flight_at_start[:4] == [1, 2, 3, 4]
    assert backend.in_flight_at_start[4:] == [4] * 19


def test_fewer_jobs_than_concurrency_sends_them_all_at_once():
    backend = synth()
    asyncio.run(_run(backend, jobs(3), concurrency=8))
    assert backend.in_flight_at_start == [1, 2, 3]


def test_warmup_jobs_are_recorded_and_flagged():
    result = asyncio.run(_run(synth(), jobs(3, warmup=True)))
    assert [r.warmup for r in result.records] == [True] * 3


def test_sink_and_progress_see_every_record_as_it_finishes():
    seen, ticks = [], []
    asyncio.run(_run(synth(), jobs(6), sink=seen.append, progress=ticks.append))
    assert sorted(r.request_id for r in seen) == [f"r{i:03d}" for i in range(6)]
    assert len(ticks) == 6


def test_skip_ids_are_not_sent():
    backend = synth()
    result = asyncio.run(_run(backend, jobs(6), skip_ids={"r001", "r004"}))
    assert sorted(r.request_id for r in result.records) == ["r000", "r002", "r003", "r005"]
    assert backend.requests_seen == 4


def test_slow_request_is_a_timeout_failure():
    result = asyncio.run(_run(synth(first_chunk_delay_s=0.2), jobs(2), timeout_s=0.02))
    assert [r.failure_kind for r in result.records] == ["timeout", "timeout"]
    assert all(r.audio_rtf is None for r in result.records)


def test_request_failed_keeps_its_kind():
    result = asyncio.run(_run(synth(fail_every=2), jobs(4), concurrency=1))
    kinds = [r.failure_kind for r in sorted(result.records, key=lambda r: r.request_id)]
    assert kinds == [None, "backend_error", None, "backend_error"]


class _Raising:
    async def synthesize(self, request):
        yield AudioChunk(np.zeros(10, np.float32), 1000)
        raise ValueError("kaboom")


class _Empty:
    async def synthesize(self, request):
        yield AudioChunk(np.zeros(0, np.float32), 1000)


def _one(backend, **kw) -> RequestRecord:
    job = jobs(1)[0]
    return asyncio.run(run_request(backend, job, labels=LABELS, timeout_s=1.0, t0=0.0, phase_id="p", **kw))


def test_any_other_exception_is_a_backend_error_with_the_message():
    rec = _one(_Raising())
    assert rec.failure_kind == "backend_error"
    assert "ValueError: kaboom" in rec.failure_detail


def test_no_samples_is_empty_audio():
    rec = _one(_Empty())
    assert rec.failure_kind == "empty_audio" and rec.num_chunks == 1
    empty_text = asyncio.run(_run(synth(), [Job(SynthesisRequest("e", ""), "u")]))
    assert empty_text.records[0].failure_kind == "empty_audio"


class _Scripted:
    """Two chunks (0.5 s + 1.5 s of audio at 1 kHz), with codes on the second."""

    async def synthesize(self, request):
        yield AudioChunk(np.full(500, 0.5, np.float32), 1000)
        yield AudioChunk(np.full(1500, -0.25, np.float32), 1000, codes=(7, 8, 9))


def test_ttfp_and_rtf_come_from_arrival_times(monkeypatch):
    clock = iter([10.0, 10.1, 10.3, 10.35])  # send, chunk 1, chunk 2, end
    monkeypatch.setattr(loadgen.time, "perf_counter", lambda: next(clock))
    rec = _one(_Scripted())
    assert rec.audio_ttfp_ms == pytest.approx(100.0)
    assert rec.audio_rtf == pytest.approx(0.3 / 2.0)
    assert rec.audio_seconds == pytest.approx(2.0)
    assert (rec.num_chunks, rec.num_codes) == (2, 3)
    assert (rec.t_send_s, rec.t_end_s) == (10.0, 10.35)


def test_audio_hash_is_sha256_of_int16_pcm():
    import hashlib

    rec = _one(_Scripted())
    pcm = np.concatenate([np.full(500, 16384, np.int16), np.full(1500, -8192, np.int16)])
    assert rec.audio_sha256 == hashlib.sha256(pcm.tobytes()).hexdigest()
    assert rec.codes_sha256 == hashlib.sha256(np.array([7, 8, 9], np.int32).tobytes()).hexdigest()


def test_record_round_trips_through_a_dict():
    rec = _one(_Scripted())
    assert RequestRecord.from_dict(rec.to_dict()) == rec


def test_request_failed_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="valid: timeout"):
        RequestFailed("oops")
