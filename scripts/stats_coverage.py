"""Coverage of the A/B interval by simulation: A/A and known-effect runs with run-level shifts.

Each simulated A/B has K blocks; in block k each arm runs one phase of n requests. Log RTF of a
request = block shift (shared by both arms of the block: cancels in the pair)
        + phase shift (each arm's own run: what a fresh backend on a busy machine adds)
        + request noise
        + ln(1 + effect) for the test arm,
optionally with load bursts (a phase slowed by `burst` with probability `p_burst`: heavy tails)
and a position effect (the second phase of a block runs `position` faster: counterbalancing
cancels it at even K, and it widens the interval). Each run goes through `tts_bench.verdicts.stats.compare`,
the code `tts-bench ab` uses, and we count how often the 95% interval covers the true effect, how
often an A/A reads faster/slower, how often a known effect is called, and the mean MDE.

    PYTHONPATH=. python scripts/stats_coverage.py                 # about a minute on 2 cores
    PYTHONPATH=. python scripts/stats_coverage.py --runs 400 --out /tmp/cov

Writes `<out>/coverage.json` and `coverage.md` (default results/stats/); the last stdout line is
one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tts_bench.rundir.atomic_json import write_json_atomic  # noqa: E402
from tts_bench.verdicts.stats import clopper_pearson, compare  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    name: str
    n: int  # requests per phase
    sd_request: float  # log SD of one request
    sd_phase: float  # log SD of a phase's own shift (not shared with the other arm)
    sd_block: float = 0.05  # log SD shared by both arms of a block (cancels)
    p_burst: float = 0.0
    burst: float = 0.0  # log shift of a burst
    position: float = 0.0  # log shift of the second phase in a block


SCENARIOS = (
    # About the synthetic case on a quiet 2-core CPU: tiny jitter everywhere.
    Scenario("synthetic-like", n=32, sd_request=0.02, sd_phase=0.003),
    # About tiny-embedded on a shared 2-core CPU: noisy requests, whole runs shifting.
    Scenario("tiny-like", n=12, sd_request=0.25, sd_phase=0.10),
    # The setting (2x1, 8 prompts) with load bursts: heavy-tailed phase shifts.
    Scenario("bursty", n=8, sd_request=0.20, sd_phase=0.05, p_burst=0.1, burst=0.4),
    # An H200-like position effect (the second arm of a block ~12% faster, D-AB-1).
    Scenario("position", n=16, sd_request=0.10, sd_phase=0.03, position=-0.12),
)


def simulate(sc: Scenario, *, blocks: int, effect_pct: float, rng: np.random.Generator):
    """(base blocks, test blocks) of one simulated A/B: lists of [n] RTF arrays."""
    effect = np.log1p(effect_pct / 100.0)
    base, test = [], []
    for k in range(blocks):
        shared = rng.normal(0.0, sc.sd_block)
        first_is_base = k % 2 == 0  # phase_order: A B, then B A
        for arm, out in (("base", base), ("test", test)):
            second = (arm == "test") == first_is_base
            shift = shared + rng.normal(0.0, sc.sd_phase) + (sc.position if second else 0.0)
            if rng.random() < sc.p_burst:
                shift += sc.burst
            noise = rng.normal(0.0, sc.sd_request, sc.n)
            out.append(np.exp(np.log(0.5) + shift + noise + (effect if arm == "test" else 0.0)))
    return base, test


@dataclass(frozen=True)
class Cell:
    scenario: str
    blocks: int
    effect_pct: float
    runs: int
    coverage: float
    coverage_ci95: tuple[float, float]
    called: int  # faster/slower verdicts (false ones when effect_pct == 0)
    called_rate: float
    called_ci95: tuple[float, float]
    mean_mde_pct: float
    mean_half_width_pct: float


def run_cell(sc: Scenario, *, blocks: int, effect_pct: float, runs: int, seed: int,
             min_effect_pct: float = 2.0) -> Cell:
    rng = np.random.default_rng(seed)
    covered = called = 0
    mdes, halves = [], []
    for _ in range(runs):
        cmp = compare(*simulate(sc, blocks=blocks, effect_pct=effect_pct, rng=rng),
                      min_effect_pct=min_effect_pct)
        lo, hi = cmp.ci95_pct
        covered += lo <= effect_pct <= hi
        called += cmp.verdict in ("faster", "slower")
        mdes.append(cmp.mde_pct)
        halves.append(cmp.half_width_pct)
    return Cell(sc.name, blocks, effect_pct, runs, covered / runs, clopper_pearson(covered, runs),
                called, called / runs, clopper_pearson(called, runs), float(np.mean(mdes)),
                float(np.mean(halves)))


def to_markdown(cells: list[Cell], scenarios: tuple[Scenario, ...], runs: int, wall_s: float) -> str:
    lines = [f"**Coverage of the A/B interval (t, K-1 df over paired blocks)**: {runs} simulated "
             f"runs per cell, 95% intervals, min effect 2%, `scripts/stats_coverage.py` ({wall_s:.0f} s)",
             "", "| scenario | n | request SD | phase SD | bursts | position |", "| --- | --- | --- | --- | --- | --- |"]
    for s in scenarios:
        bursts = f"{s.p_burst:.0%} x {100 * np.expm1(s.burst):+.0f}%" if s.p_burst else "-"
        pos = f"{100 * np.expm1(s.position):+.0f}%" if s.position else "-"
        lines.append(f"| {s.name} | {s.n} | {s.sd_request:.1%} | {s.sd_phase:.1%} | {bursts} | {pos} |")
    lines += ["", "| scenario | K | effect | coverage [95% CI] | faster/slower verdicts [95% CI] | "
                  "mean half-width | mean MDE |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        lines.append(
            f"| {c.scenario} | {c.blocks} | {c.effect_pct:+g}% | {c.coverage:.1%} "
            f"[{c.coverage_ci95[0]:.1%}, {c.coverage_ci95[1]:.1%}] | {c.called}/{c.runs} = "
            f"{c.called_rate:.1%} [{c.called_ci95[0]:.1%}, {c.called_ci95[1]:.1%}] | "
            f"{c.mean_half_width_pct:.1f}% | {c.mean_mde_pct:.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2000, help="simulated A/Bs per cell")
    ap.add_argument("--blocks", default="2,3,5", help="comma-separated K values")
    ap.add_argument("--effects", default="0,10", help="true effects in percent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results/stats")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cells = []
    for i, sc in enumerate(SCENARIOS):
        ks = [int(k) for k in args.blocks.split(",")]
        if sc.position:  # counterbalancing cancels a position effect only over whole pairs
            ks = sorted({k + k % 2 for k in ks})
        for k in ks:
            for j, eff in enumerate(float(e) for e in args.effects.split(",")):
                cells.append(run_cell(sc, blocks=k, effect_pct=eff, runs=args.runs,
                                      seed=args.seed + 1000 * i + 10 * k + j))
    wall = time.perf_counter() - t0
    doc = {"runs_per_cell": args.runs, "seed": args.seed, "scenarios": [asdict(s) for s in SCENARIOS],
           "cells": [asdict(c) for c in cells], "wall_s": round(wall, 1)}
    write_json_atomic(args.out / "coverage.json", doc)
    md = to_markdown(cells, SCENARIOS, args.runs, wall)
    (args.out / "coverage.md").write_text(md)
    sys.stdout.write(md + "\n")
    print(json.dumps({"min_coverage": min(c.coverage for c in cells),
                      "max_aa_false_rate": max(c.called_rate for c in cells if c.effect_pct == 0)}))


if __name__ == "__main__":
    main()
