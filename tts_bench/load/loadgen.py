"""The load generator: keeps exactly C requests in flight against a started backend.

One call runs one *phase* (the warmup requests, or the measured ones) of one (arm, tier,
repeat): C worker coroutines pull jobs from a shared queue, so a new request is sent the moment
one finishes and the in-flight count stays at C until the queue drains. Times are
`time.perf_counter()` read in the client coroutine when a chunk *arrives*, like a real client.

Each request becomes a `tts_bench.rundir.records.RequestRecord` (`tts_bench.load.send.run_request`:
what it measures), handed to `sink` as soon as it finishes, so a killed run keeps everything
already measured.

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
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

from tts_bench.backends.base import Backend
from tts_bench.rundir.records import Job, PhaseLabels, RequestRecord
from tts_bench.load.loadwindow import run_timed_phase
from tts_bench.load.send import PhaseResult, Sink, run_request, send_on_schedule
from tts_bench.load.windows import PhaseRecord, WindowPlan

log = logging.getLogger(__name__)


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


def count_phase(records: list[RequestRecord], labels: PhaseLabels, phase_id: str) -> PhaseRecord:
    """A count-mode phase as a PhaseRecord: the window is first send .. last end of its records."""
    measured = [r for r in records if not r.warmup]
    start = min((r.t_send_s for r in measured), default=0.0)
    span = max((r.t_end_s for r in measured), default=start) - start
    audio = sum(r.audio_seconds for r in measured if r.ok)
    return PhaseRecord(labels.arm, labels.tier, labels.repeat, phase_id, "count", labels.repeat < 0, start,
                       span, audio, audio / span if span > 0 else None, len(measured),
                       invalid_reason=None if measured else "no measured requests")
