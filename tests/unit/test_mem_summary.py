"""Summary math (steady state, peak, delta, headroom), the seed-shaped table, and the PNG."""

from __future__ import annotations

import json

import pytest

from tts_bench.mem.npu_smi import MIB
from tts_bench.mem.plot import write_timeline
from tts_bench.mem.recorder import MemSample, MemSeries
from tts_bench.mem.summary import MEM_COLUMNS, mem_table, summarize, table_title
from tts_bench.report.tables import render

TOTAL = 65536


def series(warmup_mib, measure_mib, *, gaps=(), total=TOTAL, sampler="npu-smi", interval=2.0):
    samples, t = [], 0.0
    for phase, values in (("warmup", warmup_mib), ("measure", measure_mib)):
        for v in values:
            if v is None:
                samples.append(MemSample(t, phase, None, None, 1.0, error="SamplerError: timeout"))
            else:
                samples.append(MemSample(t, phase, int(v * MIB), None if total is None else total * MIB, 1.0))
            t += interval
    return MemSeries(sampler, interval, samples)


def seed_summary():
    # The seed's 128x8 measurement: parent 58492 / 58495 MB, branch 58810 / 58813 MB of 65536.
    return summarize({
        "parent": series([50000, 58495], [58490, 58492, 58494, None]),
        "branch": series([50000, 58813], [58808, 58810, 58812]),
    }, tier="128x8")


def test_seed_numbers_give_the_seed_delta_and_headroom():
    s = seed_summary()
    base, test = s.arms["parent"], s.arms["branch"]
    assert (base.steady_median_mib, base.peak_mib) == (58492.0, 58495.0)
    assert (test.steady_median_mib, test.peak_mib) == (58810.0, 58813.0)
    assert base.total_mib == TOTAL
    assert base.headroom_mib == TOTAL - 58495 and test.headroom_mib == TOTAL - 58813
    d_mib, d_pct = s.delta("branch")
    assert d_mib == 318.0
    assert d_pct == pytest.approx(100 * 318 / 58492)
    assert s.delta("parent") == (0.0, 0.0)
    assert base.gaps == 1 and base.n_measure == 3 and base.n_samples == 6


def test_json_has_the_documented_keys():
    doc = json.loads(json.dumps(seed_summary().to_dict()))
    assert doc["sampler"] == "npu-smi" and doc["interval_s"] == 2.0 and doc["base_arm"] == "parent"
    arm = doc["arms"]["branch"]
    for key in ("steady_median_mib", "peak_mib", "total_mib", "headroom_mib", "samples", "delta_mib"):
        assert key in arm
    assert arm["samples"][0] == {"t_s": 0.0, "phase": "warmup", "used_mib": 50000.0,
                                 "total_mib": 65536.0, "sample_ms": 1.0, "error": None}
    assert doc["arms"]["parent"]["samples"][-1]["error"] == "SamplerError: timeout"


def test_markdown_table_is_shaped_like_the_seed():
    text = render(mem_table(seed_summary()), "md")
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(MEM_COLUMNS)
    assert [c.strip() for c in lines[2].strip("|").split("|")] == [
        "parent", "58492.0", "58495.0", "(base)", "7041.0", "3/6, 1 gap"]
    assert [c.strip() for c in lines[3].strip("|").split("|")] == [
        "branch", "58810.0", "58813.0", "+318.0 MiB (+0.54%)", "6723.0", "3/5"]


def test_csv_and_json_renderings_carry_the_same_cells():
    df = mem_table(seed_summary())
    csv = render(df, "csv").splitlines()
    assert csv[0] == ",".join(MEM_COLUMNS)
    assert csv[2].startswith("branch,58810.0,58813.0,+318.0 MiB (+0.54%),6723.0")
    doc = json.loads(render(df, "json", title=table_title(seed_summary())))
    assert doc["rows"][1]["headroom MiB"] == "6723.0"
    assert "128x8" in doc["title"] and "65536 MiB" in doc["title"]


def test_torch_sampler_has_no_total_so_no_headroom_but_reserved_steady_and_peak():
    def s(t, phase, alloc, reserved, peak):
        return MemSample(t, phase, alloc * MIB, None, 0.5,
                         readings=[{"label": "talker", "used_bytes": alloc * MIB,
                                    "reserved_bytes": reserved * MIB, "peak_bytes": peak * MIB}])

    ser = MemSeries("torch", 1.0, [s(0, "warmup", 10, 20, 30), s(1, "measure", 12, 22, 40),
                                   s(2, "measure", 14, 24, 41)])
    summary = summarize({"base": ser}, tier="2x1")
    arm = summary.arms["base"]
    assert arm.total_mib is None and arm.headroom_mib is None
    assert arm.extra == {"reserved_steady_median_mib": 23.0, "reserved_peak_mib": 24.0,
                         "allocator_peak_mib": 41.0}
    row = mem_table(summary).iloc[0].tolist()
    assert row[1:5] == ["13.0", "14.0", "(base)", "n/a"]


def test_an_arm_without_measure_samples_has_no_steady_state_and_no_delta():
    summary = summarize({"a": series([100], [None, None]), "b": series([100], [200])}, tier="1x1")
    assert summary.arms["a"].steady_median_mib is None
    assert summary.delta("b") == (None, None)
    assert mem_table(summary).iloc[1, 3] == "n/a"


def test_timeline_png_is_written(tmp_path):
    path = write_timeline(seed_summary(), tmp_path / "sub" / "mem.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # axes, two lines and a legend, not an empty canvas


def test_the_voices_held_by_the_stages_show_as_their_peak():
    from tts_bench.mem.recorder import MemSample
    from tts_bench.mem.summary import _torch_extras

    def tick(voices: int | None) -> MemSample:
        reading = {"label": "code2wav-0", "used_bytes": 10 << 20, "reserved_bytes": 20 << 20,
                   "peak_bytes": 12 << 20}
        if voices is not None:
            reading["prompt_cache_bytes"] = voices
        return MemSample(0.0, "measure", 10 << 20, None, 1.0, [reading])

    assert "voices_peak_mib" not in _torch_extras([tick(None)], [tick(None)])
    extras = _torch_extras([tick(1 << 20), tick(3 << 20)], [tick(3 << 20)])
    assert extras["voices_peak_mib"] == 3.0


def test_an_arm_whose_every_sample_failed_is_told_to_fix_the_sampler_not_the_interval():
    from types import SimpleNamespace

    from tts_bench.mem.run import _invalid

    def summary(n, gaps):
        arm = SimpleNamespace(steady_median_mib=None, n_samples=n, gaps=gaps)
        return SimpleNamespace(sampler="npu-smi", arms={"base": arm})

    (failed,) = _invalid({}, [summary(5, 5)], {})
    assert failed.startswith("base: every npu-smi sample failed (5 gaps;") and "--sampler" in failed
    assert "lower --interval" not in failed
    (few,) = _invalid({}, [summary(1, 0)], {})
    assert "lower --interval or add prompts" in few
