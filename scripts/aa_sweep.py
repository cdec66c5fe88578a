"""A/A sweep in duration mode: how often does `tts-bench ab` read faster/slower when nothing changed?

Runs N A/As (`tts_bench.ab.run_session`, both arms the same config) on the synthetic backend in
duration mode (short windows: ramp, window, drain, a warm phase per arm) and counts the false
verdicts on audio RTF and TTFP (the verdicts the A/B reports) and on the per-block window
throughput (`tts_bench.load.windows.phase_throughputs` through `tts_bench.verdicts.stats.compare`, higher is
better). The verdicts are 95 % ones, so about 5 % false per metric is the design rate; each
count comes with its exact (Clopper-Pearson) interval.

    PYTHONPATH=. python scripts/aa_sweep.py                       # 100 A/As, about 6 minutes on 2 cores
    PYTHONPATH=. python scripts/aa_sweep.py --runs 20 --duration 0.5 --repeats 2 --out results/runs/aa

Writes `<out>/<name>.json` and `.md` (default results/cpu/aa_sweep_duration); the last stdout line is
one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tts_bench.ab import AbRequest, run_session  # noqa: E402
from tts_bench.rundir.atomic_json import write_json_atomic  # noqa: E402
from tts_bench.verdicts.stats import clopper_pearson, compare  # noqa: E402
from tts_bench.load.windows import phase_throughputs  # noqa: E402

# One 0.1 s chunk per word, 4 ms per chunk (tests/unit/test_ab.py's synthetic case).
SYNTH = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
         "synthetic.first_chunk_delay_s=0.004", "synthetic.chunk_delay_s=0.004"]


def one_aa(args, seed: int, root: Path) -> dict:
    sets = [*SYNTH, f"bench.duration_s={args.duration}", f"bench.window_s={args.window}",
            f"bench.ramp_s={args.ramp}", f"bench.seed={seed}"]
    req = AbRequest(tiers=args.tier, repeats=args.repeats, num_prompts=args.prompts, sets=sets, result_dir=root,
                    request_rate=args.request_rate)
    session = run_session(req)
    tier = session.result.to_dict()["tiers"][0]
    thr = phase_throughputs(session.run_dir)[args.tier]
    base, test = session.result.arm_names
    t = compare([np.array([v]) for v in thr[base]], [np.array([v]) for v in thr[test]], lower_is_better=False)
    stable = [s for arm in session.measurement["tiers"][args.tier].values() for s in arm["stable"]]
    return {
        "seed": seed, "valid": session.result.valid,
        "rtf": tier["verdict"], "rtf_ci95_pct": tier["ci95_pct"],
        "ttfp": (tier["ttfp"] or {}).get("verdict"),
        "throughput": t.verdict, "throughput_ci95_pct": list(t.ci95_pct) if t.ci95_pct else None,
        "stable_phases": sum(s is True for s in stable), "phases": len(stable),
    }


def _rate(runs: list[dict], key: str) -> dict:
    false = sum(r[key] in ("faster", "slower") for r in runs)
    lo, hi = clopper_pearson(false, len(runs))
    return {"false": false, "runs": len(runs), "rate_pct": 100.0 * false / len(runs),
            "ci95_pct": [100.0 * lo, 100.0 * hi]}


def _half_width(runs: list[dict], key: str) -> float | None:
    widths = [(ci[1] - ci[0]) / 2 for ci in (r[key] for r in runs) if ci]
    return float(np.median(widths)) if widths else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--tier", default="4x1")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="prompt set size (it cycles)")
    ap.add_argument("--duration", type=float, default=0.3, help="window seconds per phase")
    ap.add_argument("--window", type=float, default=0.1, help="sub-window seconds (stability)")
    ap.add_argument("--ramp", type=float, default=0.05)
    ap.add_argument("--request-rate", type=float, default=None, help="open loop (requests/s)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "cpu")
    ap.add_argument("--name", default="aa_sweep_duration", help="file stem of the .json and .md")
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_aa(args, seed, Path(tmp)) for seed in range(args.runs)]
    summary = {
        "what": "A/A sweep, synthetic backend, duration mode", "tier": args.tier, "repeats": args.repeats,
        "duration_s": args.duration, "window_s": args.window, "ramp_s": args.ramp,
        "request_rate": args.request_rate, "elapsed_s": round(time.time() - t0, 1),
        "invalid_runs": sum(not r["valid"] for r in runs),
        "false_verdicts": {k: _rate(runs, k) for k in ("rtf", "ttfp", "throughput")},
        "median_half_width_pct": {"rtf": _half_width(runs, "rtf_ci95_pct"),
                                  "throughput": _half_width(runs, "throughput_ci95_pct")},
        "stable_phases": f"{sum(r['stable_phases'] for r in runs)}/{sum(r['phases'] for r in runs)}",
    }
    doc = {**summary, "runs": runs}
    write_json_atomic(args.out / f"{args.name}.json", doc)
    (args.out / f"{args.name}.md").write_text(to_markdown(doc, args.name))
    print(json.dumps(summary))


def to_markdown(doc: dict, name: str) -> str:
    """The sweep's table, with the command line that made it (`name`: the files' stem)."""
    rate = doc["request_rate"]
    lines = [f"# {doc['what']}", "",
             f"`PYTHONPATH=. python scripts/aa_sweep.py --runs {len(doc['runs'])} --tier {doc['tier']} "
             f"--repeats {doc['repeats']} --duration {doc['duration_s']:g} --window {doc['window_s']:g} "
             f"--ramp {doc['ramp_s']:g}" + (f" --request-rate {rate:g} --name {name}" if rate else "") + "`"
             + f" ({doc['elapsed_s']:.0f} s; {doc['invalid_runs']} invalid runs; stable phases "
             f"{doc['stable_phases']})", "",
             "| metric | false verdicts | rate | 95% CI | median CI half-width |", "| --- | --- | --- | --- | --- |"]
    for key, r in doc["false_verdicts"].items():
        hw = doc["median_half_width_pct"].get(key)
        lines.append(f"| {key} | {r['false']}/{r['runs']} | {r['rate_pct']:.1f}% | "
                     f"[{r['ci95_pct'][0]:.1f}%, {r['ci95_pct'][1]:.1f}%] | {'n/a' if hw is None else f'{hw:.2f}%'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
