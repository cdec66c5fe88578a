"""Code2wav replicas as threads of one process: every replica (`runner.execution: threads`), or
k of them per process (`runner.replicas_per_process: k` with processes: a replica host).

Each replica is a `ReplicaLoop` on its own thread, with its own device stream, slot pool and
graphs, and its own inbox from the talker (the same messages as a replica process gets). They
share the modules (one copy of the weights per device) and the prompt setups. Why threads: as
processes, R replicas are R device contexts that the GPU time-slices, so one replica's small
kernels never overlap another's; as threads on separate streams of one context they do. But
threads share one interpreter: at 128x8 eight of them fell behind (mean RTF +99 % against
processes, D-EXEC-1), and four a host freed the talker (TTFP -19 %) while their own steps grew,
RTF within noise (D-EXEC-2). Which is why one replica a process is the default.

Each thread warms its engine's device graphs on its own stream before the process reports ready
(`warm_replica`), one thread at a time (`WARMUP_LOCK`). The process's own inbox carries only
control messages: the shutdown sentinel and stats queries (one answer for the process, with each
thread's work counters). Results from all threads go through one pipe, so sends are serialized
by a lock. A replica thread that fails unexpectedly reports Fatal and ends the process at once:
the client fails every request in flight on that process's replicas, as when a replica process
dies.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any

from stages.platform import resolve_device, set_current_device, thread_stream
from stages.platform.partition import SmPartition, on_partition
from stages.runner.messages import Fatal, StatsQuery
from stages.runner.process import ProcessSpec, StageContext, drain, run_stage_process, short_error
from stages.runner.replica_proc import ReplicaLoop, build_token2wav, voice_stats, warm_replica

log = logging.getLogger(__name__)

# A host's replica threads warm up one at a time. Their captures were serialized already
# (stages.platform.graphs.CAPTURE_LOCK), but one thread's eager first chunks ran beside another's
# capture: on an H200 at 128x8, with four replica threads a process, a start failed that way
# (cuBLAS CUBLAS_STATUS_EXECUTION_FAILED, then cuDNN "unable to find an engine" in the first
# eager chunk; CUDA may load a kernel lazily at its first launch, and loading can synchronize the
# context). Warmed, a replica runs only shapes it has loaded and captured.
WARMUP_LOCK = threading.Lock()


class LockedSender:
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
    sender = LockedSender(results)
    run_stage_process(spec, sender, lambda ctx: start_replica_threads(ctx, inboxes),
                      lambda ctx, threads: _serve(ctx, threads, control))


class ReplicaThread:
    """One replica's thread: on its own device stream it warms the engine's graphs (so the
    captures belong to the stream it will serve on), reports that through `warmed`, then serves
    its inbox until the sentinel."""

    def __init__(self, loop: ReplicaLoop, inbox: Any, partition: SmPartition | None = None) -> None:
        self.loop, self.inbox = loop, inbox
        self.partition = partition  # the SMs its streams run on; None: the whole device
        self.warmed = threading.Event()
        self.error: BaseException | None = None  # a warmup failure, raised by the host's build
        self.thread = threading.Thread(target=self._run, name=loop.ctx.spec.name, daemon=True)

    def _run(self) -> None:
        ctx = self.loop.ctx
        try:
            set_current_device(ctx.device)
            with on_partition(self.partition), thread_stream(ctx.device):
                try:
                    with WARMUP_LOCK:
                        warm_replica(ctx, self.loop.t2w)
                except BaseException as exc:  # noqa: BLE001 - the host's build reports it in Ready
                    self.error = exc
                    return
                finally:
                    self.warmed.set()
                self.loop.run(self.inbox)
        except BaseException as exc:  # noqa: BLE001 - a broken replica ends the process, loudly
            log.exception("%s failed", ctx.spec.name)
            try:
                ctx.results.send(Fatal(ctx.spec.name, short_error(exc)))
            finally:
                os._exit(1)


def start_replica_threads(ctx: StageContext, inboxes: list[Any], *,
                          partition: SmPartition | None = None) -> list[ReplicaThread]:
    """A replica thread per engine of `ctx.spec.replica_ids`, started and warmed; replicas on
    one device share modules and prompts. The threads warm up one at a time (WARMUP_LOCK).
    Replicas on `partition`'s device run on its SMs (streams, graph captures).
    Adds each replica's facts to ctx.info."""
    runner = ctx.spec.cfg.runner
    by_device: dict[Any, Any] = {}
    threads = []
    for r, index, inbox in zip(ctx.spec.replica_ids, ctx.spec.replica_device_indices(), inboxes):
        device = resolve_device(runner.device, index)
        set_current_device(device)
        spec = dataclasses.replace(ctx.spec, name=f"code2wav-{r}", replica_ids=(r,))
        rctx = dataclasses.replace(ctx, spec=spec, device=device, info={})
        t2w = build_token2wav(rctx, shared=by_device.get(device))
        by_device.setdefault(device, t2w)
        confined = partition if partition is not None and partition.covers(device) else None
        threads.append(ReplicaThread(ReplicaLoop(rctx, t2w), inbox, confined))
    set_current_device(ctx.device)
    for t in threads:
        t.thread.start()
    for t in threads:
        t.warmed.wait()
    failed = next((t.error for t in threads if t.error is not None), None)
    if failed is not None:
        raise failed
    for t in threads:
        rctx = t.loop.ctx
        ctx.info[rctx.spec.name] = {"device": str(rctx.device), **rctx.info}
        if t.partition is not None:
            ctx.info[rctx.spec.name]["partition_sms"] = t.partition.sms
    ctx.info["replicas"] = len(threads)
    return threads


def replica_work(threads: list[ReplicaThread]) -> tuple[dict, dict]:
    """The threads' work counters ({replica: counters}) and their voices, for a stats report.
    Read while the threads run: a step may be half counted."""
    work = {t.loop.ctx.spec.name: t.loop.work_snapshot() for t in threads}
    return work, voice_stats([t.loop.t2w for t in threads])


def _serve(ctx: StageContext, threads: list[ReplicaThread], control: Any) -> None:
    while True:
        for msg in drain(control, block=True):
            if msg is None:
                for t in threads:
                    t.inbox.put(None)
                for t in threads:
                    t.thread.join()
                return
            if isinstance(msg, StatsQuery):
                ctx.report_stats(msg.token, *replica_work(threads))
            else:
                raise TypeError(f"{ctx.spec.name} got an unexpected control message {type(msg).__name__}")
