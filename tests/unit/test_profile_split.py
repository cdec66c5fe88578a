"""The tier split of `tts-bench profile`: how much of each step one second of audio costs."""

from __future__ import annotations

import pytest

from stages.code2wav.config import Code2WavConfig
from tts_bench.config import Tier
from tts_bench.profile.split import TierPlan


@pytest.mark.parametrize(
    ("tier", "talker_rows", "code2wav_rows", "decodes"),
    [((128, 8), 128, 8, 16.0), ((32, 1), 32, 8, 4.0), ((4, 2), 4, 2, 2.0), ((3, 2), 3, 2, 1.5)],
)
def test_tier_plan_profiles_talker_at_c_rows_and_code2wav_at_the_replica_batch(
    tier, talker_rows, code2wav_rows, decodes
):
    plan = TierPlan.of(Tier(*tier), max_num_seqs=8, cfg=Code2WavConfig())
    assert (plan.talker_rows, plan.code2wav_rows) == (talker_rows, code2wav_rows)
    assert plan.talker_steps_per_s == 25.0  # 25 Hz codes: one step per code per stream
    assert plan.decodes_per_s == decodes  # one 25-code payload (1 s) per stream
