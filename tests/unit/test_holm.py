"""Holm over a run's verdicts: the family-wise rate of faster/slower calls, not one 5 % per verdict."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from tts_bench.ab.summary import summarize_ab
from tts_bench.config import load_config, parse_tiers
from tts_bench.verdicts.holm import holm_adjust
from tts_bench.rundir.records import RequestRecord
from tts_bench.verdicts.stats import compare


def test_holm_adjust_matches_a_hand_computation():
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 1 x 0.04)
    assert holm_adjust([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm_adjust([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_the_comparison_p_value_is_scipys_one_sample_t_test_of_the_block_log_ratios():
    base = [np.full(3, 1.0), np.full(3, 2.0), np.full(3, 0.5)]
    test = [np.full(3, 1.10), np.full(3, 2.04), np.full(3, 0.53)]
    d = np.log([1.10, 1.02, 1.06])
    assert compare(base, test).p_value == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue, rel=1e-9)


def rec(arm: str, repeat: int, i: int, rtf: float) -> RequestRecord:
    return RequestRecord(arm=arm, tier="2x1", repeat=repeat, request_id=f"{arm}-{i}", utt=f"u{i}", warmup=False,
                         phase_id=f"{arm}{repeat}", t_send_s=0.0, t_end_s=2.0, audio_ttfp_ms=10.0,
                         audio_rtf=rtf, audio_seconds=1.0)


def test_a_verdict_significant_alone_reads_within_noise_after_holm_with_a_note():
    # RTF -5 %, -3.5 %, -6.5 % over 3 blocks: p = 0.03 alone (faster), 0.09 after Holm over the
    # tier's three verdicts (TTFP and throughput unchanged).
    arms = {"base": load_config(None, ["backend=synthetic"]), "test": load_config(None, ["backend=synthetic"])}
    records = [rec("base", k, i, 0.5 + 0.01 * i) for k in range(3) for i in range(4)]
    records += [rec("test", k, i, (0.5 + 0.01 * i) * (1 - x)) for k, x in enumerate((0.05, 0.035, 0.065))
                for i in range(4)]
    result = summarize_ab(records, arms, parse_tiers("2x1"), run_dir="x")
    rtf = result.tiers[0].rtf
    assert rtf.ci95_pct[1] < 0 and rtf.delta_mean_pct < -2.0 and rtf.p_value < 0.05  # faster alone
    assert rtf.verdict == "within noise" and rtf.holm_demoted and rtf.family_size == 3
    assert rtf.holm_p == pytest.approx(3 * rtf.p_value)
    assert "not significant after Holm over 3 verdicts" in rtf.verdict_text
    doc = result.to_dict()
    assert doc["multiple_comparisons"]["method"] == "holm" and doc["multiple_comparisons"]["family_size"] == 3
    assert doc["tiers"][0]["verdict"] == "within noise"
