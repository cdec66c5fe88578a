"""What the A/A scripts share: a false-verdict count as a rate with its Clopper-Pearson 95 %
interval, and how a table cell prints it.

    r = rate(3, 100)      # {"count": 3, "of": 100, "rate": 0.03, "ci95": [0.006, 0.085]}
    fmt_rate(r)           # "3/100 = 3.0% [0.6, 8.5]"
"""

from __future__ import annotations

from tts_bench.verdicts.stats import clopper_pearson


def rate(count: int, n: int) -> dict:
    lo, hi = clopper_pearson(count, n)
    return {"count": count, "of": n, "rate": count / n, "ci95": [lo, hi]}


def fmt_rate(r: dict, *, counts: bool = True) -> str:
    share = f"{100 * r['rate']:.1f}% [{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]"
    return f"{r['count']}/{r['of']} = {share}" if counts else share
