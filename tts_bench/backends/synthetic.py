"""The synthetic backend: silence with known delays, for harness-overhead checks and fast tests.

A request of W words yields `seconds_per_word * W` seconds of silence in chunks of
`chunk_seconds` (the last one may be shorter). The first chunk is released
`first_chunk_delay_s` after the request starts, each further chunk `chunk_delay_s` after the
previous one, every delay multiplied by `delay_scale` (1.2 = a deliberately 20% slower arm).
Release times are absolute deadlines on the event-loop clock, so sleep overshoot does not
accumulate: the delay-implied RTF of a request is exactly

    (first_chunk_delay_s + (n_chunks - 1) * chunk_delay_s) * delay_scale / audio_seconds

and whatever a client measures above it is harness overhead (see scripts/harness_overhead.py).
Everything is `asyncio.sleep`; there are no processes. `replicas` is only recorded: every
request runs concurrently, as if the server had unbounded capacity (a simple, documented model;
queueing behaviour belongs to real backends). `fail_every = N` makes every Nth request (1-based,
counted per backend instance) raise `RequestFailed("backend_error")`.

For tests, `in_flight_at_start` records how many requests were in flight (including the new one)
each time a request started, and `max_in_flight` the maximum.

    cfg = load_config("configs/ab/synthetic.yaml")
    backend = SyntheticBackend(cfg)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import numpy as np

from tts_bench.backends.base import AudioChunk, RequestFailed, SynthesisRequest

if TYPE_CHECKING:
    from tts_bench.config import BenchConfig


class SyntheticBackend:
    """Silence with configured delays; deterministic, process-free."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.params = cfg.synthetic
        self.replicas = 0
        self.started = False
        self.requests_seen = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.in_flight_at_start: list[int] = []

    async def start(self, replicas: int) -> None:
        self.replicas = replicas
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def describe(self) -> dict:
        p = self.params
        return {
            "backend": "synthetic",
            "replicas": self.replicas,
            "chunk_seconds": p.chunk_seconds,
            "first_chunk_delay_s": p.first_chunk_delay_s,
            "chunk_delay_s": p.chunk_delay_s,
            "seconds_per_word": p.seconds_per_word,
            "sample_rate": p.sample_rate,
            "delay_scale": p.delay_scale,
        }

    def chunk_sizes(self, text: str) -> list[int]:
        """Samples per chunk for `text` (empty list for text without words)."""
        p = self.params
        total = round(p.seconds_per_word * len(text.split()) * p.sample_rate)
        step = max(1, round(p.chunk_seconds * p.sample_rate))
        n = math.ceil(total / step)
        return [min(step, total - i * step) for i in range(n)]

    def implied_rtf(self, text: str) -> float:
        """The RTF a zero-overhead client would measure for `text`."""
        sizes = self.chunk_sizes(text)
        p = self.params
        delay = (p.first_chunk_delay_s + (len(sizes) - 1) * p.chunk_delay_s) * p.delay_scale
        return delay / (sum(sizes) / p.sample_rate)

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioChunk]:
        if not self.started:
            raise RuntimeError("SyntheticBackend.synthesize called before start()")
        self.requests_seen += 1
        fail = self.params.fail_every and self.requests_seen % self.params.fail_every == 0
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.in_flight_at_start.append(self.in_flight)
        try:
            async for chunk in self._emit(request, fail):
                yield chunk
        finally:
            self.in_flight -= 1

    async def _emit(self, request: SynthesisRequest, fail: bool) -> AsyncIterator[AudioChunk]:
        p = self.params
        loop = asyncio.get_running_loop()
        deadline = loop.time() + p.first_chunk_delay_s * p.delay_scale
        if fail:
            await asyncio.sleep(deadline - loop.time())
            raise RequestFailed("backend_error", f"synthetic fail_every={p.fail_every}")
        for size in self.chunk_sizes(request.text):
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            yield AudioChunk(np.zeros(size, dtype=np.float32), p.sample_rate)
            deadline += p.chunk_delay_s * p.delay_scale
