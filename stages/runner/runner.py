"""The stage runner, client side: spawns the talker + R code2wav replicas and routes their events.

    runner = StageRunner(stage_cfg, replicas=2)
    runner.start()                                    # raises RunnerError with a child's trace
    runner.submit(RunnerRequest("r1", "Hello there."), on_event)
    ...                                               # on_event(ChunkReady | RequestError),
    runner.memory_snapshot()                          #   called on the runner's reader thread
    runner.work_snapshot()                            # each stage's loop counters (stages.runner.work)
    runner.trace(2.0, "trace.json.gz")                # a profiler window in the talker's process
    runner.stop()

Topology (DESIGN.md §3): the talker and R code2wav replicas, as 1 + R processes
(`runner.execution: processes`, what `auto` picks), a talker process and R threads of another
with a device stream each (`threads`), or the talker and R replica threads in one process
(`single`: one device context), placed on `runner.devices`. Processes on one CUDA device share
it as `runner.sharing` says: time-sliced contexts, or clients of a private MPS daemon this runner
starts before its children and quits after them (`stages.runner.sharing`). A request
is pinned at admission to the replica with the fewest requests in flight (ties: lowest index),
so its chunks decode in order on one replica and come back straight from it. Each child has its
own one-way result pipe whose only write end lives in that child; one reader thread waits on all
of them and calls the request's `on_event`. A child that dies (even without a word: a segfault,
the OOM killer, mid-message) closes its pipe, the reader sees EOF, fails every in-flight request
with the child's name and exit code, and the runner refuses new work (`broken` says why). That is
"the run ends": the harness sees failures, not a hang. A fault of one request (refused, failed
admission, a decode error) is not a death: the stage fails that request with a typed
RequestError kind and keeps serving (talker_proc.py, replica_proc.py). Children are started with
SIGINT blocked and ignore it (`stages.signals`): Ctrl-C is the parent's, which stops them. (A shared mp.Queue would not do: a writer killed mid-message
leaves a torn message that blocks the reader forever, and other writers keep the pipe open.)

`on_event` runs on the reader thread and must not block (the asyncio backend hands events over
with `loop.call_soon_threadsafe`). Every request ends with exactly one of: a ChunkReady with
`last_chunk`, or a RequestError. Nothing here touches a device: the client process never
creates a CUDA context (with `runner.sharing: auto` it asks whether CUDA is there at all).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from stages.config import StageConfig, replica_groups, resolve_execution
from stages.platform import device_count
from stages.platform.device import CUBLAS_WORKSPACE, CUBLAS_WORKSPACE_ENV
from stages.precision import ready_phrase
from stages.runner.factories import StageFactories
from stages.runner.messages import (
    RUNNER_BROKEN,
    Cancel,
    ChunkReady,
    Fatal,
    Ready,
    RequestError,
    RunnerEvent,
    RunnerRequest,
    Shutdown,
    StatsQuery,
    StatsReport,
    Submit,
    TraceQuery,
)
from stages.runner.placement import place, resolve_devices
from stages.runner.process import ProcessSpec, threads_per_process
from stages.runner.replica_host import replica_host_main
from stages.runner.replica_proc import replica_main
from stages.runner.sharing import Sharing
from stages.runner.single_proc import single_main
from stages.runner.talker_proc import talker_main
from stages.signals import interrupts_blocked

log = logging.getLogger(__name__)

_POLL_S = 0.1  # wait granularity (seconds) while waiting for Ready or joining children
_STATS_TIMEOUT_S = 10.0
_TRACE_CLOSE_S = 300.0  # writing and summarizing a busy window's trace, after the window itself


class RunnerError(RuntimeError):
    """The runner could not start, or was used in a state that cannot serve (not started)."""


@dataclass
class _Tracked:
    replica: int
    on_event: Callable[[RunnerEvent], None]
    next_seq: int = 0


@dataclass
class _Child:
    name: str
    process: Any  # mp.Process
    inbox: Any  # mp.Queue: client (and talker) -> this process
    results: Connection  # read end of this process's result pipe
    replicas: tuple[int, ...] = ()  # the replicas it hosts (gone with it if it dies)


class StageRunner:
    """Talker + R code2wav replica processes behind submit / cancel / memory_snapshot / work_snapshot."""

    def __init__(self, cfg: StageConfig, replicas: int, *, factories: StageFactories | None = None,
                 concurrency: int | None = None):
        """`concurrency`: the requests clients will keep in flight, when known (a benchmark
        tier's C): each replica sizes its slot pool for its share up front."""
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.cfg = cfg
        self.replicas = replicas
        # Up to C requests are tracked at once (a request counts until its last audio arrives,
        # also after the talker has finished generating it), so least-loaded routing gives a
        # replica at most ceil(C / R), whatever runner.talker_max_batch admits at a time.
        self._live_per_replica = 0 if concurrency is None else -(-concurrency // replicas)
        self.factories = factories or StageFactories()
        self.execution = resolve_execution(cfg.runner)
        self.info: dict[str, dict] = {}  # process name -> facts from its Ready
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._load = [0] * replicas
        self._broken: str | None = None  # why the runner stopped serving
        self._closing = False
        self._reader: threading.Thread | None = None
        self._tokens = itertools.count(1)
        self._reports: dict[int, list[dict]] = {}
        self._reports_cv = threading.Condition(self._lock)
        self._sharing = Sharing()  # runner.sharing, resolved (and its daemon started) at start
        self._stopping: Any = None  # an mp.Event every child sees: set when stop() begins

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn every process and wait until all built their models; raises RunnerError."""
        if self._children:
            raise RunnerError("error: stage runner started twice (start); use a fresh StageRunner")
        ctx = mp.get_context("spawn")
        self._stopping = ctx.Event()
        self._sharing = Sharing.start(self.cfg.runner, self.execution)
        per_process = self.cfg.runner.replicas_per_process
        groups = replica_groups(self.execution, self.replicas, per_process, self._replica_devices())
        threads = threads_per_process(self.cfg.runner.torch_threads, len(groups))
        replica_inboxes = [ctx.Queue() for _ in range(self.replicas)]
        t0 = time.perf_counter()
        talker_inbox = ctx.Queue()
        if self.execution == "single":  # one process: the talker, and the replicas as threads
            spec = self._spec("stages", threads, tuple(range(self.replicas)), hosts_talker=True)
            self._spawn(ctx, "stages", talker_inbox, single_main,
                        lambda write: (spec, talker_inbox, replica_inboxes, write), spec.replica_ids)
        else:
            self._spawn(ctx, "talker", talker_inbox, talker_main,
                        lambda write: (self._spec("talker", threads, ()), talker_inbox, replica_inboxes, write))
        for g, ids in enumerate(groups):
            if self.execution == "processes" and per_process == 1:  # a replica, a process
                (r,) = ids
                self._spawn(ctx, f"code2wav-{r}", replica_inboxes[r], replica_main,
                            lambda write, r=r: (self._spec(f"code2wav-{r}", threads, (r,)), replica_inboxes[r], write),
                            ids)
                continue
            # replica threads: the host's own inbox carries control only
            name = "code2wav" if self.execution == "threads" else f"code2wav-host-{g}"
            control, inboxes = ctx.Queue(), [replica_inboxes[r] for r in ids]
            self._spawn(ctx, name, control, replica_host_main,
                        lambda write, name=name, ids=ids, control=control, inboxes=inboxes: (
                            self._spec(name, threads, ids), control, inboxes, write), ids)
        try:
            self._await_ready()
        except BaseException:
            self.stop(timeout_s=0.0)  # the others are still building: nothing to wait for
            raise
        replica = next(iter(self.replica_info().values()), {})
        log.info("runner ready: talker + %d replica(s) as %s (%d replica process(es); sharing %s, %s) "
                 "in %.1f s, %d torch thread(s) per process; %s", self.replicas, self.execution, len(groups),
                 self.sharing, self._sharing.why, time.perf_counter() - t0, threads,
                 ready_phrase(replica.get("code2wav"), deterministic=self.cfg.runner.deterministic))
        self._reader = threading.Thread(target=self._read_loop, name="stage-runner-reader", daemon=True)
        self._reader.start()

    @property
    def sharing(self) -> str:
        """`runner.sharing` as resolved at start ("time-sliced" before it)."""
        return self._sharing.mode

    def _replica_devices(self) -> tuple[int, ...] | None:
        """Each replica's device index where replica hosts must keep to one device each (processes
        hosting several replicas under a `runner.devices` list or `auto`); else None. The same
        plan every child computes (`ProcessSpec.placement`); an explicit list is checked there,
        against the devices the child sees, and only `auto` asks for the device count here."""
        runner = self.cfg.runner
        if self.execution != "processes" or runner.replicas_per_process == 1 or runner.devices is None:
            return None
        listed = runner.devices if runner.devices != "auto" else resolve_devices("auto", device_count(runner.device))
        return place(listed, self.replicas).replicas

    def _spec(self, name: str, threads: int, replica_ids: tuple[int, ...], *, hosts_talker: bool = False) -> ProcessSpec:
        env = self._sharing.env_for(talker=hosts_talker or not replica_ids)
        if self.cfg.runner.deterministic and CUBLAS_WORKSPACE_ENV not in os.environ:
            env += ((CUBLAS_WORKSPACE_ENV, CUBLAS_WORKSPACE),)  # cuBLAS reads it once, at its start
        return ProcessSpec(name, self.cfg, self.factories, threads, replica_ids, self.replicas, hosts_talker,
                           self._live_per_replica, env, self._stopping)

    def _spawn(self, ctx, name: str, inbox, target, args, replicas: tuple[int, ...] = ()) -> None:
        read_end, write_end = ctx.Pipe(duplex=False)
        process = ctx.Process(target=target, args=args(write_end), name=f"tts-{name}", daemon=True)
        with interrupts_blocked():  # Ctrl-C and SIGTERM are the parent's to handle (stages.signals)
            process.start()
        write_end.close()  # the child holds the only write end: its death means EOF here
        self._children.append(_Child(name, process, inbox, read_end, replicas))

    def _await_ready(self) -> None:
        waiting = {c.results: c for c in self._children}
        deadline = time.monotonic() + self.cfg.runner.start_timeout_s
        while waiting:
            ready = wait(list(waiting), timeout=_POLL_S)
            if not ready and time.monotonic() > deadline:
                raise RunnerError(
                    f"error: {', '.join(sorted(c.name for c in waiting.values()))} not ready "
                    f"after {self.cfg.runner.start_timeout_s:.0f} s (stage runner start); raise "
                    f"runner.start_timeout_s or check the device"
                )
            for conn in ready:
                child = waiting.pop(conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    child.process.join(timeout=1.0)
                    raise RunnerError(
                        f"error: {child.name} exited with code {child.process.exitcode} before "
                        f"it was ready (stage runner start); see its log above"
                    ) from None
                if not isinstance(msg, Ready):
                    raise RunnerError(f"{child.name} sent {type(msg).__name__} before Ready")
                if msg.error is not None:
                    raise RunnerError(
                        f"error: {msg.process} failed to start (stage runner start); "
                        f"fix the stage config or environment:\n{msg.error}"
                    )
                self.info[msg.process] = {"pid": msg.pid, **msg.info}

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut every process down (sentinel, join, kill); fail what is in flight.
        The talker stops first, then the replicas (at most 1.5 x `timeout_s` in all)."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        if self._stopping is not None:  # replicas stop decoding now and only read (replica_proc)
            self._stopping.set()
        deadline = time.monotonic() + timeout_s
        # The talker first: it flushes the payloads it queued for the replicas, which must still
        # be reading them (a replica stopped first would leave a half-written message behind,
        # and the talker blocked on it), then the replicas, which get at least half the time
        # even when the talker used all of it.
        talker, replicas = self._children[:1], self._children[1:]
        for group, sentinel in ((talker, Shutdown(self._gone_replicas())), (replicas, None)):
            if group is replicas:
                deadline = max(deadline, time.monotonic() + timeout_s / 2)
            for child in group:
                try:
                    child.inbox.put(sentinel)
                except (OSError, ValueError):  # queue already closed
                    pass
            for child in group:
                # The reader keeps draining result pipes meanwhile, so no child blocks in send().
                while child.process.is_alive() and time.monotonic() < deadline:
                    child.process.join(timeout=_POLL_S)
                    if self._reader is None:
                        self._discard_results(child)
        for child in self._children:
            if child.process.is_alive():  # children ignore SIGTERM (stages.signals): SIGKILL
                if timeout_s > 0:
                    doing = "a talker step or flushing its payloads" if child is self._children[0] else "a decode"
                    log.warning("%s did not stop in %.0f s (still in %s); killing it", child.name, timeout_s, doing)
                child.process.kill()
                child.process.join()
        if self._reader is not None:
            self._reader.join()
        self._fail_all("stage runner stopped")
        for child in self._children:
            child.inbox.close()
            child.inbox.cancel_join_thread()
            child.results.close()
        self._sharing.stop()  # its clients are gone: an MPS server can finish

    def _gone_replicas(self) -> tuple[int, ...]:
        """Replicas whose process died (a host of replica threads takes all of its own)."""
        return tuple(sorted(r for child in self._children[1:] if not child.process.is_alive()
                            for r in child.replicas))

    @staticmethod
    def _discard_results(child: _Child) -> None:
        try:
            while child.results.poll():
                child.results.recv()
        except (EOFError, OSError):
            pass

    def replica_info(self) -> dict[str, dict]:
        """Each replica's facts from Ready ("code2wav-<r>" -> dict), whatever the execution: a
        replica process reports its own, a process hosting replica threads one entry per thread."""
        facts: dict[str, dict] = {}
        for process, info in self.info.items():
            if "replicas" in info:  # a host of replica threads: an entry per thread
                facts.update({k: v for k, v in info.items() if k.startswith("code2wav-")})
            elif process.startswith("code2wav-"):
                facts[process] = info
        return facts

    def pids(self) -> dict[str, int | None]:
        return {c.name: c.process.pid for c in self._children}

    def alive(self) -> list[str]:
        """Names of the stage processes still running."""
        return [c.name for c in self._children if c.process.is_alive()]

    @property
    def broken(self) -> str | None:
        """Why the runner no longer serves (a stage process died), or None while it does."""
        return self._broken

    # -- requests ----------------------------------------------------------------------------

    def submit(self, request: RunnerRequest, on_event: Callable[[RunnerEvent], None]) -> int:
        """Queue `request`; returns the replica it is pinned to. Events go to `on_event`.

        A runner that is broken or stopped fails the request at once (through `on_event`).
        """
        if self._reader is None:
            raise RunnerError("error: submit before start (stage runner); call start() first")
        with self._lock:
            failure = self._broken or ("stage runner stopped" if self._closing else None)
            if failure is None:
                if request.request_id in self._tracked:
                    raise ValueError(f"request id {request.request_id!r} is already in flight")
                replica = min(range(self.replicas), key=lambda r: (self._load[r], r))
                self._tracked[request.request_id] = _Tracked(replica, on_event)
                self._load[replica] += 1
        if failure is not None:
            on_event(RequestError(request.request_id, failure, RUNNER_BROKEN))
            return -1
        self._children[0].inbox.put(Submit(request, replica))
        return replica

    def cancel(self, request_id: str) -> None:
        """Stop a request (e.g. the client timed out); no further events are delivered for it."""
        tracked = self._untrack(request_id)
        if tracked is not None and not self._closing:
            self._children[0].inbox.put(Cancel(request_id, tracked.replica))

    def in_flight(self) -> dict[str, int]:
        """Request id -> pinned replica, for the requests not finished yet."""
        with self._lock:
            return {rid: t.replica for rid, t in self._tracked.items()}

    def _untrack(self, request_id: str) -> _Tracked | None:
        with self._lock:
            tracked = self._tracked.pop(request_id, None)
            if tracked is not None:
                self._load[tracked.replica] -= 1
            return tracked

    def _fail_all(self, message: str) -> None:
        with self._lock:
            tracked, self._tracked = self._tracked, {}
            self._load = [0] * self.replicas
        for rid, t in tracked.items():
            t.on_event(RequestError(rid, message, RUNNER_BROKEN))

    # -- memory and work -----------------------------------------------------------------------

    def memory_snapshot(self, timeout_s: float = _STATS_TIMEOUT_S) -> list[dict]:
        """Allocator stats of every live stage process (talker first), asked between their steps.

        Each dict: process, pid, allocated_bytes, reserved_bytes, peak_bytes, rss_bytes, source.
        A process that does not answer within `timeout_s` (busy or dead) is left out.
        """
        return [{k: v for k, v in s.items() if k != "work"} for s in self._stats(timeout_s)]

    def work_snapshot(self, timeout_s: float = _STATS_TIMEOUT_S) -> list[dict]:
        """Every stage's loop counters (stages.runner.work), talker first: one dict per stage
        (the talker, each replica, also when replicas are threads of one process) with `stage`,
        steps, rows, busy_s, backlog, wall_s and the engine's own counters. Take two and
        `work_delta` them to see who was busy over an interval."""
        return [{"stage": stage, **counters} for s in self._stats(timeout_s)
                for stage, counters in s.get("work", {}).items()]

    def trace(self, seconds: float, path: str | Path, timeout_s: float | None = None) -> dict | None:
        """Profile the talker's process for `seconds` while it serves (torch profiler; with
        `runner.execution: single` that process runs every stage): the Chrome trace goes to
        `path` (`.json`, or `.json.gz` compressed), and the answer is its summary, per device
        stream (stages.profiling.window), or {"error": ...}. None if the process did not
        answer within `timeout_s` (default: the window plus 300 s to write and summarize it).
        The talker does not step while it writes the trace: take the window where a stall of
        a few seconds does not matter."""
        if not seconds > 0:
            raise ValueError(f"a trace window needs seconds > 0, got {seconds}")
        timeout_s = seconds + _TRACE_CLOSE_S if timeout_s is None else timeout_s
        query = lambda token: TraceQuery(token, float(seconds), str(Path(path).resolve()))  # noqa: E731
        reports = self._ask(query, self._children[:1], timeout_s)
        return reports[0].get("trace") if reports else None

    def _stats(self, timeout_s: float) -> list[dict]:
        return self._ask(StatsQuery, self._children, timeout_s)

    def _ask(self, query: Callable[[int], Any], children: list[_Child], timeout_s: float) -> list[dict]:
        """Put `query(token)` on each live child's inbox; their StatsReports, in child order."""
        token = next(self._tokens)
        with self._lock:
            if self._broken or self._closing or self._reader is None:
                return []
            self._reports[token] = []
        expected = 0
        for child in children:
            if child.process.is_alive():
                child.inbox.put(query(token))
                expected += 1
        deadline = time.monotonic() + timeout_s
        with self._reports_cv:
            while len(self._reports[token]) < expected and time.monotonic() < deadline:
                self._reports_cv.wait(timeout=max(0.0, deadline - time.monotonic()))
            reports = self._reports.pop(token)
        order = {c.name: i for i, c in enumerate(self._children)}
        return sorted(reports, key=lambda s: order.get(s["process"], len(order)))

    # -- the reader thread -------------------------------------------------------------------

    def _read_loop(self) -> None:
        live = {c.results: c for c in self._children}
        while live:
            for conn in wait(list(live), timeout=_POLL_S):
                try:
                    msg = conn.recv()
                except (EOFError, OSError):  # the child is gone (exited, killed, crashed)
                    self._on_child_gone(live.pop(conn))
                    continue
                self._dispatch(msg)

    def _on_child_gone(self, child: _Child) -> None:
        if self._closing:
            return
        child.process.join(timeout=1.0)
        self._break(f"{child.name} exited with code {child.process.exitcode}")

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, ChunkReady):
            self._on_chunk(msg)
        elif isinstance(msg, RequestError):
            self._deliver_error(msg)
        elif isinstance(msg, StatsReport):
            with self._reports_cv:
                if msg.token in self._reports:
                    self._reports[msg.token].append(msg.stats)
                    self._reports_cv.notify_all()
        elif isinstance(msg, Fatal):
            self._break(f"{msg.process} failed: {msg.message}")
        else:
            log.warning("stage runner: unexpected message %s", type(msg).__name__)

    def _on_chunk(self, msg: ChunkReady) -> None:
        with self._lock:
            tracked = self._tracked.get(msg.request_id)
        if tracked is None:  # cancelled or already failed
            return
        if msg.chunk_seq != tracked.next_seq:
            self.cancel(msg.request_id)
            tracked.on_event(RequestError(
                msg.request_id, f"chunk {msg.chunk_seq} arrived, expected {tracked.next_seq}"))
            return
        tracked.next_seq += 1
        if msg.last_chunk:
            self._untrack(msg.request_id)
        tracked.on_event(msg)

    def _deliver_error(self, msg: RequestError) -> None:
        with self._lock:
            tracked = self._tracked.pop(msg.request_id, None)
            if tracked is not None:
                self._load[tracked.replica] -= 1
        if tracked is None:
            return
        if not self._closing:  # stop generating codes nobody will decode
            self._children[0].inbox.put(Cancel(msg.request_id, tracked.replica))
        tracked.on_event(msg)

    def _break(self, reason: str) -> None:
        with self._lock:
            if self._broken is not None or self._closing:
                return
            self._broken = reason
        log.error("stage runner broken: %s; failing in-flight requests", reason)
        self._fail_all(reason)
