"""Harness overhead: how much RTF the load generator adds on top of what the backend takes.

The synthetic backend releases chunks at known absolute deadlines, so each request has an
exact delay-implied RTF. Running it at concurrency C through the phase driver `tts-bench ab` uses
(`tts_bench.load.phases.run_fresh_phase`: a fresh backend, warmup, measured requests, each record
appended to a run directory, a throwaway one here), the measured RTF minus the implied RTF is
everything the harness and the event loop add: task scheduling, arrival stamping, PCM hashing,
record building and writing.

    PYTHONPATH=. python scripts/harness_overhead.py                 # C=32, 256 requests
    PYTHONPATH=. python scripts/harness_overhead.py --concurrency 64 --num-prompts 512

Prints a header card, a small table, and one JSON document as the last stdout line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import sys
import tempfile

import numpy as np

from tts_bench.backends.base import SynthesisRequest
from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.config import BenchConfig, SyntheticConfig, Tier, config_to_dict
from tts_bench.inputs.prompts import load_prompts, select_prompts
from tts_bench.load.phases import run_fresh_phase
from tts_bench.rundir.records import Job, PhaseLabels
from tts_bench.rundir.results import RunDir


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--chunk-seconds", type=float, default=0.5)
    ap.add_argument("--first-chunk-delay-s", type=float, default=0.05)
    ap.add_argument("--chunk-delay-s", type=float, default=0.05)
    ap.add_argument("--seconds-per-word", type=float, default=0.25)
    ap.add_argument("--sample-rate", type=int, default=24000)
    return ap.parse_args()


def measure(args: argparse.Namespace) -> dict:
    params = SyntheticConfig(
        chunk_seconds=args.chunk_seconds, first_chunk_delay_s=args.first_chunk_delay_s,
        chunk_delay_s=args.chunk_delay_s, seconds_per_word=args.seconds_per_word,
        sample_rate=args.sample_rate,
    )
    cfg = BenchConfig(backend="synthetic", synthetic=params)
    cfg = dataclasses.replace(cfg, bench=dataclasses.replace(cfg.bench, timeout_s=600.0))
    prompts = select_prompts(load_prompts("builtin:seed-tts-en"), args.num_prompts, shuffle=False)
    jobs = [Job(SynthesisRequest(f"r{i:05d}", p.text), p.utt) for i, p in enumerate(prompts)]
    warm = [Job(SynthesisRequest(f"w{i:03d}", p.text), p.utt, warmup=True)
            for i, p in enumerate(prompts[: args.concurrency])]
    tier = Tier(args.concurrency, 1)
    labels = PhaseLabels("synthetic", tier.label, 0)
    with tempfile.TemporaryDirectory(prefix="harness-overhead-") as tmp:
        run = RunDir.create(tmp, "overhead", command_line=sys.argv, configs={"synthetic": config_to_dict(cfg)})
        with run.finishing():
            result = asyncio.run(run_fresh_phase(cfg, tier, labels, (warm, jobs), run_dir=run))
            run.update(status="complete")
    backend = SyntheticBackend(cfg)  # its delays, to compute each request's implied RTF
    text = {j.request.request_id: j.request.text for j in jobs}
    measured = np.array([r.audio_rtf for r in result.records])
    implied = np.array([backend.implied_rtf(text[r.request_id]) for r in result.records])
    excess_ms = np.array([(r.audio_rtf - backend.implied_rtf(text[r.request_id])) * r.audio_seconds * 1e3
                          for r in result.records])
    return {
        "concurrency": args.concurrency,
        "requests": len(result.records),
        "failed": sum(not r.ok for r in result.records),
        "synthetic": params.__dict__,
        "mean_implied_rtf": float(implied.mean()),
        "mean_measured_rtf": float(measured.mean()),
        "mean_rtf_overhead_pct": float(100 * (measured.mean() / implied.mean() - 1)),
        "median_per_request_overhead_pct": float(np.median(100 * (measured / implied - 1))),
        "p99_per_request_overhead_pct": float(np.percentile(100 * (measured / implied - 1), 99)),
        "mean_excess_ms": float(excess_ms.mean()),
        "p99_excess_ms": float(np.percentile(excess_ms, 99)),
        "wall_s": result.wall_s,
        "python": platform.python_version(),
    }


def main() -> None:
    args = parse_args()
    doc = measure(args)
    print(f"harness overhead | synthetic backend | C={doc['concurrency']} | {doc['requests']} requests "
          f"| python {doc['python']}")
    rows = [("mean implied RTF", f"{doc['mean_implied_rtf']:.5f}"),
            ("mean measured RTF", f"{doc['mean_measured_rtf']:.5f}"),
            ("mean RTF overhead", f"{doc['mean_rtf_overhead_pct']:+.3f}%"),
            ("per-request overhead median / p99", f"{doc['median_per_request_overhead_pct']:+.3f}% / "
                                                   f"{doc['p99_per_request_overhead_pct']:+.3f}%"),
            ("excess per request mean / p99", f"{doc['mean_excess_ms']:.3f} / {doc['p99_excess_ms']:.3f} ms")]
    for name, value in rows:
        print(f"{name:<36} {value:>22}")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
