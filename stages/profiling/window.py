"""A profiling window in a serving stage process: the torch profiler on for a few seconds while
the stages run, a Chrome trace written, and what ran on each device stream meanwhile.

Why: beside the code2wav replicas the talker's step takes ~74 ms with ~55 ms of device span,
against ~5.5 ms alone (`results/h200/runner_smoke_span_*_64x4.json`), and neither the GIL, the
hardware work queues nor SM occupancy (D-EXEC-4) explain it. A kernel trace of the stage
process says whether the talker's kernels run long there (contention for what they share with
the replicas) or wait between each other (queueing, launches): compare a stream's mean kernel
time and its idle share.

The talker loop opens a window when the client asks (`StageRunner.trace`) and closes it at the
first step boundary after `seconds`. Each talker step inside is a `TALKER_RANGE` range, whose
device-side span (kineto's gpu_user_annotation) marks the talker's stream in the summary. With
the replicas as threads of the same process (`runner.execution: single`) the trace holds every
stage; otherwise only the talker's process. Closing parses the trace in the talker's thread
(seconds for a busy window), which stalls the tier meanwhile: read a tier's figures with that
in mind, or take the window in a tier you do not measure.

    window = ProfileWindow.open(seconds=2.0, path=Path("trace.json.gz"), device=dev)
    with window.step():  # around each talker step
        engine.step()
    if window.due():
        summary = window.close()  # {"seconds", "steps", "streams": [...], "trace": path, ...}
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from stages.platform import is_cuda
from stages.platform.device import synchronize_stream
from stages.profiling.launches import is_copy
from stages.profiling.ranges import TALKER_RANGE

_TOP_KERNELS = 5


@dataclass
class ProfileWindow:
    """An open profiler and when to close it."""

    prof: Any
    path: Path
    device: torch.device
    seconds: float
    started: float  # time.monotonic() at open

    @classmethod
    def open(cls, *, seconds: float, path: Path, device: torch.device) -> ProfileWindow:
        """Start the profiler (host ops; kernels and copies too on CUDA)."""
        if not seconds > 0:
            raise ValueError(f"a trace window needs seconds > 0, got {seconds}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)  # fail here, not after the window
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda(device) else [])
        # No shapes, stacks or memory: each costs host time per operator, which would slow the
        # very steps being looked at.
        prof = profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False)
        prof.start()
        return cls(prof, path, device, seconds, time.monotonic())

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One talker step, as a `TALKER_RANGE` range in the trace (as in `talker_step`)."""
        with record_function(TALKER_RANGE):
            yield

    def due(self) -> bool:
        return time.monotonic() - self.started >= self.seconds

    def close(self) -> dict:
        """Stop, write the Chrome trace (`.gz` compresses it) and summarize it."""
        # The talker's own stream only: a device-wide sync from this thread would break a graph
        # capture on a replica thread (stages.platform.device.synchronize_stream).
        synchronize_stream(self.device)
        wall = time.monotonic() - self.started
        self.prof.stop()
        self.prof.export_chrome_trace(str(self.path))
        return {"trace": str(self.path), **summarize(self.prof.events(), wall_s=wall)}


def summarize(events: Iterable[Any], *, wall_s: float) -> dict:
    """What a profiler's `events()` say: talker steps (host and device time), and per device
    stream its kernels, copies, busy and idle time, and its top kernels.

    A stream's busy time is the union of its kernels' and copies' intervals; its idle share is
    the part of its span (first start to last end) with nothing running on it. The streams that
    carry `TALKER_RANGE` device spans are marked `talker`."""
    host_steps: list[float] = []
    device_steps: dict[int, list[float]] = defaultdict(list)
    work: dict[int, list[Any]] = defaultdict(list)
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU:
            if e.name == TALKER_RANGE:
                host_steps.append(_duration_us(e))
        elif e.is_user_annotation:
            if e.name == TALKER_RANGE:
                device_steps[e.device_resource_id].append(_duration_us(e))
        else:
            work[e.device_resource_id].append(e)
    streams = [_stream_load(stream, items, stream in device_steps) for stream, items in work.items()]
    streams.sort(key=lambda s: (not s["talker"], -s["busy_ms"]))
    spans = [d for ds in device_steps.values() for d in ds]
    everything = [e for items in work.values() for e in items]
    return {
        "seconds": round(wall_s, 3),
        "steps": len(host_steps),
        "host_ms_per_step": _mean_ms(host_steps),
        "device_span_ms_per_step": _mean_ms(spans),
        # The device's busy share of the window: any stream running anything.
        "device_busy": round(_union_us(everything) / (wall_s * 1e6), 4) if everything and wall_s > 0 else None,
        "streams": streams,
    }


def _stream_load(stream: int, items: list[Any], talker: bool) -> dict:
    kernels = [e for e in items if not is_copy(e.name)]
    copies = len(items) - len(kernels)
    start = min(e.time_range.start for e in items)
    end = max(e.time_range.end for e in items)
    busy = _union_us(items)
    by_name: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for e in kernels:
        by_name[e.name] += _duration_us(e)
        counts[e.name] += 1
    kernel_us = sum(by_name.values())
    return {
        "stream": stream,
        "talker": talker,
        "kernels": len(kernels),
        "copies": copies,
        "kernel_ms": round(kernel_us / 1000, 3),
        "mean_kernel_us": round(kernel_us / len(kernels), 2) if kernels else None,
        "busy_ms": round(busy / 1000, 3),
        "span_ms": round((end - start) / 1000, 3),
        "idle_in_span": round(1 - busy / (end - start), 4) if end > start else 0.0,
        "top_kernels": [{"name": n, "count": counts[n], "ms": round(us / 1000, 3)}
                        for n, us in by_name.most_common(_TOP_KERNELS)],
    }


def _duration_us(e: Any) -> float:
    return e.time_range.end - e.time_range.start


def _union_us(items: Iterable[Any]) -> float:
    """Total length of the union of the events' [start, end] intervals (us)."""
    total, reach = 0.0, None
    for start, end in sorted((e.time_range.start, e.time_range.end) for e in items):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _mean_ms(values: list[float]) -> float | None:
    return round(sum(values) / len(values) / 1000, 3) if values else None


def format_trace(summary: dict) -> list[str]:
    """A few lines for a console: the talker's steps, then one line per device stream."""
    if "error" in summary:
        return [f"trace: failed: {summary['error']}"]
    head = (f"trace {summary['seconds']:.1f} s -> {summary['trace']}: {summary['steps']} talker steps, "
            f"host {_ms(summary['host_ms_per_step'])} a step")
    if not summary["streams"]:
        return [head, "  no device timeline (kernels are traced on CUDA only)"]
    lines = [f"{head}, device span {_ms(summary['device_span_ms_per_step'])} a step; device busy "
             f"{_pct(summary['device_busy'])} of the window"]
    for s in summary["streams"]:
        top = ", ".join(f"{k['name'][:40]} {k['ms']:.1f} ms" for k in s["top_kernels"][:2])
        lines.append(
            f"  stream {s['stream']}{' (talker)' if s['talker'] else ''}: {s['kernels']} kernels, "
            f"mean {s['mean_kernel_us'] or 0:.1f} us, {s['copies']} copies, busy {s['busy_ms']:.1f} of "
            f"{s['span_ms']:.1f} ms ({_pct(1 - s['idle_in_span'])}); top: {top}"
        )
    return lines


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"
