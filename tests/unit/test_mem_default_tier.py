"""`tts-bench mem`'s tier: mem.tier when set, else the config's first bench tier, and the
memory preflight checks whichever it is before any backend starts."""

from __future__ import annotations

import pytest

from tts_bench.config import load_arms, load_config
from tts_bench.errors import ConfigError
from tts_bench.mem import run as mem_run
from tts_bench.config.mem import MemParams
from tts_bench.config.shipped import DEFAULT_AB_CONFIG, shipped_config


def test_the_default_tier_is_the_configs_first_bench_tier():
    assert MemParams().tier is None
    cfg = load_config(shipped_config(DEFAULT_AB_CONFIG))
    assert mem_run.plan_from_config(cfg).tier.label == cfg.bench.tiers[0] == "2x1"
    cfg = load_config(shipped_config(DEFAULT_AB_CONFIG), ["bench.tiers=[8x2, 16x4]"])
    assert mem_run.plan_from_config(cfg).tier.label == "8x2"
    cfg = load_config(shipped_config(DEFAULT_AB_CONFIG), ["mem.tier=4x2"])
    assert mem_run.plan_from_config(cfg).tier.label == "4x2"


def test_the_memory_preflight_checks_the_default_tier(monkeypatch):
    checked = []
    monkeypatch.setattr(mem_run, "check_memory", lambda cfg, **kw: checked.append(kw))
    arms = load_arms(shipped_config(DEFAULT_AB_CONFIG), ())
    plan = mem_run.plan_from_config(next(iter(arms.values())))
    mem_run._check_memory(arms, plan)
    assert {(kw["replicas"], kw["label"]) for kw in checked} == {
        (1, "arm 'base' at tier 2x1"), (1, "arm 'test' at tier 2x1")}


def test_a_default_tier_too_large_for_the_host_is_refused_before_any_run(monkeypatch, tmp_path):
    def refuse(cfg, **kw):
        raise ConfigError(f"error: too much memory ({kw['label']}); lower the tier")

    monkeypatch.setattr(mem_run, "check_memory", refuse)
    with pytest.raises(ConfigError, match="at tier 2x1"):
        mem_run.measure_memory(None, result_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # no run directory
