"""Throughput as a verdict metric: per-block audio seconds per wall second, higher is better."""

from __future__ import annotations

import pytest

from tts_bench.ab.summary import summarize_ab
from tts_bench.ab.throughput import block_throughputs
from tts_bench.config import load_config, parse_tiers
from tts_bench.rundir.records import RequestRecord

SYNTH = ["backend=synthetic", "bench.min_effect_pct=2"]


def rec(arm: str, repeat: int, i: int, *, send: float, end: float, audio: float = 1.0, ok: bool = True,
        warmup: bool = False, phase: str | None = None, rtf: float = 0.5) -> RequestRecord:
    return RequestRecord(arm=arm, tier="2x1", repeat=repeat, request_id=f"{arm}-{repeat}-{i}", utt=f"u{i}",
                         warmup=warmup, phase_id=phase or f"{arm}{repeat}", t_send_s=send, t_end_s=end,
                         audio_ttfp_ms=10.0 + i, audio_rtf=rtf + 0.001 * i, audio_seconds=audio,
                         failure_kind=None if ok else "backend_error")


def phase(arm: str, repeat: int, wall: float, *, n: int = 4) -> list[RequestRecord]:
    """n requests of 1 audio s in a phase spanning `wall` s: throughput n / wall."""
    return [rec(arm, repeat, i, send=0.1 * i, end=wall) for i in range(n)]


def test_block_throughput_is_audio_over_the_phase_span_of_measured_requests():
    records = [*phase("base", 0, 2.0), rec("base", 0, 9, send=-5.0, end=9.0, warmup=True, audio=50.0),
               rec("base", 0, 8, send=0.5, end=1.0, ok=False, audio=0.0)]
    # A resumed phase: two phase ids, their spans add (2 s + 2 s) and so does the audio.
    records += [rec("test", 0, i, send=0.0, end=2.0, phase="p1") for i in range(2)]
    records += [rec("test", 0, i, send=10.0, end=12.0, phase="p2") for i in range(2, 4)]
    thr = block_throughputs(records)
    assert thr["2x1"]["base"][0] == pytest.approx(4 / 2.0)  # warmup excluded; a failure spans, adds no audio
    assert thr["2x1"]["test"][0] == pytest.approx(4 / 4.0)


def test_window_figures_win_over_the_count_mode_span():
    thr = block_throughputs(phase("base", 0, 2.0), windows={("2x1", "base", 0): 7.5, ("2x1", "test", 0): 3.0})
    assert thr["2x1"] == {"base": {0: 7.5}, "test": {0: 3.0}}


def test_higher_throughput_reads_faster_and_lower_reads_slower():
    arms = {"base": load_config(None, SYNTH), "test": load_config(None, SYNTH)}
    tiers = parse_tiers("2x1")
    walls = {"base": (2.0, 2.02, 1.98, 2.01), "faster": (1.6, 1.61, 1.59, 1.6), "slower": (2.5, 2.52, 2.49, 2.5)}

    def result(test_walls):
        records = [r for k, w in enumerate(walls["base"]) for r in phase("base", k, w)]
        records += [r for k, w in enumerate(test_walls) for r in phase("test", k, w)]
        return summarize_ab(records, arms, tiers, run_dir="x").tiers[0]

    up, down = result(walls["faster"]), result(walls["slower"])
    assert up.throughput.delta_mean_pct == pytest.approx(25.0, abs=1.0) and up.throughput.ci95_pct[0] > 0
    assert up.throughput.verdict == "faster"
    assert down.throughput.delta_mean_pct == pytest.approx(-20.0, abs=1.0) and down.throughput.verdict == "slower"
    doc = up.to_dict()
    assert doc["throughput"]["verdict"] == "faster" and doc["block_throughputs"]["base"]["0"] == pytest.approx(2.0)
    row = up.throughput_row()
    assert row["verdict"] == "faster" and row["arms"]["test"]["mean_audio_throughput"] == pytest.approx(2.5, rel=0.01)


def test_the_ab_output_has_a_throughput_table(tmp_path):
    from tts_bench.commands.ab import render_result

    arms = {"base": load_config(None, SYNTH), "test": load_config(None, SYNTH)}
    records = [r for k in range(2) for a in ("base", "test") for r in phase(a, k, 2.0 + 0.01 * k)]
    text = render_result(summarize_ab(records, arms, parse_tiers("2x1"), run_dir="x"), "md")
    assert "audio throughput, audio s per wall s per block (higher is faster)" in text
    assert "2.00 / 2.00" in text.split("audio throughput")[1]


def test_a_coarse_metric_gets_a_note_under_the_tables():
    from tts_bench.commands.ab import render_result

    arms = {"base": load_config(None, SYNTH), "test": load_config(None, SYNTH)}
    records = [r for k in range(2) for a in ("base", "test") for r in phase(a, k, 2.0 + 0.01 * k)]
    text = render_result(summarize_ab(records, arms, parse_tiers("2x1"), run_dir="x"), "md")
    # TTFP here is 10, 11, 12, 13 ms in every phase: four levels, 25 % block steps.
    assert "note: 2x1 TTFP unresolved (metric resolution): 16 values on 4 levels" in text
