"""Holm's step-down adjustment over the verdicts of one run (tiers x RTF / TTFP / throughput).

Each comparison's interval is a 95 % interval, so a run with 3 tiers and 3 metrics makes 9
chances for an A/A to read faster or slower. Holm (1979) controls the family-wise rate at alpha
without assuming independence: sort the m p-values, p_(1) <= ... <= p_(m); the adjusted value of
the i-th is max over j <= i of min(1, (m - j + 1) p_(j)). A faster/slower verdict stands only
when its adjusted p < alpha; otherwise it reads `within noise`, with a note that says so
(`Comparison.verdict_text`). The intervals shown stay the per-comparison 95 % intervals: Holm
adjusts the decision, not the interval.

The family is every comparison of the run that has a p-value (a tier with too many failures,
or a one-block tier without a calibration, is not tested and not counted).

    adjusted = holm_adjust([0.01, 0.04, 0.03])         # [0.03, 0.06, 0.06]
    cmps = apply_holm({("2x1", "rtf"): cmp_a, ("2x1", "ttfp"): cmp_b})
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from tts_bench.verdicts.stats import ALPHA, Comparison

K = TypeVar("K", bound=Hashable)
CALLED = ("faster", "slower")


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def apply_holm(comparisons: Mapping[K, Comparison | None], *, alpha: float = ALPHA) -> dict[K, Comparison | None]:
    """Every comparison with a p-value gets its Holm-adjusted p and the family size; a
    faster/slower verdict whose adjusted p is not below `alpha` becomes `within noise`."""
    tested = [k for k, c in comparisons.items() if c is not None and c.p_value is not None]
    adjusted = dict(zip(tested, holm_adjust([comparisons[k].p_value for k in tested])))  # type: ignore[union-attr]
    out: dict[K, Comparison | None] = {}
    for key, cmp in comparisons.items():
        if cmp is None or key not in adjusted:
            out[key] = cmp
            continue
        demote = cmp.verdict in CALLED and not adjusted[key] < alpha
        out[key] = replace(cmp, holm_p=adjusted[key], family_size=len(tested), holm_demoted=demote,
                           verdict="within noise" if demote else cmp.verdict)
    return out
