"""The code2wav replicas as threads of one process (`runner.execution: threads`).

Each replica is a `ReplicaLoop` on its own thread, with its own device stream, slot pool and
graphs, and its own inbox from the talker (the same messages as a replica process gets). They
share the modules (one copy of the weights per device) and the prompt setups. Why threads: as
processes, R replicas are R device contexts that the GPU time-slices, so one replica's small
kernels never overlap another's; as threads on separate streams of one context they do
(measured on an H200: docs in stages/runner/__init__.py).

The process's own inbox carries only control messages: the shutdown sentinel and memory
queries (one answer for the process). Results from all threads go through one pipe, so sends
are serialized by a lock. A replica thread that fails unexpectedly reports Fatal and ends the
process at once: the client fails every request in flight, as when a replica process dies.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any

from stages.platform import resolve_device, set_current_device, thread_stream
from stages.runner.messages import Fatal, MemoryQuery
from stages.runner.process import ProcessSpec, StageContext, drain, run_stage_process, short_error
from stages.runner.replica_proc import ReplicaLoop, build_token2wav, voice_stats

log = logging.getLogger(__name__)


class _LockedSender:
    """`send` / `close` of a Connection, safe to call from several threads."""

    def __init__(self, conn: Any) -> None:
        self._conn, self._lock = conn, threading.Lock()

    def send(self, msg: Any) -> None:
        with self._lock:
            self._conn.send(msg)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def replica_host_main(spec: ProcessSpec, control: Any, inboxes: list[Any], results: Any) -> None:
    """Process target (spawn): build one Token2Wav per replica, serve them on threads."""
    sender = _LockedSender(results)
    run_stage_process(spec, sender, _build, lambda ctx, engines: _serve(ctx, engines, control, inboxes))


def _build(ctx: StageContext) -> list[tuple[StageContext, Any]]:
    """(context, token2wav) per replica; replicas on one device share modules and prompts."""
    runner = ctx.spec.cfg.runner
    by_device: dict[Any, Any] = {}
    engines = []
    for r, index in zip(ctx.spec.replica_ids, ctx.spec.device_indices()):
        device = resolve_device(runner.device, index)
        set_current_device(device)
        spec = dataclasses.replace(ctx.spec, name=f"code2wav-{r}", replica_ids=(r,))
        rctx = dataclasses.replace(ctx, spec=spec, device=device, info={})
        t2w = build_token2wav(rctx, shared=by_device.get(device))
        by_device.setdefault(device, t2w)
        engines.append((rctx, t2w))
        ctx.info[f"code2wav-{r}"] = {"device": str(device), **rctx.info}
    set_current_device(ctx.device)
    ctx.info["replicas"] = len(engines)
    return engines


def _serve(ctx: StageContext, engines: list[tuple[StageContext, Any]], control: Any, inboxes: list[Any]) -> None:
    threads = [
        threading.Thread(target=_replica_thread, args=(rctx, t2w, inbox), name=rctx.spec.name, daemon=True)
        for (rctx, t2w), inbox in zip(engines, inboxes)
    ]
    for t in threads:
        t.start()
    while True:
        for msg in drain(control, block=True):
            if msg is None:
                for inbox in inboxes:
                    inbox.put(None)
                for t in threads:
                    t.join()
                return
            if isinstance(msg, MemoryQuery):
                ctx.report_memory(msg.token, voice_stats([t2w for _, t2w in engines]))
            else:
                raise TypeError(f"{ctx.spec.name} got an unexpected control message {type(msg).__name__}")


def _replica_thread(ctx: StageContext, t2w: Any, inbox: Any) -> None:
    try:
        set_current_device(ctx.device)
        with thread_stream(ctx.device):
            ReplicaLoop(ctx, t2w).run(inbox)
    except BaseException as exc:  # noqa: BLE001 - a broken replica ends the process, loudly
        log.exception("%s failed", ctx.spec.name)
        try:
            ctx.results.send(Fatal(ctx.spec.name, short_error(exc)))
        finally:
            os._exit(1)
