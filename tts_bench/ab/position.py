"""The position effect inside a block: is the first phase of a block slower than the second?

Blocks run counterbalanced (`phase_order`: A B, then B A), so over an even
number of blocks each arm runs first as often as second and a position effect cancels in the
delta. With an odd count above one, one A B block has no B A partner and part of the effect
stays in the delta: on an H200 both arms' first block read 1.34-1.39 mean RTF against 1.28-1.33
after it. So an odd count warns (`odd_repeats_warning`), and every tier records the mean of its
phases by position (`position_means`) so the effect is visible in the JSON. A run-level warmup
(one discarded phase per arm before the first block) removes the cold-start part of it.

    position_means(records, ("base", "test"))["2x1"]   # {"first": 0.81, "second": 0.77, ...}
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from tts_bench.rundir.records import RequestRecord


def phase_order(arms: Sequence[str], repeat: int) -> list[str]:
    """The arms' order within one repeat: as given on even repeats, reversed on odd ones (A B B A).

    Why: on an H200 the second of two arms ran 12-15% faster at 32x1 in two unrelated A/Bs with
    one repeat each; with plain A B A B that position effect always favours the test arm."""
    return list(arms) if repeat % 2 == 0 else list(arms)[::-1]


def odd_repeats_warning(repeats: int) -> str | None:
    """One line for an odd repeat count above one (None otherwise), naming the fix."""
    if repeats <= 1 or repeats % 2 == 0:
        return None
    return (f"warning: {repeats} repeats is odd: one A B block has no B A partner, so a position effect "
            f"(a block's first phase slower) stays partly in the delta; use --repeats {repeats + 1}")


def position_means(records: Iterable[RequestRecord], arms: Sequence[str],
                   metric: str = "audio_rtf") -> dict[str, dict[str, Any]]:
    """Per tier: the mean over phases of each phase's mean `metric`, by the phase's position in
    its block (first, second), and the second relative to the first in percent."""
    phases: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for r in records:
        if not r.warmup and r.ok and getattr(r, metric) is not None:
            phases[(r.tier, r.arm, r.repeat)].append(getattr(r, metric))
    by_tier: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"first": [], "second": []})
    for (tier, arm, repeat), values in phases.items():
        order = phase_order(list(arms), repeat)
        if arm in order:
            by_tier[tier]["first" if order.index(arm) == 0 else "second"].append(sum(values) / len(values))
    out = {}
    for tier, pos in by_tier.items():
        first = sum(pos["first"]) / len(pos["first"]) if pos["first"] else None
        second = sum(pos["second"]) / len(pos["second"]) if pos["second"] else None
        out[tier] = {"metric": metric, "first": first, "second": second,
                     "phases": [len(pos["first"]), len(pos["second"])],
                     "second_vs_first_pct": 100.0 * (second / first - 1.0) if first and second else None}
    return out
