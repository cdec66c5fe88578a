"""The embedded backend over the stage runner, with fake engines (fast, no model compute)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from stages.config import RunnerConfig, StageConfig
from stages.runner.fakes import fake_code, fake_factories
from tts_bench.backends.base import Backend, ReportsMemory, RequestFailed, SynthesisRequest
from tts_bench.backends.embedded import EmbeddedBackend
from tts_bench.config import BenchConfig
from tts_bench.errors import BackendError


def bench_config() -> BenchConfig:
    stages = StageConfig(runner=RunnerConfig(device="cpu", torch_threads=1))
    return dataclasses.replace(BenchConfig(), backend="embedded", stages=stages)


async def collect(backend: EmbeddedBackend, request: SynthesisRequest) -> list:
    return [chunk async for chunk in backend.synthesize(request)]


def test_streams_chunks_with_codes_and_reports_memory():
    cfg = bench_config()
    backend = EmbeddedBackend(cfg, factories=fake_factories(decode_s=0.02))
    assert isinstance(backend, Backend) and isinstance(backend, ReportsMemory)

    async def scenario():
        await backend.start(replicas=2)
        try:
            # 30 words -> 300 codes (fake length model: codes_per_word per word).
            requests = [SynthesisRequest(f"r{i}", "word " * 30, seed=i) for i in range(3)]
            results = await asyncio.gather(*(collect(backend, r) for r in requests))
            return results, backend.memory_snapshot(), backend.describe()
        finally:
            await backend.stop()

    results, memory, info = asyncio.run(scenario())
    eos = cfg.stages.talker.eos_token_id
    for i, chunks in enumerate(results):
        assert all(c.sample_rate == 24000 for c in chunks)
        codes = [x for c in chunks for x in c.codes]
        assert codes == [fake_code(i, k, eos) for k in range(300)]
        assert sum(c.seconds for c in chunks) == pytest.approx(300 / 25)
        assert all(c.samples.dtype == np.float32 for c in chunks)
    assert [m["process"] for m in memory] == ["talker", "code2wav-0", "code2wav-1"]
    assert info["backend"] == "embedded" and info["replicas"] == 2
    assert info["device"].startswith("cpu")
    assert info["talker"]["hidden_size"] == cfg.stages.talker.hidden_size
    assert set(info["processes"]) == {"talker", "code2wav-0", "code2wav-1"}
    assert backend.memory_snapshot() == []  # stopped


def test_failed_and_abandoned_requests_end_cleanly():
    backend = EmbeddedBackend(bench_config(),
                              factories=fake_factories(step_s=0.002, fail_text="REFUSE"))

    async def scenario():
        await backend.start(replicas=1)
        try:
            with pytest.raises(RequestFailed) as info:
                await collect(backend, SynthesisRequest("bad", "REFUSE me"))
            stream = backend.synthesize(SynthesisRequest("long", "word " * 500))
            first = await stream.__anext__()
            await stream.aclose()  # the client gives up (e.g. its timeout)
            in_flight = backend._runner.in_flight()
            again = await collect(backend, SynthesisRequest("long", "word word word"))
            return info.value, first, in_flight, again
        finally:
            await backend.stop()

    failure, first, in_flight, again = asyncio.run(scenario())
    assert failure.kind == "backend_error" and "REFUSE" in failure.detail
    assert len(first.codes) == 25
    assert in_flight == {}  # cancelled in the runner, id free again
    assert sum(len(c.codes) for c in again) == 30


def test_start_failure_is_a_backend_error_with_the_child_message():
    backend = EmbeddedBackend(bench_config(), factories=fake_factories(fail_start="bad flow.pt"))
    with pytest.raises(BackendError, match="bad flow.pt"):
        asyncio.run(backend.start(replicas=1))


def test_synthesize_before_start_is_a_backend_error():
    backend = EmbeddedBackend(bench_config(), factories=fake_factories())

    async def scenario():
        await collect(backend, SynthesisRequest("x", "y"))

    with pytest.raises(BackendError, match="not started"):
        asyncio.run(scenario())


def test_the_tiers_concurrency_sizes_every_replica_pool_before_the_first_request():
    cfg = bench_config()
    backend = EmbeddedBackend(cfg, factories=fake_factories())
    backend.expect_concurrency(40)  # 20 a replica, past 2 x max_num_seqs (16): the pool holds 20

    async def scenario():
        await backend.start(replicas=2)
        try:
            return backend.describe()
        finally:
            await backend.stop()

    processes = asyncio.run(scenario())["processes"]
    assert [processes[f"code2wav-{r}"]["code2wav"]["slots"] for r in (0, 1)] == [20, 20]
