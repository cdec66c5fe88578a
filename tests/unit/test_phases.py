"""One phase on a fresh backend (`run_fresh_phase`): hooks in order, cleanup when it fails."""

from __future__ import annotations

import asyncio

import pytest

from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.config import Tier, load_config
from tts_bench.inputs.prompts import Prompt
from tts_bench.load.plan import plan_jobs
from tts_bench.rundir.records import PhaseLabels
from tts_bench.rundir.results import RunDir

SETS = ["backend=synthetic", "synthetic.chunk_delay_s=0", "synthetic.first_chunk_delay_s=0"]
PROMPTS = [Prompt(f"en_{i}", "", None, "one two three") for i in range(4)]


class Hooks:
    def __init__(self, fail_at: str | None = None):
        self.calls, self.abandoned, self.fail_at = [], 0, fail_at

    def on_phase(self, arm, tier, repeat, phase, backend):
        self.calls.append(phase)
        if phase == self.fail_at:
            raise RuntimeError(f"hook failed at {phase}")

    def abandon(self):
        self.abandoned += 1


class Tracked(SyntheticBackend):
    stops = 0

    async def stop(self) -> None:
        type(self).stops += 1
        await super().stop()


def _run(tmp_path, monkeypatch, hooks, before=None):
    from tts_bench.load import phases

    monkeypatch.setattr(Tracked, "stops", 0)
    monkeypatch.setattr(phases, "make_backend", Tracked)
    cfg = load_config(None, SETS)
    run = RunDir.create(tmp_path, "ab", command_line=["test"], configs={})
    labels = PhaseLabels("base", "2x1", 0)
    jobs = plan_jobs(PROMPTS, labels, seed=0, warmup=2)
    result = asyncio.run(phases.run_fresh_phase(cfg, Tier(2, 1), labels, jobs, run_dir=run, hooks=hooks,
                                                before=before))
    return result, run


def test_hooks_see_warmup_measure_end_and_the_backend_is_described_and_stopped(tmp_path, monkeypatch):
    seen = []

    async def before(backend):
        seen.append(type(backend).__name__)

    hooks = Hooks()
    result, run = _run(tmp_path, monkeypatch, hooks, before=before)
    assert hooks.calls == ["warmup", "measure", "end"] and hooks.abandoned == 0
    assert seen == ["Tracked"] and Tracked.stops == 1
    assert [r.request_id for r in sorted(result.records, key=lambda r: r.request_id)] == [
        f"base:2x1:r0:{i:04d}" for i in range(4)]
    assert "base" in RunDir.open(run.path).doc["backends"]
    assert len(RunDir.open(run.path).read_requests()) == 6  # warmups are recorded too


def test_a_phase_that_fails_mid_way_abandons_the_hooks_and_stops_the_backend(tmp_path, monkeypatch):
    hooks = Hooks(fail_at="measure")
    with pytest.raises(RuntimeError, match="hook failed at measure"):
        _run(tmp_path, monkeypatch, hooks)
    assert hooks.calls == ["warmup", "measure"] and hooks.abandoned == 1 and Tracked.stops == 1


class Sized(Tracked):
    expected: list[int] = []

    def expect_concurrency(self, concurrency: int) -> None:
        type(self).expected.append(concurrency)


def test_a_backend_that_sizes_state_is_told_the_tiers_concurrency_before_it_starts(tmp_path, monkeypatch):
    from tts_bench.load import phases

    monkeypatch.setattr(Sized, "expected", [])
    monkeypatch.setattr(phases, "make_backend", Sized)
    cfg = load_config(None, SETS)
    run = RunDir.create(tmp_path, "ab", command_line=["test"], configs={})
    labels = PhaseLabels("base", "3x1", 0)

    async def before(backend):  # runs right after start: the concurrency came first
        assert Sized.expected == [3]

    asyncio.run(phases.run_fresh_phase(cfg, Tier(3, 1), labels, plan_jobs(PROMPTS, labels, seed=0, warmup=1),
                                       run_dir=run, before=before))
    assert Sized.expected == [3]


@pytest.mark.parametrize("size_for, told", [(8, 8), (2, 3), (None, 3)])
def test_a_larger_size_for_wins_over_the_tiers_concurrency(tmp_path, monkeypatch, size_for, told):
    from tts_bench.load import phases

    monkeypatch.setattr(Sized, "expected", [])
    monkeypatch.setattr(phases, "make_backend", Sized)
    cfg = load_config(None, SETS)
    run = RunDir.create(tmp_path, "ab", command_line=["test"], configs={})
    labels = PhaseLabels("base", "3x1", 0)
    asyncio.run(phases.run_fresh_phase(cfg, Tier(3, 1), labels, plan_jobs(PROMPTS, labels, seed=0, warmup=1),
                                       run_dir=run, size_for=size_for))
    assert Sized.expected == [told]


def test_the_hook_chain_calls_every_hook_in_order_and_abandons_those_that_can():
    from tts_bench.load.phases import HookChain

    first, second = Hooks(), Hooks()
    plain = type("Plain", (), {"on_phase": lambda self, *a: None})()  # no abandon(): skipped
    chain = HookChain(first, None, plain, second)
    chain.on_phase("base", "2x1", 0, "warmup", None)
    chain.abandon()
    assert first.calls == second.calls == ["warmup"] and first.abandoned == second.abandoned == 1
