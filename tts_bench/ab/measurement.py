"""What an A/B measured, phase by phase: the mode, the windows, throughput and stability.

The A/B result (`tts_bench.ab.summary`) compares requests; this module reads the run's phase
records (phases.jsonl, `tts_bench.load.windows`) beside it:
- `with_phase_validity`: a phase that measured nothing honest (its C never filled, no request
  in its window) makes its tier and the run invalid, with the phase's reason;
- `measurement_doc`: the JSON under result `measurement`: `mode` (count | duration), the
  window settings, open-loop rate, and per tier and arm the window throughput of each block
  (audio s per wall s), each block's stability, and RTF p50 / p90 / p99;
- `mode_line` and `window_table`: the same as text under the A/B tables.

    doc = measurement_doc(run, result, bench, open_loop=None)
    doc["mode"], doc["tiers"]["2x1"]["base"]["throughput"]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd

from tts_bench.load.windows import measured_phases, phase_throughputs, read_phases, warmup_phase_on


def with_phase_validity(result: Any, run_dir: Any, *, blocks: Any = None) -> Any:
    """`result` (an AbResult) with each invalid phase's reason on its tier and on the run;
    `blocks`: only the phases of these (tier, repeat) blocks (`tts-bench ab --report`)."""
    reasons: dict[str, list[str]] = {}
    for (arm, tier, repeat), p in sorted(measured_phases(run_dir, blocks=blocks).items()):
        if p.get("invalid_reason"):
            reasons.setdefault(tier, []).append(f"{tier} {arm} r{repeat}: {p['invalid_reason']}")
    if not reasons:
        return result
    tiers = [replace(t, invalid_reasons=(*t.invalid_reasons, *reasons.get(t.tier, ()))) for t in result.tiers]
    extra = tuple(r for t in result.tiers for r in reasons.get(t.tier, ()))
    return replace(result, tiers=tiers, invalid_reasons=(*result.invalid_reasons, *extra))


def measurement_doc(run_dir: Any, result: Any, bench: Any, *, open_loop: Any = None,
                    blocks: Any = None) -> dict[str, Any]:
    """The JSON of what was measured (see the module docstring); `blocks` as in `with_phase_validity`."""
    phases = measured_phases(run_dir, blocks=blocks)
    thr = phase_throughputs(run_dir, blocks=blocks)
    tiers: dict[str, Any] = {}
    for t in result.tiers:
        per_arm = {}
        for arm, agg in t.arms.items():
            mine = [p for (a, tier, _), p in sorted(phases.items()) if a == arm and tier == t.tier]
            per_arm[arm] = {
                "throughput": thr.get(t.tier, {}).get(arm, []),
                "stable": [p.get("stable") for p in mine],
                "requests_in_window": [p.get("requests_in_window") for p in mine],
                "window_s": [p.get("window_s") for p in mine],
                "rtf_p50": agg.median_audio_rtf, "rtf_p90": agg.p90_audio_rtf, "rtf_p99": agg.p99_audio_rtf,
            }
        tiers[t.tier] = per_arm
    duration = bench.duration_s is not None
    return {
        "mode": "duration" if duration else "count",
        "duration_s": bench.duration_s, "ramp_s": bench.ramp_s if duration else None,
        "window_s": bench.window_s if duration else None,
        "stability_pct": bench.stability_pct if duration else None,
        "until_stable": bench.until_stable if duration else None,
        "max_duration_s": bench.max_duration_s if duration else None,
        "warmup_phase": warmup_phase_on(bench),
        "warm_phases": sum(1 for p in read_phases(run_dir) if p.get("warm")),
        "open_loop": open_loop.to_dict() if open_loop is not None else None,
        "unstable_phases": [f"{tier} {arm} r{rep}" for (arm, tier, rep), p in sorted(phases.items())
                            if p.get("stable") is False],
        "tiers": tiers,
    }


def mode_line(doc: dict[str, Any]) -> str:
    """One line: which mode ran, and its window figures."""
    loop = doc.get("open_loop")
    load = (f"open loop {loop['request_rate']:g} req/s, burstiness {loop['burstiness']:g}, C caps in flight"
            if loop else "closed loop, C in flight")
    warm = "a discarded warm phase per arm and tier" if doc["warmup_phase"] else "no warm phase"
    if doc["mode"] == "count":
        return f"mode: count (fixed requests per phase, measured until they drain; {load}; {warm})"
    until = f", until stable up to {doc['max_duration_s'] or 3 * doc['duration_s']:g} s" if doc["until_stable"] else ""
    unstable = doc["unstable_phases"]
    return (f"mode: duration ({doc['duration_s']:g} s window after a ramp of >= {doc['ramp_s']:g} s, "
            f"{doc['window_s']:g} s sub-windows, stable = last three within {doc['stability_pct']:g}%{until}; "
            f"{load}; {warm})" + (f"; UNSTABLE: {', '.join(unstable)}" if unstable else ""))


def _blocks(values: list, digits: int = 2) -> str:
    return " ".join("n/a" if v is None else f"{v:.{digits}f}" for v in values) or "n/a"


def _stable_text(flags: list) -> str:
    return " ".join({True: "yes", False: "NO", None: "-"}[f] for f in flags) or "-"


def window_table(doc: dict[str, Any]) -> pd.DataFrame:
    """Per tier and arm: throughput of each block, stability of each block, RTF p50/p90/p99."""
    rows = []
    for tier, arms in doc["tiers"].items():
        for arm, d in arms.items():
            rows.append({
                "Tier": tier, "arm": arm, "mode": doc["mode"],
                "throughput per block (audio s/s)": _blocks(d["throughput"]),
                "stable": _stable_text(d["stable"]),
                "RTF p50 / p90 / p99": " / ".join("n/a" if v is None else f"{v:.4f}"
                                                  for v in (d["rtf_p50"], d["rtf_p90"], d["rtf_p99"])),
            })
    return pd.DataFrame(rows)
