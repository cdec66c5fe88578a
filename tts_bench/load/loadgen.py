"""The load generator: keeps exactly C requests in flight against a started backend.

One call runs one *phase* (the warmup requests, or the measured ones) of one (arm, tier,
repeat): C worker coroutines pull jobs from a shared queue, so a new request is sent the moment
one finishes and the in-flight count stays at C until the queue drains. Times are
`time.perf_counter()` read in the client coroutine when a chunk *arrives*, like a real client.

Per request (a `tts_bench.rundir.records.RequestRecord`, handed to `sink` as soon as it finishes, so a killed run keeps
everything already measured):
- `audio_ttfp_ms` = first chunk arrival − send, `audio_rtf` = (last chunk arrival − send) /
  audio seconds, `audio_seconds`, `num_chunks`, `num_codes`;
- `audio_sha256` = sha256 of the audio as int16 PCM (`stages.audio.to_pcm16`: float32 ×
  32767, rounded, clipped, the rounding the server and the WAV writer use too), and
  `codes_sha256` over the codec tokens (int32) and `mel_sha256` over the chunks' mel digests
  (code2wav's flow output) when the backend reports them — equal hashes across arms mean
  identical outputs, stage by stage;
- failures never crash a phase: a timeout → `timeout`, `RequestFailed` → its kind, any other
  exception → `backend_error` with the message, a request with no samples → `empty_audio`.

    result = await run_phase(backend, jobs, concurrency=32, labels=PhaseLabels("base", "32x1", 0),
                             timeout_s=120, sink=run_dir.append_request)

Open loop (`arrivals`, `tts_bench.load.arrivals`): request k is due at its arrival offset, waits for
one of the C slots, and is sent then. Duration mode (`window`, `tts_bench.load.windows`): `jobs` is a
function from position to job (the prompt set cycles), the phase is ramp, window, drain, and the
records are labelled and handed to `sink` when it ends (`tts_bench.load.loadwindow`). Either way the
result carries the phase's `PhaseRecord` (count mode: the window is first send .. last end).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from stages.audio import to_pcm16
from tts_bench.backends.base import Backend, RequestFailed, SynthesisRequest
from tts_bench.rundir.records import Job, PhaseLabels, RequestRecord
from tts_bench.load.windows import PhaseRecord, WindowPlan

log = logging.getLogger(__name__)

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


async def run_phase(
    backend: Backend,
    jobs: Iterable[Job] | Callable[[int], Job],
    *,
    concurrency: int,
    labels: PhaseLabels,
    timeout_s: float,
    sink: Sink | None = None,
    progress: Sink | None = None,
    skip_ids: frozenset[str] | set[str] = frozenset(),
    arrivals: Iterator[float] | None = None,
    window: WindowPlan | None = None,
) -> PhaseResult:
    """Run `jobs` with exactly `concurrency` in flight (open loop with `arrivals`: at most that
    many); jobs whose id is in `skip_ids` (already completed, on resume) are not sent. Returns
    the new records in completion order. With `window`, `jobs` maps a position to its job and
    the phase is a duration-mode one (see the module docstring)."""
    if window is not None:
        from tts_bench.load.loadwindow import run_timed_phase

        return await run_timed_phase(backend, jobs, concurrency=concurrency, labels=labels, timeout_s=timeout_s,
                                     plan=window, sink=sink, progress=progress, arrivals=arrivals)
    todo = [job for job in jobs if job.request.request_id not in skip_ids] if arrivals is None else list(jobs)
    records: list[RequestRecord] = []
    phase_id = uuid.uuid4().hex[:12]
    t0 = time.perf_counter()

    async def send(job: Job) -> None:
        rec = await run_request(backend, job, labels=labels, timeout_s=timeout_s, t0=t0, phase_id=phase_id)
        records.append(rec)
        if sink is not None:
            sink(rec)
        if progress is not None:
            progress(rec)

    if arrivals is None:
        queue: asyncio.Queue[Job] = asyncio.Queue()
        for job in todo:
            queue.put_nowait(job)

        async def worker() -> None:
            while not queue.empty():
                await send(queue.get_nowait())

        await asyncio.gather(*(worker() for _ in range(min(concurrency, queue.qsize()))))
    else:
        # A skipped job (resume) keeps its arrival slot, unsent.
        due = ((t0 + at, lambda job=job: job) for job, at in zip(todo, arrivals)
               if job.request.request_id not in skip_ids)
        await send_on_schedule(due, concurrency, send)
    wall = time.perf_counter() - t0
    failed = sum(not r.ok for r in records)
    log.debug("%s %s r%d: %d requests, %d failed, %.2f s", labels.arm, labels.tier,
              labels.repeat, len(records), failed, wall)
    return PhaseResult(records, wall, count_phase(records, labels, phase_id))


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


def count_phase(records: list[RequestRecord], labels: PhaseLabels, phase_id: str) -> PhaseRecord:
    """A count-mode phase as a PhaseRecord: the window is first send .. last end of its records."""
    measured = [r for r in records if not r.warmup]
    start = min((r.t_send_s for r in measured), default=0.0)
    span = max((r.t_end_s for r in measured), default=start) - start
    audio = sum(r.audio_seconds for r in measured if r.ok)
    return PhaseRecord(labels.arm, labels.tier, labels.repeat, phase_id, "count", labels.repeat < 0, start,
                       span, audio, audio / span if span > 0 else None, len(measured),
                       invalid_reason=None if measured else "no measured requests")
