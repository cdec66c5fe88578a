"""The sampling thread: one sample every `interval_s` from the start of a tier to its end.

`MemoryRecorder(sampler, interval_s)` samples on a daemon thread at fixed ticks of
`time.monotonic()` (t = 0 at `start()`; a slow sample delays the next tick, it never shifts the
whole schedule). Every sample carries the phase current when it was taken (`mark("measure")`
after the warmup requests), the time the `sample()` call itself took (the sampler's overhead,
recorded rather than assumed small), and either the readings or an `error`: a sampler that
raises or times out mid-run leaves a gap, never a crashed tier. `stop()` takes one last sample
so a tier shorter than the interval still has its end state.

    rec = MemoryRecorder(make_sampler("rss"), interval_s=2.0)
    rec.start("warmup")
    ...                       # warmup requests
    rec.mark("measure")
    ...                       # measured requests
    series = rec.stop()       # MemSeries: samples, sampler description
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tts_bench.rundir.records import from_known_fields
from tts_bench.mem.samplers import MemorySampler

log = logging.getLogger(__name__)

# How long stop() waits for an in-flight sample() beyond one interval (npu-smi times out at 5 s,
# the runner's memory snapshot at 10 s, so a healthy sampler is always back well before this).
_JOIN_GRACE_S = 30.0


@dataclass(frozen=True)
class MemSample:
    """One tick. `used_bytes` sums the readings (None for a gap); `total_bytes` is the device
    total when every reading knows it (the sum over devices: one device per reading)."""

    t_s: float
    phase: str
    used_bytes: int | None
    total_bytes: int | None
    sample_ms: float
    readings: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.used_bytes is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemSample:
        return from_known_fields(cls, d)


@dataclass
class MemSeries:
    """Samples of one sampler over one (arm, tier, repeat)."""

    sampler: str
    interval_s: float
    samples: list[MemSample]
    describe: dict[str, Any] = field(default_factory=dict)
    phase_starts: dict[str, float] = field(default_factory=dict)  # phase -> t_s it began

    def to_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler, "interval_s": self.interval_s, "describe": self.describe,
                "phase_starts": self.phase_starts, "samples": [s.to_dict() for s in self.samples]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemSeries:
        return cls(d["sampler"], d["interval_s"], [MemSample.from_dict(s) for s in d["samples"]],
                   d.get("describe", {}), d.get("phase_starts", {}))


def take_sample(sampler: MemorySampler, t_s: float, phase: str) -> MemSample:
    """Call the sampler once; any exception becomes a gap carrying its message."""
    t0 = time.perf_counter()
    try:
        readings = sampler.sample()
    except Exception as exc:  # a sampler fault mid-run is data (a gap), not a reason to stop
        ms = (time.perf_counter() - t0) * 1000.0
        return MemSample(t_s, phase, None, None, ms, error=f"{type(exc).__name__}: {exc}")
    ms = (time.perf_counter() - t0) * 1000.0
    if not readings:
        return MemSample(t_s, phase, None, None, ms, error="sampler returned no readings")
    totals = [r.total_bytes for r in readings]
    # Device readings are one per device: totals add up. rss readings are processes sharing
    # one host: its RAM counts once.
    total = None if None in totals else (max(totals) if sampler.name == "rss" else sum(totals))
    return MemSample(
        t_s, phase, sum(r.used_bytes for r in readings), total, ms,
        readings=[{"label": r.label, "used_bytes": r.used_bytes, **r.extra} for r in readings],
    )


class MemoryRecorder:
    """Samples `sampler` every `interval_s` seconds on a background thread."""

    def __init__(self, sampler: MemorySampler, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.sampler = sampler
        self.interval_s = float(interval_s)
        self._samples: list[MemSample] = []
        self._phase = "warmup"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._phase_starts: dict[str, float] = {}

    def start(self, phase: str = "warmup") -> None:
        if self._thread is not None:
            raise RuntimeError("MemoryRecorder.start() called twice")
        self._phase = phase
        self._t0 = time.monotonic()
        self._phase_starts = {phase: 0.0}
        self._thread = threading.Thread(target=self._loop, name=f"mem-{self.sampler.name}", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stop.is_set()

    def mark(self, phase: str) -> None:
        """Label every later sample with `phase` (e.g. "measure" once warmup requests are done)."""
        with self._lock:
            self._phase = phase
            self._phase_starts.setdefault(phase, time.monotonic() - self._t0)

    def _tick(self) -> None:
        with self._lock:
            phase = self._phase
        sample = take_sample(self.sampler, time.monotonic() - self._t0, phase)
        if sample.error:
            log.warning("mem sampler %s: gap at t=%.1f s: %s", self.sampler.name, sample.t_s, sample.error)
        with self._lock:
            self._samples.append(sample)

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            self._tick()
            n += 1
            # Fixed schedule t0 + n * interval; a late tick is taken at once, never twice.
            delay = self._t0 + n * self.interval_s - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break

    def stop(self) -> MemSeries:
        """End sampling (after one final sample) and return the series."""
        if self._thread is None:
            raise RuntimeError("MemoryRecorder.stop() before start()")
        self._stop.set()
        self._thread.join(timeout=self.interval_s + _JOIN_GRACE_S)
        if self._thread.is_alive():
            # A sample() stuck past every timeout: leave the daemon thread, keep what we have.
            log.warning("mem sampler %s did not return within %.0f s; series ends at its last sample",
                        self.sampler.name, self.interval_s + _JOIN_GRACE_S)
        else:
            self._tick()  # the state at the end of the tier, however short the tier was
        with self._lock:
            samples = list(self._samples)
        return MemSeries(self.sampler.name, self.interval_s, samples, self.sampler.describe(),
                         dict(self._phase_starts))
