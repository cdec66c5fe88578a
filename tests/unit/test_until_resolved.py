"""`--until-resolved`: the stopping rule, and whole runs on the synthetic backend."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tts_bench.ab import plan_from_run, run_ab
from tts_bench.config import config_to_dict, load_config, parse_tiers
from tts_bench.errors import ConfigError
from tts_bench.rundir.results import RunDir
from tts_bench.verdicts.stats import compare
from tts_bench.verdicts.until_resolved import UntilResolved

SYNTH = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
         "synthetic.first_chunk_delay_s=0.003", "synthetic.chunk_delay_s=0.003", "bench.warmup=1"]


def arms(*sets: str):
    return {"base": load_config(None, [*SYNTH, *sets]), "test": load_config(None, [*SYNTH, *sets])}


def new_run(tmp_path, a, rule: UntilResolved, tiers=("2x1",)) -> RunDir:
    return RunDir.create(tmp_path, "ab", command_line=["test"],
                         configs={n: config_to_dict(c) for n, c in a.items()},
                         extra={"ab": {"tiers": list(tiers), "repeats": 1, "num_prompts": 4,
                                       "until_resolved": rule.to_dict()}})


def cmp_with_half_width(half: float):
    # Blocks at +-d: s = d * sqrt(2), half-width t(0.975, 1) * s / sqrt(2) = 12.706 d (log units).
    d = half / 12.706 / 100
    return compare([np.ones(3), np.ones(3)], [np.full(3, np.exp(d)), np.full(3, np.exp(-d))])


def test_rule_stops_when_every_tier_is_under_the_target():
    rule = UntilResolved(target_half_width_pct=1.0, max_repeats=10, min_repeats=2)
    narrow, wide = cmp_with_half_width(0.5), cmp_with_half_width(5.0)
    assert narrow.half_width_pct < 1.0 < wide.half_width_pct
    assert rule.next_step({"2x1": narrow}, repeats={"2x1": 2}, elapsed_s=0, last_round_s=1).stop == "resolved"
    step = rule.next_step({"2x1": narrow, "4x2": wide}, repeats={"2x1": 2, "4x2": 2}, elapsed_s=0, last_round_s=1)
    assert step.stop is None and step.extend == ["4x2"]


def test_rule_stops_on_max_repeats_and_on_budget():
    wide = cmp_with_half_width(5.0)
    rule = UntilResolved(target_half_width_pct=1.0, max_repeats=6, budget_min=1.0)
    assert rule.next_step({"2x1": wide}, repeats={"2x1": 6}, elapsed_s=0, last_round_s=1).stop == "max repeats"
    assert rule.next_step({"2x1": wide}, repeats={"2x1": 4}, elapsed_s=50, last_round_s=20).stop == "budget"
    assert rule.next_step({"2x1": wide}, repeats={"2x1": 4}, elapsed_s=30, last_round_s=20).stop is None
    assert rule.next_step({"2x1": None}, repeats={"2x1": 2}, elapsed_s=0, last_round_s=1).stop is None


def test_two_quiet_blocks_cannot_stop_the_run_before_the_minimum():
    rule = UntilResolved(target_half_width_pct=1.0, max_repeats=10)
    narrow = cmp_with_half_width(0.1)  # two blocks agreeing by chance
    step = rule.next_step({"2x1": narrow}, repeats={"2x1": 2}, elapsed_s=0, last_round_s=1)
    assert step.stop is None and step.extend == ["2x1"]
    assert UntilResolved(1.0, min_repeats=2).next_step({"2x1": narrow}, repeats={"2x1": 2}, elapsed_s=0,
                                                       last_round_s=1).stop == "resolved"
    # A cap below the minimum stops by max repeats, never as resolved.
    capped = UntilResolved(1.0, max_repeats=2)
    assert capped.next_step({"2x1": narrow}, repeats={"2x1": 2}, elapsed_s=0, last_round_s=1).stop == "max repeats"


def test_the_minimum_blocks_is_a_bench_key_checked_at_least_two():
    assert load_config(None, SYNTH).bench.until_resolved_min_repeats == 4
    with pytest.raises(ConfigError, match="until_resolved_min_repeats must be in 2..100, got 1"):
        load_config(None, [*SYNTH, "bench.until_resolved_min_repeats=1"])
    with pytest.raises(ValueError, match="until_resolved_min_repeats must be >= 2"):
        UntilResolved(1.0, min_repeats=1)
    rule = UntilResolved(1.0, min_repeats=6)
    assert UntilResolved.from_dict(rule.to_dict()) == rule


def test_first_round_is_whole_pairs_within_the_cap():
    rule = UntilResolved(1.0, max_repeats=8)
    assert [rule.first_repeats(k) for k in (1, 2, 3, 4)] == [2, 2, 4, 4]
    assert UntilResolved(1.0, max_repeats=3).first_repeats(3) == 3
    with pytest.raises(ValueError, match="max-repeats"):
        UntilResolved(1.0, max_repeats=1)
    with pytest.raises(ValueError, match=r"--max-repeats must be in \[2, 100\], got 100000"):
        UntilResolved(1.0, max_repeats=100_000)
    with pytest.raises(ValueError, match="min_effect_pct"):
        UntilResolved(0.0)


def test_a_loose_target_is_resolved_after_the_minimum_blocks(tmp_path):
    # Target half-width 200%: blocks of synthetic jitter stay far below it even when a
    # neighbour's load shifts one phase by tens of percent; it stops at min_repeats (4), not 2.
    a = arms("bench.min_effect_pct=400")
    rule = UntilResolved(200.0, max_repeats=8)
    result = run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=4, run_dir=new_run(tmp_path, a, rule),
                    until=rule)
    ur = result.until_resolved
    assert ur["stopped_by"] == "resolved" and ur["repeats"] == {"2x1": 4} and ur["min_repeats"] == 4
    assert result.tiers[0].rtf.blocks == 4 and result.tiers[0].rtf.half_width_pct < 200.0
    assert result.to_dict()["until_resolved"]["stopped_by"] == "resolved"


def test_an_unreachable_target_stops_at_max_repeats_in_pairs(tmp_path, caplog):
    a = arms("bench.min_effect_pct=0.0001")
    rule = UntilResolved(0.00005, max_repeats=5)
    with caplog.at_level("INFO", logger="tts_bench.verdicts.until_resolved"):
        result = run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=4, run_dir=new_run(tmp_path, a, rule),
                        until=rule)
    assert result.until_resolved["stopped_by"] == "max repeats"
    assert result.until_resolved["repeats"] == {"2x1": 4}  # 2, then one pair; a third would pass 5
    progress = [r.message for r in caplog.records if r.message.startswith("until-resolved 2x1")]
    assert len(progress) == 2 and "half-width" in progress[0] and "target < 5e-05%" in progress[0]
    reps = Counter(r["repeat"] for r in RunDir.open(result.run_dir).read_requests() if not r["warmup"])
    assert reps == {0: 8, 1: 8, 2: 8, 3: 8}


def test_the_budget_stops_it_after_the_first_round(tmp_path):
    a = arms("bench.min_effect_pct=0.0001")
    rule = UntilResolved(0.00005, max_repeats=10, budget_min=0.0001)
    result = run_ab(a, parse_tiers("2x1,4x1"), repeats=2, num_prompts=4,
                    run_dir=new_run(tmp_path, a, rule, ("2x1", "4x1")), until=rule)
    assert result.until_resolved["stopped_by"] == "budget"
    assert result.until_resolved["repeats"] == {"2x1": 2, "4x1": 2}


def test_resume_replays_the_decisions_and_finishes_the_same_plan(tmp_path):
    a = arms("bench.min_effect_pct=0.0001")
    rule = UntilResolved(0.00005, max_repeats=4)
    run = new_run(tmp_path, a, rule)
    full = run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=4, run_dir=run, until=rule)
    lines = run.requests_path.read_text().splitlines(keepends=True)
    run.requests_path.write_text("".join(lines[: len(lines) * 2 // 3]))
    reopened = RunDir.open(run.path)
    plan = plan_from_run(reopened)
    assert plan.until == rule
    again = run_ab(plan.arms, plan.tiers, repeats=plan.repeats, num_prompts=plan.num_prompts,
                   run_dir=reopened, resume=True, until=plan.until)
    assert again.until_resolved["repeats"] == full.until_resolved["repeats"] == {"2x1": 4}
    ids = [r["request_id"] for r in RunDir.open(run.path).read_requests()]
    assert max(Counter(ids).values()) == 1 and len(ids) == len(lines)
