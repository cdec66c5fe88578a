"""False-verdict rates of A/A runs, before and after the verdict rules, at 1, 2 and 3 repeats.

An A/A compares a config with itself: every faster/slower verdict is false, and a run makes
several (tiers x RTF / TTFP / throughput). Each simulated A/A has 3 tiers and K blocks; in block k
each arm runs one phase of n requests, second arm of the block per `phase_order` (A B, B A):

- RTF per request: log = block shift (both arms) + phase shift + request noise, with a position
  effect (a block's first phase slower, as on the H200) and rare load bursts;
- TTFP per request: a fixed delay plus an exponential queue wait, rounded up to whole clock ticks
  (1 ms, the event loop's timer granularity on Linux): values on a few fixed steps, as on the
  synthetic backend;
- throughput per phase: audio seconds / wall seconds, moved by the phase shift (steadier than RTF).

Every comparison goes through `tts_bench.verdicts.stats.compare`, the code `tts-bench ab` uses, twice:

- before: the rules as they were (no metric-resolution check, no Holm, a one-block run uses a
  calibration whatever the machine is doing);
- after: `compare` with its resolution check, Holm over the run's family (`tts_bench.verdicts.holm`), and a
  one-block run uses the calibration only under its recorded conditions and <= 5 % one-block rate
  (`tts_bench.verdicts.calibration`).

For one repeat a calibration is simulated as `tts-bench calibrate` makes it (200 A/As x 2 blocks
on a quiet machine, load scale 1); the A/As then run on a busier machine (`--load-scale`, default
2: every shift and noise doubled), which the calibration's recorded load refuses.

    PYTHONPATH=. python scripts/aa_false_verdicts.py                    # ~1 min on 2 cores
    PYTHONPATH=. python scripts/aa_false_verdicts.py --runs 2000 --seed 1 --out /tmp/aa

Writes `<out>/aa_false_verdicts.json` and `.md` (default results/cpu/); the last stdout line is one
JSON summary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tts_bench.verdicts.calibration import (  # noqa: E402
    MAX_ONE_BLOCK_FALSE_RATE, MIN_ONE_BLOCK_JUDGED, CalibrationConditions, RunConditions,
)
from tts_bench.gate.calibrate import loo_false_verdicts  # noqa: E402
from tts_bench.verdicts.holm import apply_holm  # noqa: E402
from tts_bench.verdicts.stats import CalibratedSpread, compare  # noqa: E402
from scripts._aa import fmt_rate, rate  # noqa: E402
from tts_bench.rundir.atomic_json import write_json_atomic  # noqa: E402

METRICS = ("audio_rtf", "audio_ttfp_ms", "audio_throughput")
CALLED = ("faster", "slower")


@dataclass(frozen=True)
class Tier:
    name: str
    n: int  # requests per phase
    sd_request: float  # log SD of one request's RTF
    sd_phase: float  # log SD of a phase's own shift
    sd_block: float = 0.05  # log SD shared by both arms of a block (cancels)
    position: float = 0.04  # log shift of a block's first phase (slower)
    p_burst: float = 0.05
    burst: float = 0.3
    ttfp_ms: float = 3.0  # fixed first-chunk delay
    queue_ms: float = 0.4  # mean exponential queue wait
    tick_ms: float = 1.0  # clock granularity
    thr_scale: float = 0.3  # throughput moves by this fraction of the phase shift


TIERS = (Tier("2x1", n=4, sd_request=0.08, sd_phase=0.02),
         Tier("4x2", n=8, sd_request=0.10, sd_phase=0.03),
         Tier("8x4", n=16, sd_request=0.12, sd_phase=0.03, position=0.02, p_burst=0.0))  # a quiet tier


def phase(t: Tier, shift: float, load: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One arm's phase: per-request RTF and TTFP, and its one throughput figure."""
    rtf = np.exp(math.log(0.5) + shift + rng.normal(0.0, t.sd_request * load, t.n))
    wait = rng.exponential(t.queue_ms * load, t.n) * math.exp(shift)
    ttfp = np.ceil((t.ttfp_ms + wait) / t.tick_ms) * t.tick_ms
    thr = np.array([40.0 * math.exp(-t.thr_scale * shift + rng.normal(0.0, 0.002 * load))])
    return {"audio_rtf": rtf, "audio_ttfp_ms": ttfp, "audio_throughput": thr}


def simulate(t: Tier, blocks: int, load: float, rng: np.random.Generator) -> dict[str, tuple[list, list]]:
    """{metric: (base blocks, test blocks)} of one A/A at one tier."""
    out: dict[str, tuple[list, list]] = {m: ([], []) for m in METRICS}
    for k in range(blocks):
        shared = rng.normal(0.0, t.sd_block * load)
        first = "base" if k % 2 == 0 else "test"  # phase_order: A B, then B A
        for i, arm in enumerate(("base", "test")):
            shift = shared + rng.normal(0.0, t.sd_phase * load) + (t.position if arm == first else 0.0)
            if rng.random() < t.p_burst * load:
                shift += t.burst
            values = phase(t, shift, load, rng)
            for m in METRICS:
                out[m][i].append(values[m])
    return out


def calibrate(t: Tier, rng: np.random.Generator, *, runs: int = 200, load: float = 1.0,
              min_effect_pct: float = 2.0) -> dict[str, tuple[CalibratedSpread, int, int]]:
    """What `tts-bench calibrate` records per metric: block SD (sqrt mean d^2), df, and the
    leave-one-out one-block false verdicts (count, judged)."""
    d: dict[str, list[float]] = {m: [] for m in METRICS}
    for _ in range(runs):
        sim = simulate(t, 2, load, rng)
        for m in METRICS:
            for b, x in zip(*sim[m]):
                d[m].append(math.log(x.mean() / b.mean()))
    out = {}
    for m, values in d.items():
        arr = np.array(values)
        sd = float(np.sqrt((arr**2).mean()))
        false = loo_false_verdicts(arr, min_effect_pct) or 0
        out[m] = (CalibratedSpread(sd, sd, arr.size, "simulated"), false, int(arr.size))
    return out


def one_aa(blocks: int, load: float, cal, rng: np.random.Generator, *, quiet_max: float,
           min_effect_pct: float = 2.0) -> dict[str, dict[str, bool]]:
    """{before|after: {metric: any false verdict over the tiers, "any": ...}} for one A/A."""
    run_load = quiet_max * load  # the 1-min load the run starts under
    refused = CalibrationConditions(quiet_max).mismatch(RunConditions(run_load, None, None)) is not None
    before, after = {}, {}
    for t in TIERS:
        sim = simulate(t, blocks, load, rng)
        for m in METRICS:
            spread, false, judged = cal[t.name][m]
            lower = m != "audio_throughput"
            before[(t.name, m)] = compare(*sim[m], min_effect_pct=min_effect_pct, lower_is_better=lower,
                                          calibrated=spread, check_resolution=False)
            usable = (not refused and judged >= MIN_ONE_BLOCK_JUDGED
                      and false <= MAX_ONE_BLOCK_FALSE_RATE * judged)
            after[(t.name, m)] = compare(*sim[m], min_effect_pct=min_effect_pct, lower_is_better=lower,
                                         calibrated=spread if usable else None)
    after = apply_holm(after)
    out = {}
    for name, cmps in (("before", before), ("after", after)):
        called = {m: any(c.verdict in CALLED for (_, mm), c in cmps.items() if mm == m) for m in METRICS}
        called["any"] = any(called.values())
        out[name] = called
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000, help="simulated A/As per repeat count")
    ap.add_argument("--repeats", default="1,2,3")
    ap.add_argument("--load-scale", type=float, default=2.0, help="noise of the A/As vs the calibration's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results/cpu")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    cal = {t.name: calibrate(t, rng) for t in TIERS}
    quiet_max = 1.0  # the calibration's highest 1-min load
    cells = []
    for load_scale in (args.load_scale, 1.0):
        for k in (int(x) for x in args.repeats.split(",")):
            if load_scale == 1.0 and k != 1:
                continue  # the calibration's own load only matters for one block
            counts = {w: dict.fromkeys((*METRICS, "any"), 0) for w in ("before", "after")}
            for _ in range(args.runs):
                res = one_aa(k, load_scale, cal, rng, quiet_max=quiet_max)
                for w in counts:
                    for m in counts[w]:
                        counts[w][m] += res[w][m]
            cells.append({"repeats": k, "load_scale": load_scale, "runs": args.runs,
                          **{w: {m: rate(c, args.runs) for m, c in counts[w].items()} for w in counts}})
    wall = time.perf_counter() - t0
    doc = {"script": "scripts/aa_false_verdicts.py", "seed": args.seed, "runs_per_cell": args.runs,
           "tiers": [asdict(t) for t in TIERS], "min_effect_pct": 2.0,
           "calibration": {t: {m: {"sd_pct": 100 * math.expm1(s.sd_mean), "df": s.df,
                                   "one_block_false": [f, j]} for m, (s, f, j) in c.items()}
                           for t, c in cal.items()},
           "cells": cells, "wall_s": round(wall, 1)}
    write_json_atomic(args.out / "aa_false_verdicts.json", doc)
    md = to_markdown(doc)
    (args.out / "aa_false_verdicts.md").write_text(md)
    sys.stdout.write(md + "\n")
    print(json.dumps({f"K{c['repeats']}_load{c['load_scale']:g}": {w: round(c[w]["any"]["rate"], 4)
                                                                   for w in ("before", "after")} for c in cells}))


def to_markdown(doc: dict) -> str:
    lines = [f"**A/A false verdicts, before / after the verdict rules** ({doc['runs_per_cell']} simulated A/As "
             f"per row, 3 tiers x RTF / TTFP / throughput each, min effect {doc['min_effect_pct']:g}%, seed "
             f"{doc['seed']}, `scripts/aa_false_verdicts.py`, {doc['wall_s']:.0f} s). A row counts A/As with a "
             "faster/slower verdict in any tier; Clopper-Pearson 95% in brackets.", "",
             "| repeats | load vs calibration | | RTF | TTFP | throughput | any verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in doc["cells"]:
        for w in ("before", "after"):
            r = c[w]
            cells = " | ".join(fmt_rate(r[m], counts=False) for m in ("audio_rtf", "audio_ttfp_ms", "audio_throughput", "any"))
            lines.append(f"| {c['repeats']} | x{c['load_scale']:g} | {w} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
