"""The suite's virtual clock (tests/virtual_clock.py) governs what the load generator measures:
if sending or timing moved out of its reach, the tests that rely on it would quietly measure
wall-clock time again, so this says so instead."""

from __future__ import annotations

import asyncio

from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.config import load_config
from tts_bench.load.loadgen import run_phase
from tts_bench.load.plan import plan_jobs
from tts_bench.inputs.prompts import Prompt
from tts_bench.rundir.records import PhaseLabels


def test_a_synthetic_request_is_timed_on_the_virtual_clock(virtual_clock):
    # A 5 s first chunk: on the virtual clock the phase takes virtual seconds, not real ones, and
    # the TTFP it records is the delay plus at most the clock's 2 ms lateness.
    cfg = load_config(None, ["backend=synthetic", "synthetic.first_chunk_delay_s=5", "synthetic.chunk_delay_s=0.01",
                             "synthetic.chunk_seconds=0.25", "synthetic.seconds_per_word=0.25"])
    backend = SyntheticBackend(cfg)
    labels = PhaseLabels("base", "1x1", 0)
    _, jobs = plan_jobs([Prompt("u0", "", None, "one two three")], labels, seed=0, warmup=0)
    before = virtual_clock.now

    async def go():
        await backend.start(1)
        return await run_phase(backend, jobs, concurrency=1, labels=labels, timeout_s=60)

    (rec,) = asyncio.run(go()).records
    assert virtual_clock.now - before >= 5.0  # the delay went by on the virtual clock
    assert 5000.0 <= rec.audio_ttfp_ms <= 5000.0 + 2.0 + 0.1, rec.audio_ttfp_ms
