"""False-verdict rates of real A/As on the synthetic backend, before and after the verdict rules.

Each A/A is a `tts-bench ab` run (`tts_bench.ab.run_ab`) of one synthetic config against itself
(3 ms per chunk, as the test suites use: first-chunk times land on the event loop's 1 ms timer
steps), tiers 2x1, 4x2 and 8x4, K blocks. From the same records:

- after: the run's own verdicts (metric resolution, Holm over the run's family);
- before: the comparisons recomputed the way they were made before those rules
  (`compare(..., check_resolution=False)`, no Holm).

A one-block run has no interval without a calibration (`unresolved (1 repeat)` before and after);
the calibrated one-block rule is measured by `scripts/aa_false_verdicts.py`.

    PYTHONPATH=. python scripts/aa_synthetic.py --runs 100 --repeats 2,3

Writes `<out>/aa_false_verdicts_synthetic.json` and `.md` (default results/cpu/); the last
stdout line is one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tts_bench.ab import run_ab  # noqa: E402
from tts_bench.config import config_to_dict, load_config, parse_tiers  # noqa: E402
from tts_bench.rundir.records import read_records  # noqa: E402
from tts_bench.rundir.provenance import load_avg  # noqa: E402
from tts_bench.rundir.results import RunDir  # noqa: E402
from tts_bench.verdicts.stats import compare  # noqa: E402
from scripts._aa import fmt_rate, rate  # noqa: E402
from tts_bench.rundir.atomic_json import write_json_atomic  # noqa: E402

SYNTH = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
         "synthetic.first_chunk_delay_s=0.003", "synthetic.chunk_delay_s=0.003", "bench.warmup=1"]
TIERS = "2x1,4x2,8x4"
METRICS = {"audio_rtf": "rtf", "audio_ttfp_ms": "ttfp", "audio_throughput": "throughput"}
CALLED = ("faster", "slower")


def by_repeat(records, metric: str) -> dict[int, list[float]]:
    """`metric` of the successful requests, per repeat (a block of the comparison)."""
    groups: dict[int, list[float]] = {}
    for r in records:
        if r.ok:
            groups.setdefault(r.repeat, []).append(getattr(r, metric))
    return groups


def before_verdicts(records, tier: str, min_effect_pct: float) -> dict[str, str | None]:
    """The tier's verdicts as computed before the resolution check and Holm."""
    out = {}
    per_arm = {a: [r for r in records if r.tier == tier and r.arm == a and not r.warmup] for a in ("base", "test")}
    for metric in ("audio_rtf", "audio_ttfp_ms"):
        b, t = by_repeat(per_arm["base"], metric), by_repeat(per_arm["test"], metric)
        keys = sorted(set(b) | set(t))
        out[metric] = compare([b.get(k, []) for k in keys], [t.get(k, []) for k in keys],
                              min_effect_pct=min_effect_pct, check_resolution=False).verdict
    return out


def one_aa(blocks: int, num_prompts: int, tmp: Path) -> dict[str, dict[str, bool]]:
    cfg = load_config(None, SYNTH)
    arms = {"base": cfg, "test": cfg}
    run = RunDir.create(tmp, "ab", command_line=["aa_synthetic"], configs={n: config_to_dict(c) for n, c in arms.items()},
                        extra={"ab": {"tiers": TIERS.split(","), "repeats": blocks, "num_prompts": num_prompts}})
    result = run_ab(arms, parse_tiers(TIERS), repeats=blocks, num_prompts=num_prompts, run_dir=run)
    records = read_records(run)
    after = {m: any(getattr(t, attr) is not None and getattr(t, attr).verdict in CALLED for t in result.tiers)
             for m, attr in METRICS.items()}
    before = {m: False for m in METRICS}
    for t in result.tiers:
        for m, v in before_verdicts(records, t.tier, cfg.bench.min_effect_pct).items():
            before[m] |= v in CALLED
        # Throughput was not a verdict metric before; its verdict is computed the same way (one
        # figure per block has nothing to snap), so "before" is the pre-Holm verdict.
        before["audio_throughput"] |= t.throughput is not None and (
            t.throughput.verdict in CALLED or t.throughput.holm_demoted)
    return {w: {**d, "any": any(d.values())} for w, d in (("before", before), ("after", after))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--repeats", default="2,3")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "results/cpu")
    args = ap.parse_args()
    t0, loads, cells = time.perf_counter(), [], []
    for k in (int(x) for x in args.repeats.split(",")):
        counts = {w: dict.fromkeys((*METRICS, "any"), 0) for w in ("before", "after")}
        for i in range(args.runs):
            loads.append((load_avg() or [None])[0])
            with tempfile.TemporaryDirectory(prefix="aa-") as tmp:
                res = one_aa(k, args.num_prompts, Path(tmp))
            for w in counts:
                for m in counts[w]:
                    counts[w][m] += res[w][m]
            print(f"K={k} A/A {i + 1}/{args.runs}: {res}", file=sys.stderr)
        cells.append({"repeats": k, "runs": args.runs,
                      **{w: {m: rate(c, args.runs) for m, c in counts[w].items()} for w in counts}})
    wall = time.perf_counter() - t0
    known = [x for x in loads if x is not None]
    doc = {"script": "scripts/aa_synthetic.py", "sets": SYNTH, "tiers": TIERS, "num_prompts": args.num_prompts,
           "min_effect_pct": load_config(None, SYNTH).bench.min_effect_pct, "cells": cells, "wall_s": round(wall, 1),
           "load_1min": {"min": min(known, default=None), "max": max(known, default=None)}}
    write_json_atomic(args.out / "aa_false_verdicts_synthetic.json", doc)
    md = to_markdown(doc)
    (args.out / "aa_false_verdicts_synthetic.md").write_text(md)
    sys.stdout.write(md + "\n")
    print(json.dumps({f"K{c['repeats']}": {w: round(c[w]["any"]["rate"], 4) for w in ("before", "after")}
                      for c in cells}))


def to_markdown(doc: dict) -> str:
    lines = [f"**Synthetic-backend A/As, false verdicts before / after the verdict rules** (tiers {doc['tiers']}, "
             f"{doc['num_prompts']} prompts, 3 ms chunks, min effect {doc['min_effect_pct']:g}%, "
             f"`scripts/aa_synthetic.py`, {doc['wall_s']:.0f} s, 1-min load {doc['load_1min']['min']}-"
             f"{doc['load_1min']['max']} on 2 shared cores). A row counts A/As with a faster/slower verdict in any "
             "tier; Clopper-Pearson 95% in brackets.", "",
             "| repeats | | RTF | TTFP | throughput | any verdict |", "| --- | --- | --- | --- | --- | --- |"]
    for c in doc["cells"]:
        for w in ("before", "after"):
            r = c[w]
            lines.append(f"| {c['repeats']} | {w} | {fmt_rate(r['audio_rtf'])} | {fmt_rate(r['audio_ttfp_ms'])} | "
                         f"{fmt_rate(r['audio_throughput'])} | {fmt_rate(r['any'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
