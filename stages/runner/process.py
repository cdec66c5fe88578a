"""What every stage process does around its loop: threads, seed, device, ready handshake.

A stage process is started with `spawn` (CUDA cannot be forked), imports nothing heavy until its
target runs, builds its model *after* start, and reports `Ready` (with the traceback if building
failed, so the client's `start()` raises with the child's message instead of waiting forever).
It talks back over its own one-way pipe (`Connection.send`: synchronous, and the client sees EOF
the moment the process dies, even mid-message).
An unexpected error in the loop is reported as `Fatal` and the process exits with code 1; the
client also watches exit codes, so a segfault or a kill is noticed without any message.

Threads: on a shared CPU every process spinning a full OpenMP pool oversubscribes the cores, so
each process gets `threads` intra-op threads (see `threads_per_process`) and one inter-op thread.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from stages.config import StageConfig
from stages.platform import (
    describe_device,
    determinism_facts,
    deterministic_kernels,
    device_count,
    dtype_from_name,
    is_cuda,
    memory_stats,
    resolve_device,
    set_current_device,
    strict_fp32_baseline,
)
from stages.platform.mps import mps_client
from stages.runner.allocator import choose_allocator
from stages.runner.factories import StageFactories
from stages.runner.messages import Fatal, Ready, StatsReport
from stages.runner.placement import Placement, place, resolve_devices
from stages.signals import ignore_interrupts

log = logging.getLogger(__name__)

# How long a blocked process waits on its inbox before checking that its parent is alive.
_POLL_S = 0.5
# Most characters of a child's traceback sent back in Ready/Fatal (the tail is the useful part).
_MAX_TRACE_CHARS = 4000


@dataclass(frozen=True)
class ProcessSpec:
    """Everything a stage process needs, pickled into it at start."""

    # "talker" | "code2wav-<r>" | "code2wav" (threads: the host of every replica) | "code2wav-host-<g>"
    # (processes with runner.replicas_per_process > 1: the host of a group) | "stages" (single)
    name: str
    cfg: StageConfig
    factories: StageFactories
    threads: int  # torch intra-op threads for this process
    replica_ids: tuple[int, ...] = ()  # code2wav replicas it runs (none: the talker)
    replicas_total: int = 1  # R of the tier: placement spreads replicas over runner.devices
    hosts_talker: bool = False  # the talker runs here beside replicas (runner.execution=single)
    # Requests a replica should expect live at once (0: unknown): its slot pool is sized for
    # them up front, since a pool that grows mid-run drops every captured graph.
    live_per_replica: int = 0
    # Environment set before the device is touched (runner.sharing: the MPS client variables).
    env: tuple[tuple[str, str], ...] = ()
    # Set by the runner when it starts to stop (a multiprocessing Event; None: never stops
    # early): replicas then decode nothing more and only read their inboxes (replica_proc).
    stopping: Any = None

    def is_stopping(self) -> bool:
        return self.stopping is not None and self.stopping.is_set()

    def placement(self) -> Placement:
        """Where every stage goes (needs the device count: call in the child)."""
        runner = self.cfg.runner
        devices = resolve_devices(runner.devices, device_count(runner.device))
        return place(devices, self.replicas_total)

    def device_indices(self) -> tuple[int, ...]:
        """The accelerator index of each engine this process builds, the talker's first."""
        plan = self.placement()
        talker = (plan.talker,) if self.hosts_talker or not self.replica_ids else ()
        return talker + self.replica_device_indices()

    def replica_device_indices(self) -> tuple[int, ...]:
        """The accelerator index of each code2wav replica this process runs."""
        plan = self.placement()
        return tuple(plan.replicas[r] for r in self.replica_ids)


def threads_per_process(configured: int, replicas: int, cores: int | None = None) -> int:
    """Intra-op threads per stage process: `configured` if > 0, else the cores split evenly over
    the talker and the R replicas, at least 1 each (on a 2-core CI machine: 1 per process)."""
    if configured > 0:
        return configured
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // (1 + replicas))


def _trace(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-_MAX_TRACE_CHARS:]


def short_error(exc: BaseException) -> str:
    """`Type: message` for per-request errors (the whole trace goes to the child's log)."""
    return f"{type(exc).__name__}: {exc}"


@dataclass
class StageContext:
    """What a built stage process hands its loop."""

    spec: ProcessSpec
    device: torch.device
    dtype: torch.dtype
    results: Any  # write end of this process's result pipe to the client (Connection)
    info: dict = field(default_factory=dict)  # goes into Ready (device, dtype, engine facts)

    def report_stats(self, token: int, work: dict, extra: dict | None = None) -> None:
        """Send this process's memory figures and `work` ({stage: counters}, stages.runner.work);
        `extra` adds engine facts (e.g. its voices)."""
        stats = {"process": self.spec.name, "pid": os.getpid(), **memory_stats(self.device), **(extra or {}),
                 "work": work}
        self.results.send(StatsReport(token, stats))


def run_stage_process(
    spec: ProcessSpec,
    results: Any,
    build: Callable[[StageContext], Any],
    loop: Callable[[StageContext, Any], None],
) -> None:
    """Body of every stage process: setup, `build(ctx)` -> engines, Ready, `loop(ctx, engines)`.

    `build` may add facts to `ctx.info` (they reach the client in Ready, then `describe()`).
    """
    os.environ.update(spec.env)  # the driver reads MPS's variables once, at cuInit
    allocator = choose_allocator(os.environ)  # before anything touches the device
    if spec.cfg.runner.deterministic:  # replay == eager and A/B identity need equal kernels
        deterministic_kernels()
    # No TF32 outside the stages' precision scopes (torch leaves cuDNN's on): this process is
    # the stages' own, and every scope restores to this (stages.precision says what each runs).
    strict_fp32_baseline()
    ignore_interrupts()  # Ctrl-C and SIGTERM are the parent's: it stops us in order (stages.signals)
    try:
        torch.set_num_threads(spec.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set (e.g. by a test harness); harmless
            pass
        runner = spec.cfg.runner
        torch.manual_seed(runner.seed)  # module constructors draw from the global generator
        device = resolve_device(runner.device, spec.device_indices()[0])
        set_current_device(device)
        ctx = StageContext(spec, device, dtype_from_name(runner.dtype), results)
        if not is_cuda(device):
            allocator += f"; CUDA's allocator reads it, this process runs on {device.type}"
        ctx.info.update(device=describe_device(device), torch=torch.__version__,
                        dtype=str(ctx.dtype).removeprefix("torch."), threads=spec.threads, allocator=allocator,
                        sharing=mps_client(os.environ), deterministic=determinism_facts())
        engines = build(ctx)
    except BaseException as exc:  # noqa: BLE001 - every startup failure must reach the client
        results.send(Ready(spec.name, os.getpid(), error=_trace(exc)))
        _exit_now(results, 1)
    results.send(Ready(spec.name, os.getpid(), info=ctx.info))
    code = 0
    try:
        loop(ctx, engines)
    except BaseException as exc:  # noqa: BLE001
        log.error("%s failed: %s", spec.name, _trace(exc))
        results.send(Fatal(spec.name, short_error(exc)))
        code = 1
    _exit_now(results, code)


def _exit_now(results: Any, code: int) -> None:
    """Exit without interpreter teardown (our messages are already in the pipe: send is
    synchronous).

    Tearing down a process that imported torch (and holds a model) takes seconds on a loaded
    CPU; nothing in a stage process needs atexit handlers, so skip them.
    """
    results.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def drain(inbox: Any, *, block: bool) -> list[Any]:
    """All messages now on `inbox`; when `block`, wait (polling the parent) for at least one.

    Returns [None] (the shutdown sentinel) if the parent died while we waited, so an orphaned
    child never lingers on a shared device.
    """
    messages: list[Any] = []
    parent = mp.parent_process()
    while block and not messages:
        try:
            messages.append(inbox.get(timeout=_POLL_S))
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return [None]
    while True:
        try:
            messages.append(inbox.get_nowait())
        except queue.Empty:
            return messages
