"""HTTP overhead: audio RTF of one config in-process vs through `tts-bench serve` + the http backend.

Both arms run the same backend config, prompts, seeds and tier through the phase driver
`tts-bench ab` uses (`tts_bench.load.phases.run_fresh_phase`, recording into a throwaway run
directory); they are interleaved per repeat (in-process, http, in-process, http, ...), each on a
fresh backend. The http arm starts `tts-bench serve` as a separate process on 127.0.0.1 (as a real
deployment would be: the server does not share the client's event loop or GIL) and drives it
with the `http` backend (`http.response_format`, `http.stream` as configured, default streaming
PCM). The difference is what HTTP adds: request/response framing, s16 encode/decode, loopback
TCP, and a second event loop between the backend and the client's clock.

    PYTHONPATH=. python scripts/http_overhead.py                                  # synthetic, 8x1
    PYTHONPATH=. python scripts/http_overhead.py --config configs/ab/default.yaml --tier 2x1 \\
        --num-prompts 8 --repeats 2                                               # embedded tiny
    PYTHONPATH=. python scripts/http_overhead.py --set http.response_format=wav --set http.stream=false

Prints a header card, a fixed-width table, and one JSON document as the last stdout line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from tts_bench.backends.base import SynthesisRequest
from tts_bench.config import BenchConfig, Tier, config_to_dict, load_arm, parse_tier
from tts_bench.inputs.prompts import load_prompts, select_prompts
from tts_bench.load.metrics import aggregate
from tts_bench.load.phases import run_fresh_phase
from tts_bench.rundir.records import Job, PhaseLabels, RequestRecord
from tts_bench.rundir.results import RunDir
from tts_bench.verdicts.stats import compare

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SEED = SynthesisRequest("", "").seed  # what `tts-bench serve` uses when no seed is sent
_SERVE = ("import asyncio, logging, sys; from pathlib import Path; logging.basicConfig(level=logging.INFO); "
          "from tts_bench.config import load_arm; "
          "from tts_bench.serve.app import serve_until_signalled; "
          "asyncio.run(serve_until_signalled(load_arm(Path(sys.argv[1]), sys.argv[3:]), "
          "replicas=int(sys.argv[2]), host='127.0.0.1', port=0))")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/ab/synthetic.yaml"),
                    help="bench or A/B config (an A/B config's first arm); relative to the repo root")
    ap.add_argument("--tier", default="8x1")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="override for both arms (http.* keys shape the client)")
    ap.add_argument("--start-timeout-s", type=float, default=300.0)
    return ap.parse_args()


class ServeProcess:
    """`tts-bench serve` of `config` in a child process; `url` once it listens."""

    def __init__(self, config: Path, sets: list[str], replicas: int, timeout_s: float) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(config), str(replicas), *sets],
                                     cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stderr], daemon=True).start()
        self.url, seen, deadline = None, [], time.monotonic() + timeout_s
        while self.url is None and time.monotonic() < deadline and self.proc.poll() is None:
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                continue
            m = re.search(r"listening on (http://\S+)", seen[-1])
            self.url = m.group(1) if m else None
        if self.url is None:
            self.stop()
            raise RuntimeError("serve did not start:\n" + "".join(seen[-30:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def make_jobs(cfg: BenchConfig, n: int, warmup: int) -> tuple[list[Job], list[Job]]:
    # One seed for every request: the http backend sends no per-request seed unless the server
    # takes one (`http.send_seed`), and the server then uses its default; with the same seed in
    # both arms, identical audio across arms is expected (and counted).
    prompts = select_prompts(load_prompts(cfg.prompts.meta), n, shuffle=False)
    req = lambda i, rid, p: SynthesisRequest(rid, p.text, p.prompt_text, p.prompt_wav, seed=DEFAULT_SEED)  # noqa: E731
    warm = [Job(req(i, f"w{i:03d}", p), p.utt, warmup=True) for i, p in enumerate(prompts[:warmup])]
    return warm, [Job(req(i, f"m{i:04d}", p), p.utt) for i, p in enumerate(prompts)]


def run_arm(cfg: BenchConfig, arm: str, tier: Tier, repeat: int, jobs, run: RunDir) -> list[RequestRecord]:
    """One phase of `arm` on a fresh backend: its measured requests."""
    labels = PhaseLabels(arm, tier.label, repeat)
    return asyncio.run(run_fresh_phase(cfg, tier, labels, jobs, run_dir=run)).records


def measure(args: argparse.Namespace) -> dict:
    cfg = load_arm(args.config, args.sets)  # an A/B config: its first (base) arm
    tier = parse_tier(args.tier)
    jobs = make_jobs(cfg, args.num_prompts, cfg.bench.warmup_for(tier.concurrency))
    records: dict[str, list[list[RequestRecord]]] = {"in-process": [], "http": []}
    with tempfile.TemporaryDirectory(prefix="http-overhead-") as tmp:
        run = RunDir.create(tmp, "overhead", command_line=sys.argv, configs={"in-process": config_to_dict(cfg)})
        with run.finishing():
            for repeat in range(args.repeats):
                records["in-process"].append(run_arm(cfg, "in-process", tier, repeat, jobs, run))
                server = ServeProcess(args.config, args.sets, tier.replicas, args.start_timeout_s)
                try:
                    http_cfg = dataclasses.replace(cfg, backend="http",
                                                   http=dataclasses.replace(cfg.http, base_url=server.url))
                    records["http"].append(run_arm(http_cfg, "http", tier, repeat, jobs, run))
                finally:
                    server.stop()
            run.update(status="complete")
    return summarize(cfg, args, tier, records)


def summarize(cfg: BenchConfig, args, tier, records) -> dict:
    aggs = {arm: aggregate([r for rep in reps for r in rep]).to_dict() for arm, reps in records.items()}
    per_rep = {arm: [np.array([r.audio_rtf for r in rep if r.ok]) for rep in reps]
               for arm, reps in records.items()}
    # Repeat k of each arm ran back to back: a block (tts_bench.verdicts.stats).
    cmp = compare(per_rep["in-process"], per_rep["http"], min_effect_pct=cfg.bench.min_effect_pct)
    # Paired by prompt and repeat: the extra seconds HTTP adds to a request's last audio byte.
    excess_ms = [(h.audio_rtf - p.audio_rtf) * p.audio_seconds * 1e3
                 for ps, hs in zip(records["in-process"], records["http"])
                 for p, h in zip(sorted(ps, key=lambda r: r.request_id), sorted(hs, key=lambda r: r.request_id))
                 if p.ok and h.ok]
    same = sum(p.audio_sha256 == h.audio_sha256
               for ps, hs in zip(records["in-process"], records["http"])
               for p, h in zip(sorted(ps, key=lambda r: r.request_id), sorted(hs, key=lambda r: r.request_id)))
    return {
        "config": str(args.config), "sets": args.sets, "backend": cfg.backend, "tier": tier.label,
        "num_prompts": args.num_prompts, "repeats": args.repeats,
        "http": {"response_format": cfg.http.response_format, "stream": cfg.http.stream},
        "arms": aggs,
        "rtf_delta_mean_pct": cmp.delta_mean_pct,
        "rtf_ci95_pct": list(cmp.ci95_pct) if cmp.ci95_pct else None, "rtf_mde_pct": cmp.mde_pct,
        "verdict": cmp.verdict,
        "median_excess_ms": float(np.median(excess_ms)) if excess_ms else None,
        "p90_excess_ms": float(np.percentile(excess_ms, 90)) if excess_ms else None,
        "identical_audio": f"{same}/{args.num_prompts * args.repeats}",
        "python": platform.python_version(), "cpus": os.cpu_count(),
    }


def render(doc: dict) -> str:
    rows = [("arm", "mean RTF", "median RTF", "p90 RTF", "mean TTFP ms", "ok", "failed")]
    for arm, a in doc["arms"].items():
        rows.append((arm, f"{a['mean_audio_rtf']:.4f}", f"{a['median_audio_rtf']:.4f}",
                     f"{a['p90_audio_rtf']:.4f}", f"{a['mean_audio_ttfp_ms']:.1f}",
                     str(a["completed"]), str(a["failed"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
    ci = doc["rtf_ci95_pct"]
    ci_text = f"[{ci[0]:+.1f}%, {ci[1]:+.1f}%]" if ci else "(no interval: 1 repeat)"
    return (f"{table}\nhttp vs in-process: mean RTF {doc['rtf_delta_mean_pct']:+.1f}% "
            f"{ci_text} -> {doc['verdict']}; per request {doc['median_excess_ms']:+.1f} ms "
            f"median, {doc['p90_excess_ms']:+.1f} ms p90 to the last audio byte; identical audio "
            f"{doc['identical_audio']}")


def main() -> None:
    args = parse_args()
    os.chdir(ROOT)  # config paths and the serve child resolve from the repo root
    print(f"== http overhead == config {args.config} {' '.join(args.sets)} | tier {args.tier} | "
          f"{args.num_prompts} prompts x {args.repeats} repeats | python {platform.python_version()} "
          f"| {os.cpu_count()} cpus")
    doc = measure(args)
    print(render(doc))
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
