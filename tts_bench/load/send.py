"""One request, end to end, and the open-loop schedule: what both kinds of phase send with.

The count phase (`tts_bench.load.loadgen.run_phase`) and the duration phase
(`tts_bench.load.loadwindow.run_timed_phase`) differ in when they send and how they label what
came back; sending is the same. A request becomes a `tts_bench.rundir.records.RequestRecord`:
- `audio_ttfp_ms` = first chunk arrival − send, `audio_rtf` = (last chunk arrival − send) /
  audio seconds, `audio_seconds`, `num_chunks`, `num_codes`;
- `audio_sha256` = sha256 of the audio as int16 PCM (`stages.audio.to_pcm16`: float32 ×
  32767, rounded, clipped, the rounding the server and the WAV writer use too), and
  `codes_sha256` over the codec tokens (int32) and `mel_sha256` over the chunks' mel digests
  (code2wav's flow output) when the backend reports them — equal hashes across arms mean
  identical outputs, stage by stage;
- failures never crash a phase: a timeout → `timeout`, `RequestFailed` → its kind, any other
  exception → `backend_error` with the message, a request with no samples → `empty_audio`.

Times are `time.perf_counter()` read in the client coroutine when a chunk *arrives*, like a
real client.

    rec = await run_request(backend, job, labels=PhaseLabels("base", "4x1", 0), timeout_s=120,
                            t0=time.perf_counter(), phase_id="p0")
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import numpy as np

from stages.audio import to_pcm16
from tts_bench.backends.base import Backend, RequestFailed, SynthesisRequest
from tts_bench.load.windows import PhaseRecord
from tts_bench.rundir.records import Job, PhaseLabels, RequestRecord


@dataclass(frozen=True)
class PhaseResult:
    records: list[RequestRecord]
    wall_s: float
    phase: PhaseRecord | None = None


Sink = Callable[[RequestRecord], None]


class _Collector:
    """Accumulates one request's chunks: arrival times, sample count, hashes."""

    def __init__(self, arrivals: list | None = None) -> None:
        self.arrivals = arrivals  # (arrival time, audio seconds) per chunk, when asked for
        self.first: float | None = None
        self.last: float | None = None
        self.samples = 0
        self.sample_rate = 0
        self.chunks = 0
        self.codes = 0
        self.audio_hash = hashlib.sha256()
        self.codes_hash = hashlib.sha256()
        self.mel_hash = hashlib.sha256()
        self.mels = 0
        self.prompt: dict = {}

    def add(self, chunk, arrival: float) -> None:
        if getattr(chunk, "prompt", None):
            self.prompt = chunk.prompt
        if self.first is None:
            self.first = arrival
        self.last = arrival
        self.chunks += 1
        self.samples += len(chunk.samples)
        self.sample_rate = chunk.sample_rate
        if self.arrivals is not None:
            self.arrivals.append((arrival, len(chunk.samples) / chunk.sample_rate))
        self.audio_hash.update(to_pcm16(np.asarray(chunk.samples, dtype=np.float32)).tobytes())
        if chunk.codes:
            self.codes += len(chunk.codes)
            self.codes_hash.update(np.asarray(chunk.codes, dtype=np.int32).tobytes())
        if getattr(chunk, "mel_sha256", ""):
            self.mels += 1
            self.mel_hash.update(bytes.fromhex(chunk.mel_sha256))


async def _consume(backend: Backend, request: SynthesisRequest, col: _Collector) -> None:
    stream = backend.synthesize(request)
    closer = contextlib.aclosing(stream) if hasattr(stream, "aclose") else contextlib.nullcontext()
    async with closer:
        async for chunk in stream:
            col.add(chunk, time.perf_counter())


async def _within(coro, timeout_s: float) -> None:
    # asyncio.timeout runs the request in the worker's own task, so the next request is sent in
    # the same loop step the previous one ends; wait_for (Python 3.10) adds a task and a step.
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(timeout_s):
            return await coro
    return await asyncio.wait_for(coro, timeout_s)


async def run_request(
    backend: Backend, job: Job, *, labels: PhaseLabels, timeout_s: float, t0: float, phase_id: str,
    chunks: list | None = None,
) -> RequestRecord:
    """Send one request, stream it to the end (or failure) and describe it as a record; with
    `chunks`, append (arrival offset from t0, audio seconds) of every chunk to it."""
    col = _Collector([] if chunks is not None else None)
    kind, detail = None, ""
    send = time.perf_counter()
    try:
        await _within(_consume(backend, job.request, col), timeout_s)
    except asyncio.TimeoutError:  # the builtin TimeoutError from 3.11 on
        kind, detail = "timeout", f"no end of audio after {timeout_s:g} s"
    except RequestFailed as exc:
        kind, detail = exc.kind, exc.detail
    except Exception as exc:  # any backend bug is a counted failure, never a crashed tier
        kind, detail = "backend_error", f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    if chunks is not None:
        chunks.extend((t - t0, sec) for t, sec in col.arrivals)
    if kind is None and col.samples == 0:
        kind, detail = "empty_audio", f"{col.chunks} chunks, 0 samples"
    fields = dict(
        arm=labels.arm, tier=labels.tier, repeat=labels.repeat, request_id=job.request.request_id,
        utt=job.utt, warmup=job.warmup, phase_id=phase_id, t_send_s=send - t0, t_end_s=end - t0,
        num_chunks=col.chunks, num_codes=col.codes, failure_kind=kind, failure_detail=detail,
        prompt_cache_hit=col.prompt.get("cache_hit"), prompt_setup_ms=col.prompt.get("setup_ms"),
    )
    if kind is not None:
        return RequestRecord(**fields)
    seconds = col.samples / col.sample_rate
    return RequestRecord(
        **fields,
        audio_ttfp_ms=(col.first - send) * 1000.0,
        audio_rtf=(col.last - send) / seconds,
        audio_seconds=seconds,
        audio_sha256=col.audio_hash.hexdigest(),
        codes_sha256=col.codes_hash.hexdigest() if col.codes else None,
        mel_sha256=col.mel_hash.hexdigest() if col.mels else None,
    )


async def sleep_until(t: float) -> None:
    """Sleep until perf_counter() reaches `t` (at once when it has)."""
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def send_on_schedule(
    due: Iterable[tuple[float, Callable[[], Job]]], concurrency: int, send: Callable, *,
    wait_until: Callable[[float], Awaitable[None]] = sleep_until, going: Callable[[], bool] = lambda: True,
) -> None:
    """Open loop, for count and duration phases alike: each (perf_counter time, job maker) waits
    for its time, then for a slot (at most `concurrency` in flight), and is sent; the job is made
    only once it is sent. Stops sending as soon as `going()` is false (a closing window)."""
    slots = asyncio.Semaphore(concurrency)
    tasks = []

    async def run(job: Job) -> None:
        try:
            await send(job)
        finally:
            slots.release()

    for at, make in due:
        await wait_until(at)
        if not going():
            break
        await slots.acquire()
        if not going():
            slots.release()
            break
        tasks.append(asyncio.create_task(run(make())))
    await asyncio.gather(*tasks)
