"""Odd repeat counts leave part of a position effect in the delta: a warning, and the per-position means."""

from __future__ import annotations

from pathlib import Path

import pytest

from tts_bench.ab import AbRequest, run_session
from tts_bench.ab.position import odd_repeats_warning, position_means
from tts_bench.rundir.records import RequestRecord

ROOT = Path(__file__).resolve().parents[2]
SETS = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
        "synthetic.first_chunk_delay_s=0.003", "synthetic.chunk_delay_s=0.003", "bench.warmup=1"]


def test_odd_repeats_above_one_warn_with_the_fix():
    assert odd_repeats_warning(1) is None and odd_repeats_warning(2) is None and odd_repeats_warning(4) is None
    line = odd_repeats_warning(3)
    assert line.startswith("warning: 3 repeats is odd") and "use --repeats 4" in line and "\n" not in line


def test_an_odd_ab_run_logs_the_warning_and_records_the_position_means(tmp_path, caplog):
    request = AbRequest(config=ROOT / "configs/ab/synthetic.yaml", tiers="2x1", num_prompts=2, repeats=3,
                        sets=SETS, result_dir=tmp_path)
    with caplog.at_level("WARNING", logger="tts_bench.ab.session"):
        session = run_session(request)
    assert [r.message for r in caplog.records if "repeats is odd" in r.message] == [odd_repeats_warning(3)]
    pos = session.result.to_dict()["tiers"][0]["position"]
    assert pos["phases"] == [3, 3] and pos["first"] > 0 and pos["second"] > 0


def rec(arm: str, repeat: int, rtf: float) -> RequestRecord:
    return RequestRecord(arm=arm, tier="2x1", repeat=repeat, request_id=f"{arm}-{repeat}", utt="u", warmup=False,
                         phase_id=f"{arm}{repeat}", t_send_s=0.0, t_end_s=1.0, audio_ttfp_ms=10.0, audio_rtf=rtf,
                         audio_seconds=1.0)


def test_position_means_follow_the_counterbalanced_order():
    # A B, then B A: the first phase of each block reads 1.1, the second 1.0, whichever arm.
    records = [rec("base", 0, 1.1), rec("test", 0, 1.0), rec("test", 1, 1.1), rec("base", 1, 1.0)]
    pos = position_means(records, ("base", "test"))["2x1"]
    assert pos["first"] == pytest.approx(1.1) and pos["second"] == pytest.approx(1.0)
    assert pos["second_vs_first_pct"] == pytest.approx(-100 / 11)
