"""The duration-mode half of the load generator: ramp, measured window, drain.

Called by `tts_bench.load.loadgen.run_phase` when it is given a `WindowPlan` (what the phase
measures and why: `tts_bench.load.windows`). Closed loop: C workers send job 0, 1, 2, ... (the
caller's `job_at` cycles the prompt set) while the phase is sending. Open loop: job k is due at
its arrival offset and waits for one of the C slots. A controller decides the edges:

- the window opens when `ramp_s` has passed and (closed loop) C requests are in flight; a closed
  loop that has not filled C by `ramp_s + duration_s` stops and is invalid (it would have
  measured a ramp);
- it closes `duration_s` later; with `until_stable`, an unstable window gets one more
  sub-window at a time up to the cap (decided from the requests finished so far; the phase's
  `stable` flag is computed again after the drain, from every chunk);
- then nothing new is sent and the requests in flight finish (drain).

Only then are the records labelled (sent in ramp / window / drain; only window requests are
measured, the others are flagged warmup) with the audio each delivered inside the window, and
handed to `sink`, so a phase is the unit of --resume in duration mode. The controller reads the
clock when it wakes: a request a worker sends in the instant between the window's end and that
wake-up is labelled drain, never counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

from tts_bench.backends.base import Backend
from tts_bench.rundir.records import Job, PhaseLabels, RequestRecord
from tts_bench.load.send import PhaseResult, run_request, send_on_schedule
from tts_bench.load.windows import PhaseRecord, WindowPlan, audio_between, is_stable, sub_windows

log = logging.getLogger(__name__)


@dataclass
class _Live:
    """What the controller and the senders share during one phase."""

    t0: float
    concurrency: int
    sending: bool = True
    in_flight: int = 0
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self.filled = asyncio.Event()
        self.stopped = asyncio.Event()  # set when nothing new may be sent
        self.done: list[tuple[RequestRecord, list]] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0


async def run_timed_phase(
    backend: Backend, job_at: Callable[[int], Job], *, concurrency: int, labels: PhaseLabels,
    timeout_s: float, plan: WindowPlan, sink=None, progress=None, arrivals: Iterator[float] | None = None,
) -> PhaseResult:
    """One duration-mode phase (see the module docstring)."""
    live = _Live(time.perf_counter(), concurrency)
    phase_id = uuid.uuid4().hex[:12]

    async def send(job: Job) -> None:
        live.in_flight += 1
        live.max_in_flight = max(live.max_in_flight, live.in_flight)
        if live.in_flight >= concurrency:
            live.filled.set()
        chunks: list = []
        try:
            rec = await run_request(backend, job, labels=labels, timeout_s=timeout_s, t0=live.t0,
                                    phase_id=phase_id, chunks=chunks)
        finally:
            live.in_flight -= 1
        live.done.append((rec, chunks))
        if progress is not None:
            progress(rec)

    positions = itertools.count()
    if arrivals is None:
        async def worker() -> None:
            while live.sending:
                await send(job_at(next(positions)))
                # A request that ends without ever suspending (a backend failing at once) would
                # otherwise starve the controller: one loop step between requests.
                await asyncio.sleep(0)

        senders = [asyncio.create_task(worker()) for _ in range(concurrency)]
    else:
        senders = [asyncio.create_task(_dispatch(live, job_at, positions, arrivals, send))]
    try:
        w0, w1, reason = await _control(live, plan, closed=arrivals is None)
    finally:
        live.sending = False
        live.stopped.set()
    await asyncio.gather(*senders)
    wall = live.now()
    records, phase = _label(live, labels, phase_id, plan, (w0, w1), reason, arrivals)
    for rec in records:
        if sink is not None:
            sink(rec)
    log.debug("%s %s r%d: window %.2f-%.2f s, %d requests in it, %s", labels.arm, labels.tier, labels.repeat,
              w0, w1, phase.requests_in_window, phase.invalid_reason or f"stable={phase.stable}")
    return PhaseResult([r for r in records if not r.warmup], wall, phase)


async def _dispatch(live: _Live, job_at, positions, arrivals, send) -> None:
    """Open loop: each arrival waits for a slot (at most C in flight), then is sent, until the
    phase stops sending (`send_on_schedule`)."""
    async def wait_until(t: float) -> None:  # the next arrival, unless the phase stops sending first
        delay = t - time.perf_counter()
        if delay > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(live.stopped.wait(), delay)

    due = ((live.t0 + at, lambda: job_at(next(positions))) for at in arrivals)
    await send_on_schedule(due, live.concurrency, send, wait_until=wait_until, going=lambda: live.sending)


async def _control(live: _Live, plan: WindowPlan, *, closed: bool) -> tuple[float, float, str | None]:
    """The window's (start, end) offsets, and why the phase is invalid (None when it is not)."""
    await asyncio.sleep(plan.ramp_s)
    if closed and not live.filled.is_set():
        try:
            await asyncio.wait_for(live.filled.wait(), plan.duration_s)
        except asyncio.TimeoutError:
            at = live.now()
            return at, at, (f"C={live.concurrency} requests were never in flight at once ({live.max_in_flight} at "
                            f"most) before the window would have ended ({at:.2f} s); the phase would have "
                            f"measured a ramp: lower C or make requests last longer")
    w0 = live.now()
    w1 = w0 + plan.duration_s
    while True:
        await asyncio.sleep(max(0.0, w1 - live.now()))
        if not plan.until_stable or w1 + plan.window_s > w0 + plan.cap_s + 1e-9:
            return w0, w1, None
        if _stable_so_far(live, w0, w1, plan):
            return w0, w1, None
        w1 += plan.window_s


def _stable_so_far(live: _Live, w0: float, w1: float, plan: WindowPlan) -> bool:
    """until_stable's decision: the sub-windows from what has arrived and finished so far."""
    sends = [(r.t_send_s, r.audio_rtf) for r, _ in live.done]
    subs = sub_windows(w0, w1, plan.window_s, sends, [c for _, c in live.done])
    return bool(is_stable(subs, plan.stability_pct))


def _label(live: _Live, labels: PhaseLabels, phase_id: str, plan: WindowPlan, bounds: tuple[float, float],
           reason: str | None, arrivals) -> tuple[list[RequestRecord], PhaseRecord]:
    """The records, each with its part of the phase and its audio inside the window, in send
    order; and the phase's record (throughput, sub-windows, stability, validity)."""
    w0, w1 = bounds
    done = sorted(live.done, key=lambda rc: rc[0].t_send_s)
    records = []
    for rec, chunks in done:
        part = "ramp" if rec.t_send_s < w0 else "window" if rec.t_send_s < w1 else "drain"
        records.append(replace(rec, window=part, warmup=rec.warmup or part != "window" or reason is not None,
                               audio_s_in_window=audio_between(chunks, w0, w1)))
    in_window = [r for r, _ in done if w0 <= r.t_send_s < w1]
    if reason is None and not in_window:
        reason = (f"no request was sent inside the {w1 - w0:.2f} s window; lengthen bench.duration_s "
                  f"or check the backend")
    subs = [] if reason else sub_windows(w0, w1, plan.window_s, [(r.t_send_s, r.audio_rtf) for r, _ in done],
                                         [c for _, c in done])
    audio = sum(audio_between(c, w0, w1) for _, c in done)
    phase = PhaseRecord(
        labels.arm, labels.tier, labels.repeat, phase_id, "duration", labels.repeat < 0, w0, w1 - w0, audio,
        audio / (w1 - w0) if w1 > w0 and reason is None else None, len(in_window), ramp_s=w0,
        max_in_flight=live.max_in_flight, sub_windows=[asdict(s) for s in subs],
        stable=None if reason else is_stable(subs, plan.stability_pct), stability_pct=plan.stability_pct,
        request_rate=getattr(arrivals, "rate", None), burstiness=getattr(arrivals, "burstiness", None),
        invalid_reason=reason,
    )
    return records, phase
