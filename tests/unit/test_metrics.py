"""Aggregates over request records: vLLM-style names, failures by kind, throughput."""

from __future__ import annotations

import numpy as np
import pytest

from tts_bench.rundir.records import RequestRecord
from tts_bench.load.metrics import aggregate, measured_wall_s


def rec(i, *, rtf=None, ttfp=None, seconds=0.0, kind=None, warmup=False, phase="p0", t=(0.0, 1.0)):
    return RequestRecord(
        arm="base", tier="2x1", repeat=0, request_id=f"r{i}", utt="u", warmup=warmup, phase_id=phase,
        t_send_s=t[0], t_end_s=t[1], audio_ttfp_ms=ttfp, audio_rtf=rtf, audio_seconds=seconds,
        failure_kind=kind,
    )


def test_statistics_of_rtf_and_ttfp_over_completed_requests():
    rtfs = [0.1, 0.2, 0.3, 0.4, 1.0]
    records = [rec(i, rtf=v, ttfp=10 * (i + 1), seconds=2.0) for i, v in enumerate(rtfs)]
    agg = aggregate(records)
    assert agg.completed == 5 and agg.failed == 0
    assert agg.mean_audio_rtf == pytest.approx(0.4)
    assert agg.median_audio_rtf == pytest.approx(0.3)
    assert agg.std_audio_rtf == pytest.approx(np.std(rtfs, ddof=1))
    assert agg.p90_audio_rtf == pytest.approx(np.percentile(rtfs, 90))
    assert agg.p99_audio_rtf == pytest.approx(np.percentile(rtfs, 99))
    assert agg.mean_audio_ttfp_ms == pytest.approx(30.0)
    assert agg.median_audio_ttfp_ms == pytest.approx(30.0)
    assert agg.mean_audio_seconds == pytest.approx(2.0)


def test_failures_are_counted_by_kind_and_excluded_from_statistics():
    records = [rec(0, rtf=0.5, ttfp=5.0, seconds=1.0), rec(1, kind="timeout"),
               rec(2, kind="timeout"), rec(3, kind="empty_audio")]
    agg = aggregate(records)
    assert (agg.completed, agg.failed) == (1, 3)
    assert agg.failed_by_kind == {"empty_audio": 1, "timeout": 2}
    assert agg.mean_audio_rtf == 0.5
    assert agg.failure_fraction == pytest.approx(0.75)


def test_warmup_records_are_ignored():
    records = [rec(0, rtf=0.5, ttfp=1.0, seconds=1.0), rec(1, rtf=9.0, ttfp=1.0, seconds=1.0, warmup=True),
               rec(2, kind="timeout", warmup=True)]
    agg = aggregate(records)
    assert (agg.completed, agg.failed, agg.mean_audio_rtf) == (1, 0, 0.5)


def test_throughput_sums_the_wall_time_of_each_phase():
    # Two phases (e.g. two repeats): 2 s and 3 s of wall time, 10 s of audio in all.
    records = [rec(0, rtf=0.1, ttfp=1.0, seconds=4.0, phase="a", t=(1.0, 2.0)),
               rec(1, rtf=0.1, ttfp=1.0, seconds=1.0, phase="a", t=(1.5, 3.0)),
               rec(2, rtf=0.1, ttfp=1.0, seconds=5.0, phase="b", t=(100.0, 103.0))]
    assert measured_wall_s(records) == pytest.approx(5.0)
    agg = aggregate(records)
    assert agg.audio_throughput == pytest.approx(10.0 / 5.0)
    assert agg.request_throughput == pytest.approx(3 / 5.0)


def test_no_records_gives_none_not_nan():
    agg = aggregate([])
    assert (agg.completed, agg.failed, agg.mean_audio_rtf, agg.audio_throughput) == (0, 0, None, None)
    assert agg.failure_fraction == 0.0
    assert set(agg.to_dict()) >= {"completed", "failed", "mean_audio_rtf", "p99_audio_ttfp_ms", "audio_throughput"}
