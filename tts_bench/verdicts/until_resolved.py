"""`tts-bench ab --until-resolved`: add counterbalanced block pairs until every tier is resolved.

A tier is *resolved* when the half-width of its 95% interval of Δ mean RTF is under the target,
`bench.min_effect_pct / 2` by default: the interval is then narrower than the smallest effect the
verdict would call, so the verdict cannot be `within noise` merely for lack of repeats. No tier
counts as resolved before `min_repeats` blocks (`bench.until_resolved_min_repeats`, default 4):
two quiet blocks agree by chance (an A/A audit stopped 3 of 12 tiers at 2 blocks with an MDE of
0.3-0.8 %, while the same tiers' spread over 10 blocks was several times that). The run
starts with the plan's repeats (at least 2, rounded up to a whole pair), then after each round
adds one pair of blocks (A B, then B A: the order stays counterbalanced) to every tier still
unresolved, until

    resolved      every tier's half-width < target, with at least min_repeats blocks
    max repeats   the next pair would exceed --max-repeats in every unresolved tier
    budget        the next round would end past --budget minutes (the last round's time as guide)

This module holds the rule; `tts_bench.ab.run_ab` drives the rounds. The settings live in the
run's plan, and the elapsed time in run.json, so `--resume` replays the same decisions (the
statistics are deterministic) and then carries on.

    rule = UntilResolved(target_half_width_pct=1.0, max_repeats=10, budget_min=30, min_repeats=4)
    step = rule.next_step(comparisons, repeats={"2x1": 4}, elapsed_s=300, last_round_s=80)
    step.stop, step.extend        # None, ["2x1"]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tts_bench.config.limits import MAX_REPEATS
from tts_bench.report.tables import fmt_ci, fmt_pct
from tts_bench.rundir.results import RunDir
from tts_bench.verdicts.stats import Comparison

log = logging.getLogger(__name__)

StopReason = Literal["resolved", "max repeats", "budget"]
DEFAULT_MAX_REPEATS = 10
DEFAULT_MIN_REPEATS = 4  # bench.until_resolved_min_repeats


@dataclass(frozen=True)
class Step:
    stop: StopReason | None
    extend: list[str] = field(default_factory=list)  # tiers that get one more pair


@dataclass(frozen=True)
class UntilResolved:
    target_half_width_pct: float
    max_repeats: int = DEFAULT_MAX_REPEATS
    budget_min: float | None = None
    min_repeats: int = DEFAULT_MIN_REPEATS  # no tier is resolved with fewer blocks

    def __post_init__(self) -> None:
        if self.min_repeats < 2:
            raise ValueError(f"bench.until_resolved_min_repeats must be >= 2 (one block has no spread), "
                             f"got {self.min_repeats}")
        if not self.target_half_width_pct > 0:
            raise ValueError(f"until-resolved needs a half-width target > 0 (bench.min_effect_pct / 2), "
                             f"got {self.target_half_width_pct}")
        if not 2 <= self.max_repeats <= MAX_REPEATS:  # the cap --repeats has too
            raise ValueError(f"--max-repeats must be in [2, {MAX_REPEATS}], got {self.max_repeats}")
        if self.budget_min is not None and not self.budget_min > 0:
            raise ValueError(f"--budget must be > 0 minutes, got {self.budget_min}")

    def first_repeats(self, repeats: int) -> int:
        """Blocks of the first round: the plan's, at least one pair, whole pairs, within the cap."""
        k = max(2, repeats)
        return min(k + k % 2, self.max_repeats)

    def resolved(self, cmp: Comparison | None) -> bool:
        """Narrow enough, from at least `min_repeats` blocks (a cap below it stops by max repeats)."""
        return (cmp is not None and cmp.half_width_pct is not None and cmp.blocks >= self.min_repeats
                and cmp.half_width_pct < self.target_half_width_pct)

    def next_step(self, comparisons: Mapping[str, Comparison | None], *, repeats: Mapping[str, int],
                  elapsed_s: float, last_round_s: float) -> Step:
        open_tiers = [t for t, c in comparisons.items() if not self.resolved(c)]
        if not open_tiers:
            return Step("resolved")
        extend = [t for t in open_tiers if repeats[t] + 2 <= self.max_repeats]
        if not extend:
            return Step("max repeats")
        if self.budget_min is not None and elapsed_s + last_round_s > 60.0 * self.budget_min:
            return Step("budget")
        return Step(None, extend)

    def to_dict(self) -> dict[str, Any]:
        return {"target_half_width_pct": self.target_half_width_pct, "max_repeats": self.max_repeats,
                "budget_min": self.budget_min, "min_repeats": self.min_repeats}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> UntilResolved:
        budget = d.get("budget_min")
        return cls(float(d["target_half_width_pct"]), int(d["max_repeats"]),
                   None if budget is None else float(budget), int(d.get("min_repeats", DEFAULT_MIN_REPEATS)))


def progress_line(tier: str, cmp: Comparison | None, rule: UntilResolved, repeats: int) -> str:
    """One stderr line per tier after each round: the current interval and the target."""
    if cmp is None:
        return f"until-resolved {tier}: {repeats} repeats, no comparison yet (failures?)"
    hw = cmp.half_width_pct
    state = "resolved" if rule.resolved(cmp) else ("open" if cmp.blocks >= rule.min_repeats
                                                   else f"open (fewer than {rule.min_repeats} blocks)")
    width = "n/a" if hw is None else f"{hw:.1f}%"
    return (f"until-resolved {tier}: {repeats} repeats, Δ {fmt_pct(cmp.delta_mean_pct)} "
            f"{fmt_ci(cmp.ci95_pct)}, half-width {width} (target < {rule.target_half_width_pct:g}%), {state}")


async def drive(
    rule: UntilResolved,
    blocks: Callable[[str, int, int], Awaitable[None]],
    tiers: Sequence[str],
    *,
    repeats: int,
    run_dir: RunDir,
    comparisons: Callable[[], Mapping[str, Comparison | None]],
) -> dict[str, Any]:
    """Run rounds of blocks (`blocks(tier, first, stop)` runs repeats first..stop-1 of a tier)
    until `rule` stops them; `comparisons()` reads the RTF comparison of every tier from the
    record. Returns what the result records about it (the rule, the stop reason, repeats)."""
    state = run_dir.doc.get("until_resolved_state") or {}
    elapsed = float(state.get("elapsed_s", 0.0))  # time spent before a --resume
    target = {t: rule.first_repeats(repeats) for t in tiers}
    done = dict.fromkeys(tiers, 0)
    while True:
        t0 = time.perf_counter()
        for tier in tiers:
            await blocks(tier, done[tier], target[tier])
            done[tier] = target[tier]
        last_round = time.perf_counter() - t0
        elapsed += last_round
        run_dir.update(until_resolved_state={"elapsed_s": elapsed})
        cmps = comparisons()
        for tier in tiers:
            log.info("%s", progress_line(tier, cmps.get(tier), rule, done[tier]))
        step = rule.next_step(cmps, repeats=done, elapsed_s=elapsed, last_round_s=last_round)
        if step.stop is not None:
            log.info("until-resolved: stopped by %s after %.0f s", step.stop, elapsed)
            return {**rule.to_dict(), "stopped_by": step.stop, "elapsed_s": round(elapsed, 1),
                    "repeats": dict(done)}
        for tier in step.extend:
            target[tier] = done[tier] + 2
