"""Cross-check: tts-bench's http backend against the official OpenAI SDK, on a server with known delays.

`tts-bench serve` runs the synthetic backend (silence released on a fixed schedule, so every
request's RTF and TTFP are known in advance: `SyntheticBackend.implied_rtf`, and the first chunk's
delay) as a separate process on 127.0.0.1. Two clients send the same prompts at the same
concurrency, in each response format asked for: tts-bench's `http` backend through the phase
driver `tts-bench ab` uses (`tts_bench.load.phases.run_fresh_phase`, recording into a throwaway
run directory), and an independent client written with the OpenAI SDK
(`AsyncOpenAI().audio.speech.with_streaming_response.create`, TTFP at the first byte chunk of
the body, RTF = wall time / audio seconds, the audio decoded with PyAV afterwards). Each figure
is reported against the expected value; what a client reads above it is its overhead.

    PYTHONPATH=. python scripts/sdk_crosscheck.py                   # pcm and mp3, 4x1, 32 prompts
    PYTHONPATH=. python scripts/sdk_crosscheck.py --formats pcm,mp3,opus --concurrency 8

Prints a fixed-width table, then one JSON document as the last stdout line
(results/cpu/sdk-crosscheck.json keeps one run).
"""

from __future__ import annotations

import argparse
import asyncio
import io
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
from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.config import Tier, load_config
from tts_bench.inputs.prompts import load_prompts, select_prompts
from tts_bench.load.phases import run_fresh_phase
from tts_bench.rundir.atomic_json import write_json_atomic
from tts_bench.rundir.records import Job, PhaseLabels
from tts_bench.rundir.results import RunDir

ROOT = Path(__file__).resolve().parents[1]
SERVED = {"backend": "synthetic", "synthetic": {
    "chunk_seconds": 0.25, "first_chunk_delay_s": 0.05, "chunk_delay_s": 0.02,
    "seconds_per_word": 0.25, "sample_rate": 24000}}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="pcm,mp3")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="client order alternates per repeat")
    return ap.parse_args()


class Server:
    """`tts-bench serve` of the synthetic config in its own process (its own loop and GIL)."""

    def __init__(self, config: Path) -> None:
        cmd = [sys.executable, "-m", "tts_bench.cli", "serve", "--config", str(config), "--port", "0"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stderr], daemon=True).start()
        deadline = time.monotonic() + 60
        self.url = None
        while self.url is None and time.monotonic() < deadline:
            try:
                m = re.search(r"listening on (http://\S+?)\s", lines.get(timeout=0.5))
                self.url = m.group(1) if m else None
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
        if self.url is None:
            self.stop()
            raise SystemExit("tts-bench serve did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)


async def tool_client(url: str, fmt: str, prompts, concurrency: int, run: RunDir) -> list[dict]:
    """One phase of the http backend on a fresh backend, no warmup (as the SDK client has none)."""
    cfg = load_config(None, ["backend=http", f"http.base_url={url}", f"http.response_format={fmt}",
                             "http.send_voice=false", "http.model=tts-1", "bench.timeout_s=60"])
    tier = Tier(concurrency, 1)
    jobs = [Job(SynthesisRequest(f"m{i:04d}", p.text), p.utt) for i, p in enumerate(prompts)]
    result = await run_fresh_phase(cfg, tier, PhaseLabels("tool", tier.label, 0), ([], jobs), run_dir=run)
    return [{"ttfp_ms": r.audio_ttfp_ms, "rtf": r.audio_rtf, "audio_s": r.audio_seconds}
            for r in result.records if r.ok]


async def sdk_client(url: str, fmt: str, prompts, concurrency: int) -> list[dict]:
    import av
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    gate = asyncio.Semaphore(concurrency)

    async def one(text: str) -> dict:
        async with gate:
            t0 = time.perf_counter()
            first = None
            body = bytearray()
            async with client.audio.speech.with_streaming_response.create(
                    model="tts-1", voice="alloy", input=text, response_format=fmt) as resp:
                async for piece in resp.iter_bytes():
                    if first is None and piece:
                        first = time.perf_counter()
                    body += piece
            wall = time.perf_counter() - t0
        if fmt == "pcm":
            audio_s = len(body) / 2 / 24000
        else:
            with av.open(io.BytesIO(bytes(body))) as c:
                audio_s = sum(f.samples for f in c.decode(audio=0)) / c.streams.audio[0].sample_rate
        return {"ttfp_ms": (first - t0) * 1e3, "rtf": wall / audio_s, "audio_s": audio_s}

    try:
        return list(await asyncio.gather(*(one(p.text) for p in prompts)))
    finally:
        await client.close()


def main() -> None:
    args = parse_args()
    served = load_config(None, [f"synthetic.{k}={v}" for k, v in SERVED["synthetic"].items()] + ["backend=synthetic"])
    synth = SyntheticBackend(served)
    prompts = select_prompts(load_prompts(served.prompts.meta), args.num_prompts, shuffle=True, seed=0)
    expected_rtf = float(np.mean([synth.implied_rtf(p.text) for p in prompts]))
    expected_ttfp = served.synthetic.first_chunk_delay_s * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "served.yaml"
        write_json_atomic(config, SERVED)  # JSON is YAML
        server = Server(config)
        try:
            run = RunDir.create(tmp, "crosscheck", command_line=sys.argv, configs={})
            clients = {"tool": lambda fmt: tool_client(server.url, fmt, prompts, args.concurrency, run),
                       "sdk": lambda fmt: sdk_client(server.url, fmt, prompts, args.concurrency)}
            with run.finishing():
                runs: dict[tuple[str, str], list[dict]] = {}
                for repeat in range(args.repeats):
                    for fmt in args.formats.split(","):
                        order = ("tool", "sdk") if repeat % 2 == 0 else ("sdk", "tool")
                        for who in order:
                            runs.setdefault((who, fmt), []).extend(asyncio.run(clients[who](fmt)))
                run.update(status="complete")
        finally:
            server.stop()
    rows = []
    for (who, fmt), recs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rtf, ttfp = float(np.mean([r["rtf"] for r in recs])), float(np.mean([r["ttfp_ms"] for r in recs]))
        rows.append({"client": who, "format": fmt, "n": len(recs), "rtf_mean": round(rtf, 5),
                     "rtf_vs_expected_pct": round(100 * (rtf / expected_rtf - 1), 2),
                     "ttfp_ms_mean": round(ttfp, 2), "ttfp_vs_expected_ms": round(ttfp - expected_ttfp, 2),
                     "audio_s_mean": round(float(np.mean([r["audio_s"] for r in recs])), 4)})
    print(f"server: tts-bench serve, synthetic backend {SERVED['synthetic']}; {args.concurrency} in flight, "
          f"{args.num_prompts} prompts x {args.repeats} repeats per client and format")
    print(f"expected: RTF {expected_rtf:.5f} (mean of the delay-implied RTFs), TTFP {expected_ttfp:.1f} ms")
    print(f"{'client':<7}{'format':<8}{'n':>4}{'RTF':>10}{'vs exp':>9}{'TTFP ms':>10}{'vs exp':>9}{'audio s':>9}")
    for r in rows:
        print(f"{r['client']:<7}{r['format']:<8}{r['n']:>4}{r['rtf_mean']:>10.5f}{r['rtf_vs_expected_pct']:>+8.2f}%"
              f"{r['ttfp_ms_mean']:>10.2f}{r['ttfp_vs_expected_ms']:>+9.2f}{r['audio_s_mean']:>9.3f}")
    import openai

    doc = {"what": "RTF and TTFP of tts-bench's http backend and an OpenAI-SDK client against a server with known delays",
           "server": {"backend": "synthetic", **SERVED["synthetic"]}, "concurrency": args.concurrency,
           "num_prompts": args.num_prompts, "repeats": args.repeats,
           "expected": {"rtf_mean": round(expected_rtf, 5), "ttfp_ms": expected_ttfp}, "rows": rows,
           "env": {"python": platform.python_version(), "openai": openai.__version__, "cpus": os.cpu_count(),
                   "load_avg": [round(x, 2) for x in os.getloadavg()]}}
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
