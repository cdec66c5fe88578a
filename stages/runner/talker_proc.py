"""The talker process: continuous batching of decode steps, chunking, routing to replicas.

Between two `engine.step()` calls it reads its inbox, so new requests join the running batch at
the next step (continuous batching) and cancels take effect at once. Each emitted code goes into
the request's chunker stream; every payload the chunker completes goes to the request's pinned
code2wav replica, batched into one queue put per replica per step.

Admission: at most `runner.talker_max_batch` requests are in the engine at once; the rest wait
here in arrival order (the engine's static KV cache has exactly that many slots).

A TraceQuery (`StageRunner.trace`) opens a profiler window in this process
(`stages.profiling.window`); it closes at the first step boundary after its seconds, busy or
idle, and the talker does not step while the trace is written and summed up.

Faults stay request-level; the process keeps serving:
- a request the engine refuses (`add` raises), whose chunker cannot be made, whose admission
  fails inside `step()` (the engine reports it with an `error`), or whose codes its chunker
  rejects, fails alone with a RequestError: `invalid_request` when the engine says it is the
  request's fault (`request_fault`, e.g. a seed >= 2**63 or a text too long for max_seq_len),
  `stage_error` otherwise;
- an error in the batched `step()` itself cannot be pinned on one request: every request in
  the engine fails with it (cancelled there, which frees their slots) and the loop goes on;
- only `MAX_FAILED_STEPS` failing steps in a row (a device that is gone) end the process
  (Fatal), and the client fails every in-flight request.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stages.profiling.window import ProfileWindow
from stages.runner.messages import (
    INVALID_REQUEST, STAGE_ERROR, Cancel, Drop, RequestError, Shutdown, StatsQuery, StatsReport, Submit,
    TraceQuery,
)
from stages.runner.process import ProcessSpec, StageContext, drain, run_stage_process, short_error
from stages.runner.work import WorkCounters

log = logging.getLogger(__name__)

MAX_FAILED_STEPS = 3  # consecutive failing engine steps before the talker gives up (Fatal)
_IDLE_TRACE_POLL_S = 0.01  # how often an idle talker checks whether its trace window is due


def _kind(exc: BaseException) -> str:
    return INVALID_REQUEST if getattr(exc, "request_fault", False) else STAGE_ERROR


@dataclass
class TalkerEngines:
    engine: Any
    make_chunker: Any  # (code2wav cfg, request_id) -> per-request chunker


def talker_main(spec: ProcessSpec, inbox: Any, replica_inboxes: list[Any], results: Any) -> None:
    """Process target (spawn): build the talker and run its loop until the shutdown sentinel."""
    run_stage_process(
        spec, results, build_talker,
        lambda ctx, engines: TalkerLoop(ctx, engines, replica_inboxes).run(inbox),
    )


def build_talker(ctx: StageContext) -> TalkerEngines:
    cfg, runner, make = ctx.spec.cfg, ctx.spec.cfg.runner, ctx.spec.factories
    engine = make.talker(
        cfg.talker,
        device=ctx.device,
        dtype=ctx.dtype,
        max_batch=runner.talker_max_batch,
        max_seq_len=runner.max_seq_len,
        init_seed=runner.seed,
        weights_dir=runner.weights,
    )
    describe = getattr(engine, "describe", None)
    if callable(describe):
        ctx.info["talker"] = describe()
    return TalkerEngines(engine, make.chunker)


@dataclass
class TalkerLoop:
    ctx: StageContext
    engines: TalkerEngines
    replica_inboxes: list[Any]
    waiting: deque[Submit] = field(default_factory=deque)
    pins: dict[str, int] = field(default_factory=dict)  # request in the engine -> replica
    chunkers: dict[str, Any] = field(default_factory=dict)  # request in the engine -> chunker
    failed_steps: int = 0  # consecutive engine steps that raised
    work: WorkCounters = field(default_factory=WorkCounters)  # rows: requests in a step
    trace: tuple[int, ProfileWindow] | None = None  # (token, window) while a TraceQuery runs

    def run(self, inbox: Any) -> None:
        engine = self.engines.engine
        while True:
            idle = not (self.waiting or engine.has_work())
            # An open trace window must close on time even with nothing to do.
            for msg in drain(inbox, block=idle and self.trace is None):
                if isinstance(msg, Shutdown):
                    self._close_trace()
                    self._flush_sent(msg.gone)
                    return
                if msg is None:  # the client died: nobody to flush for
                    return
                self._handle(msg)
            self._admit()
            if engine.has_work():
                self._step()
            elif self.trace is not None:
                time.sleep(_IDLE_TRACE_POLL_S)
            if self.trace is not None and self.trace[1].due():
                self._close_trace()

    def _flush_sent(self, gone: tuple[int, ...]) -> None:
        """Wait until every payload put for a live replica is in its pipe.

        A queue's feeder thread writes a large message (a voice of a few MB rides on a first
        payload) in pieces while its replica is busy decoding; exiting mid-message would leave
        the replica waiting forever for the rest. The runner sends the replicas their sentinel
        only after this process is gone, so they are still reading; a replica in `gone` reads
        nothing any more, so its queue is not waited on."""
        for r, queue in enumerate(self.replica_inboxes):
            queue.close()
            if r not in gone:
                queue.join_thread()

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            with self.trace[1].step() if self.trace is not None else contextlib.nullcontext():
                outputs = self.engines.engine.step()
        except Exception as exc:
            self.failed_steps += 1
            if self.failed_steps >= MAX_FAILED_STEPS:
                raise  # Fatal: the client fails everything in flight and stops serving
            log.warning("talker step failed, failing the %d request(s) in it: %s", len(self.pins), exc)
            for request_id in list(self.pins):
                self._fail(request_id, f"talker step failed: {short_error(exc)}", STAGE_ERROR)
            return
        self.failed_steps = 0
        # Rows: the requests that got a code (or finished) this step; backlog: requests still
        # waiting for a KV slot (only when C exceeds runner.talker_max_batch).
        self.work.add(len(outputs), time.perf_counter() - t0, len(self.waiting))
        self._route(outputs)

    def _fail(self, request_id: str, message: str, kind: str) -> None:
        """End one request here: out of the engine, its replica told to drop it, client told."""
        replica = self.pins.pop(request_id, None)
        self.chunkers.pop(request_id, None)
        try:
            self.engines.engine.cancel(request_id)
        except Exception as exc:  # noqa: BLE001 - the request is failing anyway
            log.warning("talker: cancelling failed %s: %s", request_id, exc)
        if replica is not None:
            self.replica_inboxes[replica].put(Drop(request_id))
        self.ctx.results.send(RequestError(request_id, f"talker: {message}", kind))

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, Submit):
            self.waiting.append(msg)
        elif isinstance(msg, Cancel):
            self._cancel(msg)
        elif isinstance(msg, StatsQuery):
            self._report_stats(msg.token)
        elif isinstance(msg, TraceQuery):
            self._open_trace(msg)
        else:
            raise TypeError(f"talker got an unexpected message {type(msg).__name__}")

    def _open_trace(self, msg: TraceQuery) -> None:
        if self.trace is not None:
            self._report_trace(msg.token, {"error": "a trace window is already open in this process; "
                                                    "wait for its answer"})
            return
        try:
            self.trace = (msg.token, ProfileWindow.open(seconds=msg.seconds, path=Path(msg.path),
                                                        device=self.ctx.device))
        except Exception as exc:  # noqa: BLE001 - the client gets the reason; serving goes on
            self._report_trace(msg.token, {"error": short_error(exc)})

    def _close_trace(self) -> None:
        if self.trace is None:
            return
        (token, window), self.trace = self.trace, None
        try:
            summary = window.close()
        except Exception as exc:  # noqa: BLE001 - as above
            log.warning("talker: closing the trace window failed: %s", exc)
            summary = {"error": short_error(exc)}
        self._report_trace(token, summary)

    def _report_trace(self, token: int, summary: dict) -> None:
        self.ctx.results.send(StatsReport(token, {"process": self.ctx.spec.name, "pid": os.getpid(),
                                                  "trace": summary}))

    def _report_stats(self, token: int) -> None:
        self.ctx.report_stats(token, {"talker": self.work_snapshot()})

    def work_snapshot(self) -> dict:
        return self.work.snapshot_with(self.engines.engine)

    def _admit(self) -> None:
        limit = self.ctx.spec.cfg.runner.talker_max_batch
        make_request = self.ctx.spec.factories.talker_request
        while self.waiting and len(self.pins) < limit:
            sub = self.waiting.popleft()
            req = sub.request
            try:
                self.engines.engine.add(
                    make_request(req.request_id, req.text, req.seed, req.max_codes)
                )
            except Exception as exc:  # a bad request fails alone
                log.warning("talker refused %s: %s", req.request_id, exc)
                self.ctx.results.send(
                    RequestError(req.request_id, f"talker: {short_error(exc)}", _kind(exc)))
                continue
            self.pins[req.request_id] = sub.replica
            try:
                # The request's seed travels with its payloads: code2wav seeds its vocoder noise
                # from it, so equal codes + seed give equal audio whatever the request is called.
                self.chunkers[req.request_id] = self.engines.make_chunker(
                    self.ctx.spec.cfg.code2wav, req.request_id, seed=req.seed,
                    prompt_audio=req.prompt_audio,
                )
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                self._fail(req.request_id, short_error(exc), _kind(exc))

    def _cancel(self, msg: Cancel) -> None:
        self.waiting = deque(s for s in self.waiting if s.request.request_id != msg.request_id)
        if self.pins.pop(msg.request_id, None) is not None:
            self.engines.engine.cancel(msg.request_id)
            del self.chunkers[msg.request_id]
        # Always tell the replica: payloads sent before the cancel may still be queued there.
        # Same sender, same queue, so the Drop arrives after every payload we sent for it.
        self.replica_inboxes[msg.replica].put(Drop(msg.request_id))

    def _route(self, outputs: list[Any]) -> None:
        # The engine never emits EOS as a code; filtering it anyway keeps an engine that does
        # from sending an id outside the flow vocabulary to code2wav.
        eos = self.ctx.spec.cfg.talker.eos_token_id
        batches: dict[int, list[Any]] = defaultdict(list)
        for out in outputs:
            replica = self.pins.get(out.request_id)
            if replica is None:  # cancelled while its step was running
                continue
            error = getattr(out, "error", None)  # its admission failed inside the step
            if error:
                self._fail(out.request_id, error, STAGE_ERROR)
                continue
            chunker = self.chunkers[out.request_id]
            try:
                if out.code is not None and out.code != eos:
                    batches[replica].extend(chunker.push((int(out.code),)))
                if out.finished:
                    batches[replica].append(chunker.finish())
            except Exception as exc:  # noqa: BLE001 - this request's stream fails alone
                batches[replica] = [p for p in batches[replica] if p.request_id != out.request_id]
                self._fail(out.request_id, short_error(exc), _kind(exc))
                continue
            if out.finished:
                del self.pins[out.request_id], self.chunkers[out.request_id]
        for replica, payloads in batches.items():
            if payloads:
                self.replica_inboxes[replica].put(payloads)
