"""The sampling thread with a scripted fake sampler: phases, gaps, overhead, the final sample."""

from __future__ import annotations

import statistics
import threading
import time

import pytest

from tts_bench.mem.npu_smi import MIB
from tts_bench.mem.recorder import MemoryRecorder, MemSeries, take_sample
from tts_bench.mem.samplers import MemReading
from tts_bench.mem.summary import summarize


class ScriptedSampler:
    """Returns the scripted MiB values in order (the last one repeats); an Exception entry raises."""

    name = "fake"

    def __init__(self, script, total_mib=1000):
        self.script = list(script)
        self.total = total_mib * MIB
        self.calls = 0
        self.lock = threading.Lock()

    def sample(self):
        with self.lock:
            item = self.script[min(self.calls, len(self.script) - 1)]
            self.calls += 1
        if isinstance(item, Exception):
            raise item
        return [MemReading("dev0", int(item * MIB), self.total)]

    def describe(self):
        return {"sampler": self.name}

    def close(self):
        pass


def wait_for_calls(sampler, n, timeout=60.0):  # a hang guard: the calls decide, not the clock
    deadline = time.monotonic() + timeout
    while sampler.calls < n:
        assert time.monotonic() < deadline, f"sampler called {sampler.calls} times, wanted {n}"
        time.sleep(0.005)


def test_phases_steady_median_and_peak_are_exact():
    # warmup: 100, 900 (a spike that counts for peak, not steady); measure: 300, 500, 400, 400...
    sampler = ScriptedSampler([100, 900, 300, 500, 400])
    rec = MemoryRecorder(sampler, interval_s=0.01)
    rec.start("warmup")
    wait_for_calls(sampler, 2)  # the thread may take more before the mark: the split is timing
    n_warm = sampler.calls
    rec.mark("measure")
    wait_for_calls(sampler, n_warm + 4)
    series = rec.stop()
    warm = [s for s in series.samples if s.phase == "warmup"]
    meas = [s for s in series.samples if s.phase == "measure"]
    assert len(warm) >= 2 and len(meas) >= 3
    assert [s.t_s for s in series.samples] == sorted(s.t_s for s in series.samples)
    arm = summarize({"a": series}, tier="4x1").arms["a"]
    assert arm.peak_mib == 900.0
    assert arm.total_mib == 1000.0
    assert arm.headroom_mib == 100.0
    assert arm.gaps == 0
    assert arm.steady_median_mib == statistics.median(s.used_bytes / MIB for s in meas)
    assert arm.n_measure == len(meas)


def test_steady_state_excludes_warmup_samples_exactly():
    sampler = ScriptedSampler([100, 900, 300, 500, 400, 200])
    samples = [take_sample(sampler, float(i), "warmup" if i < 2 else "measure") for i in range(6)]
    arm = summarize({"a": MemSeries("fake", 1.0, samples)}, tier="4x1").arms["a"]
    assert arm.steady_median_mib == 350.0  # median(300, 500, 400, 200)
    assert arm.peak_mib == 900.0  # the warmup spike
    assert arm.n_measure == 4 and arm.n_samples == 6
    assert arm.warmup_end_s == 2.0


def test_a_sampler_that_raises_mid_run_leaves_a_gap_and_sampling_goes_on():
    sampler = ScriptedSampler([100, 200, RuntimeError("npu-smi stopped answering"), 300])
    rec = MemoryRecorder(sampler, interval_s=0.01)
    rec.start("measure")
    wait_for_calls(sampler, 5)
    series = rec.stop()
    gaps = [s for s in series.samples if not s.ok]
    assert len(gaps) == 1
    assert gaps[0].used_bytes is None
    assert "RuntimeError: npu-smi stopped answering" in gaps[0].error
    assert series.samples[-1].used_bytes == 300 * MIB  # sampling continued after the gap
    arm = summarize({"a": series}, tier="1x1").arms["a"]
    assert arm.gaps == 1
    assert arm.steady_median_mib in (200.0, 300.0)


def test_sampler_overhead_is_recorded_per_sample():
    class Slow(ScriptedSampler):
        def sample(self):
            time.sleep(0.02)
            return super().sample()

    s = take_sample(Slow([10]), 0.0, "measure")
    assert s.sample_ms >= 20.0
    arm = summarize({"a": MemSeries("fake", 1.0, [s])}, tier="1x1").arms["a"]
    assert arm.sample_ms_max >= 20.0


def test_stop_takes_a_final_sample_even_for_a_tier_shorter_than_the_interval():
    sampler = ScriptedSampler([100, 250])
    rec = MemoryRecorder(sampler, interval_s=60.0)
    rec.start("warmup")
    wait_for_calls(sampler, 1)
    rec.mark("measure")
    series = rec.stop()
    assert [s.phase for s in series.samples] == ["warmup", "measure"]
    assert series.samples[-1].used_bytes == 250 * MIB
    assert 0.0 < series.phase_starts["measure"] <= series.samples[-1].t_s
    assert not rec.running


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        MemoryRecorder(ScriptedSampler([1]), interval_s=0)
