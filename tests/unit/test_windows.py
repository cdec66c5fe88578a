"""Duration-mode phases (`tts_bench.load.windows`, `tts_bench.load.loadwindow`): attribution to the window,
invalid phases, stability, and the open-loop arrival times (`tts_bench.load.arrivals`)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tts_bench.load.arrivals import Arrivals, OpenLoop, first_times
from tts_bench.backends.base import AudioChunk, RequestFailed
from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.config import Tier, load_config
from tts_bench.load.loadgen import run_phase
from tts_bench.load.loadwindow import _label, _Live
from tts_bench.inputs.prompts import Prompt
from tts_bench.load.plan import cycle_jobs
from tts_bench.rundir.records import PhaseLabels, RequestRecord
from tts_bench.load.windows import WindowPlan, agree, sub_window_bounds

LABELS = PhaseLabels("base", "2x1", 0)
PROMPTS = [Prompt(f"en_{i}", "", None, "one two three four") for i in range(3)]
STEADY = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
          "synthetic.first_chunk_delay_s=0.01", "synthetic.chunk_delay_s=0.01"]
# Phases on the synthetic backend run on virtual time (the `virtual_clock` fixture,
# tests/virtual_clock.py): windows, sub-window throughputs and their stability are what the delays
# imply, and a load burst cannot make a steady backend unstable.


def _rec(send: float, end: float, rtf: float = 0.5) -> RequestRecord:
    return RequestRecord("base", "2x1", 0, f"base:2x1:r0:{send}", "en_0", False, "p", send, end,
                         audio_rtf=rtf, audio_seconds=1.0)


def test_a_request_straddling_the_window_edge_counts_by_start_and_splits_its_audio_by_arrival():
    live = _Live(0.0, 2)
    # window [1, 3): one request sent in the ramp, one at the end of the window, one in the drain
    live.done = [
        (_rec(0.5, 1.6), [(0.9, 0.25), (1.1, 0.25), (1.5, 0.5)]),  # ramp: 0.75 s of its audio in the window
        (_rec(2.8, 3.4), [(2.9, 0.25), (3.2, 0.75)]),  # window: counted, 0.25 s inside
        (_rec(3.0, 3.5), [(3.3, 1.0)]),  # sent at the edge: drain, not counted
    ]
    records, phase = _label(live, LABELS, "p", WindowPlan(2.0, window_s=1.0), (1.0, 3.0), None, None)
    assert [r.window for r in records] == ["ramp", "window", "drain"]
    assert [r.warmup for r in records] == [True, False, True]
    assert [r.audio_s_in_window for r in records] == [0.75, 0.25, 0.0]
    assert phase.requests_in_window == 1 and phase.audio_s_in_window == 1.0
    assert phase.throughput == pytest.approx(0.5)
    assert [s["audio_s"] for s in phase.sub_windows] == [0.75, 0.25]
    assert phase.sub_windows[1]["requests"] == 1 and phase.sub_windows[0]["mean_rtf"] is None


def test_sub_windows_cover_the_window_and_the_last_takes_the_remainder():
    edges = [x for pair in sub_window_bounds(0.0, 1.0, 0.3) for x in pair]
    assert edges == pytest.approx([0.0, 0.3, 0.3, 0.6, 0.6, 1.0])
    assert sub_window_bounds(0.0, 0.2, 0.5) == [(0.0, 0.2)]


def test_perf_analyzer_rule_each_of_the_last_three_within_pct_of_their_mean():
    assert agree([50.0, 10.0, 10.0, 10.5], 10) is True
    assert agree([10.0, 10.0, 13.0], 10) is False
    assert agree([10.0, 10.0], 10) is None
    assert agree([10.0, None, 10.0], 10) is False


def _run(backend, plan, *, concurrency=2, arrivals=None):
    async def go():
        await backend.start(1)
        return await run_phase(backend, cycle_jobs(PROMPTS, LABELS, seed=0), concurrency=concurrency,
                               labels=LABELS, timeout_s=5, window=plan, arrivals=arrivals)

    return asyncio.run(go())


def test_closed_loop_phase_measures_its_window_and_keeps_the_prompt_order_and_seeds(virtual_clock):
    backend = SyntheticBackend(load_config(None, STEADY))
    sunk = []

    async def go():
        await backend.start(1)
        return await run_phase(backend, cycle_jobs(PROMPTS, LABELS, seed=7), concurrency=2, labels=LABELS,
                               timeout_s=5, sink=sunk.append, window=WindowPlan(0.4, ramp_s=0.1, window_s=0.2))

    result = asyncio.run(go())
    phase = result.phase
    assert phase.mode == "duration" and phase.invalid_reason is None and phase.max_in_flight == 2
    assert phase.window_start_s >= 0.1 and phase.window_s == pytest.approx(0.4)
    assert phase.requests_in_window == len(result.records) > 0
    assert all(phase.window_start_s <= r.t_send_s < phase.window_start_s + 0.4 for r in result.records)
    assert phase.audio_s_in_window == pytest.approx(sum(r.audio_s_in_window for r in sunk))
    ids = sorted(sunk, key=lambda r: int(r.request_id.rsplit(":", 1)[1]))
    assert [r.utt for r in ids[:4]] == ["en_0", "en_1", "en_2", "en_0"]  # the prompt set cycles


class _Instant:
    """Every request fails before it ever suspends: C is never in flight at once."""

    async def start(self, replicas):
        pass

    async def synthesize(self, request):
        raise RequestFailed("backend_error", "refused")
        yield  # pragma: no cover


def test_a_phase_whose_concurrency_never_fills_is_invalid_and_says_so():
    result = _run(_Instant(), WindowPlan(0.2, ramp_s=0.05), concurrency=4)
    assert result.phase.invalid_reason is not None
    assert "C=4 requests were never in flight at once (1 at most)" in result.phase.invalid_reason
    assert result.phase.throughput is None and result.records == []


def test_a_window_with_no_request_sent_in_it_is_invalid(virtual_clock):
    slow = OpenLoop(0.01).times(seed=0, tier=Tier(2, 1), repeat=0)  # one at t=0, the next ~100 s later
    t = virtual_clock.now
    result = _run(SyntheticBackend(load_config(None, STEADY)), WindowPlan(0.2, ramp_s=0.1), arrivals=slow)
    assert virtual_clock.now - t < 5  # the pending arrival does not hold the phase (virtual seconds)
    assert "no request was sent inside the 0.20 s window" in result.phase.invalid_reason


class _Ramping(SyntheticBackend):
    """Each request's delays grow with the time since start: throughput falls, RTF climbs."""

    async def _emit(self, request, fail):
        loop = asyncio.get_running_loop()
        scale = 1.0 + 30.0 * (loop.time() - self.t_start)
        for size in self.chunk_sizes(request.text):
            await asyncio.sleep(0.01 * scale)
            yield AudioChunk(np.zeros(size, dtype=np.float32), self.params.sample_rate)

    async def start(self, replicas):
        self.t_start = asyncio.get_running_loop().time()
        await super().start(replicas)


def test_stable_on_a_steady_backend_and_unstable_when_its_delay_ramps(virtual_clock):
    plan = WindowPlan(0.6, window_s=0.2, stability_pct=20)
    steady = _run(SyntheticBackend(load_config(None, STEADY)), plan).phase
    ramping = _run(_Ramping(load_config(None, STEADY)), plan).phase
    assert len(steady.sub_windows) == 3 and steady.stable is True
    assert ramping.stable is False


def test_until_stable_extends_an_unstable_window_up_to_the_cap(virtual_clock):
    plan = WindowPlan(0.3, window_s=0.1, until_stable=True, max_duration_s=0.5)
    phase = _run(_Ramping(load_config(None, STEADY)), plan).phase
    assert phase.window_s == pytest.approx(0.5) and phase.stable is False
    assert len(phase.sub_windows) == 5


def test_arrival_times_are_seeded_by_tier_and_repeat_never_by_arm():
    a = first_times(OpenLoop(12.0), 50, seed=0, tier=Tier(128, 8), repeat=1)
    assert a == first_times(OpenLoop(12.0), 50, seed=0, tier=Tier(128, 8), repeat=1)  # every arm draws this
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert a != first_times(OpenLoop(12.0), 50, seed=1, tier=Tier(128, 8), repeat=1)
    assert a != first_times(OpenLoop(12.0), 50, seed=0, tier=Tier(128, 8), repeat=2)


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_gaps_have_mean_one_over_rate_and_the_gamma_shapes_cv(shape):
    times = Arrivals(20.0, shape, seed=3, tier=Tier(4, 1), repeat=0)
    gaps = np.diff([next(times) for _ in range(20_001)])
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(shape), rel=0.05)


def test_open_loop_caps_requests_in_flight_at_c(virtual_clock):
    backend = SyntheticBackend(load_config(None, STEADY))
    fast = OpenLoop(500.0).times(seed=0, tier=Tier(2, 1), repeat=0)
    phase = _run(backend, WindowPlan(0.3), arrivals=fast).phase
    assert backend.max_in_flight <= 2 and phase.request_rate == 500.0 and phase.requests_in_window > 0


@pytest.mark.parametrize("key, value", [("duration_s", 0), ("window_s", 0), ("stability_pct", 0), ("ramp_s", -1)])
def test_bad_window_settings_are_refused_naming_the_key(key, value):
    from tts_bench.errors import ConfigError

    with pytest.raises((ConfigError, ValueError), match=f"bench.{key}"):
        load_config(None, [f"bench.{key}={value}"])
