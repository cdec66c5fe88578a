"""`MemoryHooks` inside a real (synthetic-backend) A/B: the object `tts-bench ab --mem` passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tts_bench.ab import run_ab
from tts_bench.config import config_to_dict, load_arms, parse_tiers
from tts_bench.mem.hooks import MemoryHooks, make_ab_hooks
from tts_bench.rundir.results import RunDir

ROOT = Path(__file__).resolve().parents[2]
SETS = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
        "synthetic.first_chunk_delay_s=0.01", "synthetic.chunk_delay_s=0.01", "bench.warmup=2",
        "mem.sampler=rss", "mem.interval_s=0.05"]


def test_hooks_sample_every_arm_and_tier_of_an_ab_and_record_them(tmp_path):
    arms = load_arms(ROOT / "configs/ab/synthetic.yaml", SETS)
    run = RunDir.create(tmp_path, "ab", command_line=["test"],
                        configs={n: config_to_dict(c) for n, c in arms.items()})
    hooks = make_ab_hooks(next(iter(arms.values())), run)
    assert isinstance(hooks, MemoryHooks) and hooks.sampler_names == ("rss",)
    run_ab(arms, parse_tiers("2x1,4x2"), repeats=1, num_prompts=6, run_dir=run, hooks=hooks)

    summaries = hooks.summaries()
    assert [(s.tier, s.sampler, list(s.arms)) for s in summaries] == [
        ("2x1", "rss", ["base", "test"]), ("4x2", "rss", ["base", "test"])]
    for s in summaries:
        for arm in s.arms.values():
            assert arm.n_measure >= 1 and arm.steady_median_mib > 0 and arm.gaps == 0
    doc = RunDir.open(run.path).doc["mem"]
    assert [t["tier"] for t in doc["tiers"]] == ["2x1", "4x2"]
    assert sorted(Path(p).name for p in doc["timelines"]) == [
        "mem_timeline_2x1_r0_rss.png", "mem_timeline_4x2_r0_rss.png"]
    assert all(Path(p).is_file() for p in doc["timelines"])


def test_unknown_phase_is_rejected():
    with pytest.raises(ValueError, match="unknown phase"):
        MemoryHooks(("rss",)).on_phase("base", "2x1", 0, "cooldown", backend=None)


def test_a_tiers_png_is_drawn_only_after_both_arms_ran(tmp_path):
    # Drawing grows this process's RSS; between two arms it would be charged to the second.
    run = RunDir.create(tmp_path, "ab", command_line=["test"], configs={})
    hooks = MemoryHooks(("rss",), interval_s=0.05, run_dir=run)
    png = run.path / "mem_timeline_2x1_r0_rss.png"
    for arm in ("base", "test"):
        for phase in ("warmup", "measure", "end"):
            hooks.on_phase(arm, "2x1", 0, phase, backend=None)
        assert png.exists() == (arm == "test")
        assert list(RunDir.open(run.path).doc["mem"]["tiers"][0]["arms"]) == (
            ["base"] if arm == "base" else ["base", "test"])
