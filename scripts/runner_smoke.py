"""Stage-runner smoke benchmark: start time, RTF/TTFP and per-process memory, one JSON line.

Starts the embedded runner (talker + R code2wav replicas) from a stage YAML, keeps C requests
in flight until N have finished, and reports runner start seconds, mean/median audio RTF and
TTFP, audio seconds, failures, every stage process's allocator memory and every stage's work
over the tier (busy share, ms and rows a step, backlog, chunk groups, graph captures / replays /
groups run eagerly:
`stages.runner.work`; the talker's line also splits its busy time into waiting for the device
and admitting requests), which says whether the talker or code2wav held the tier back.
Independent of the harness's load generator on purpose: it checks the runner alone.

    PYTHONPATH=. python3 scripts/runner_smoke.py --config configs/stages/minicpmo45.yaml \
        --tiers 8x1,32x4 --num-requests 64          # writes $OUT/runner_smoke.json when $OUT is set
    PYTHONPATH=. python3 scripts/runner_smoke.py --config configs/stages/minicpmo45-tiny.yaml \
        --tiers 1x1,2x2 --num-requests 4           # CPU
    PYTHONPATH=. python3 scripts/runner_smoke.py --tiers 64x4 --num-requests 192 --fake-talker 0.02 \
        --voices --set code2wav.extra.code2wav_dit_dtype=bfloat16

`--trace SECONDS` opens a profiler window in the talker's process (every stage's, with
`runner.execution: single`) `--trace-after` seconds into each tier: its Chrome trace goes to
`<out>/trace_<tier>.json.gz`, and a summary per device stream is printed and kept in the JSON
(`stages.profiling.window`: the talker's stream, kernels, mean kernel time, idle share). Writing
the trace stalls the talker for a few seconds, which the tier's RTF then includes.

    PYTHONPATH=. python3 scripts/runner_smoke.py --voices --tiers 64x4 --num-requests 128 \
        --set runner.execution=single --trace 1

`--fake-talker STEP_S` replaces the talker by the runner tests' fake (no device work, one code
per request every STEP_S seconds, 100-300 codes a request) while the code2wav replicas stay
real: stage 2 alone, in real processes, under runner traffic. `--voices` gives each request a
seed-tts prompt wav (cycled), as `prompts.voices: file` does in the harness.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from scripts._report import add_out, emit
from scripts._stages import load_stages, prompt_voices
from stages.config import StageConfig
from stages.runner import RequestError, RunnerRequest, StageRunner
from stages.runner.factories import StageFactories
from stages.runner.fakes import FakeTalker, FakeTalkerRequest
from stages.profiling.window import format_trace
from stages.runner.work import format_work, work_delta
from tts_bench.config import apply_overrides
from tts_bench.rundir.provenance import runtime_variables


SENTENCES = [
    "A small boat drifted slowly across the calm grey lake at dawn.",
    "Please close the window before the evening rain starts to fall.",
    "The old library keeps its rarest maps behind a sheet of thick glass.",
    "She packed warm bread, sharp cheese and green apples for the long walk.",
    "Every morning the baker sings quietly while the ovens warm up.",
    "Bright kites danced above the hill as the wind picked up speed.",
]


class Tracker:
    """Per-request send / first / last arrival times and audio seconds, fed by runner events."""

    def __init__(self, sample_rate: int, concurrency: int) -> None:
        self.sample_rate = sample_rate
        self.slots = threading.Semaphore(concurrency)
        self.lock = threading.Lock()
        self.rows: dict[str, dict] = {}
        self.done = threading.Event()
        self.expected = 0

    def callback(self, rid: str):
        row = self.rows[rid]

        def on_event(event) -> None:
            now = time.perf_counter()
            if isinstance(event, RequestError):
                row["error"] = event.message
            else:
                row.setdefault("first", now)
                row["audio_s"] += len(event.audio) / self.sample_rate
                row["codes"] += len(event.codes)
                if not event.last_chunk:
                    return
                row["last"] = now
            self.slots.release()
            with self.lock:
                self.expected -= 1
                if self.expected == 0:
                    self.done.set()

        return on_event


@dataclass(frozen=True)
class TraceWindow:
    """A profiler window `seconds` long, opened `after_s` into the tier, written to `path`."""

    after_s: float
    seconds: float
    path: Path


def start_trace(runner: StageRunner, window: TraceWindow, done: threading.Event, into: dict) -> threading.Thread:
    """A thread that takes the window unless the tier is done first; its summary goes to into["trace"]."""
    def take() -> None:
        if not done.wait(window.after_s):
            into["trace"] = runner.trace(window.seconds, window.path)

    thread = threading.Thread(target=take, name="trace-window", daemon=True)
    thread.start()
    return thread


def run_tier(cfg: StageConfig, concurrency: int, replicas: int, n: int, *,
             factories: StageFactories | None = None, voices: list[bytes] = (),
             max_codes: tuple[int, int] | None = None, trace: TraceWindow | None = None) -> dict:
    t0 = time.perf_counter()
    runner = StageRunner(cfg, replicas, factories=factories, concurrency=concurrency)
    lengths = random.Random(n)
    runner.start()
    start_s = time.perf_counter() - t0
    tracker = Tracker(cfg.code2wav.sample_rate, concurrency)
    tracker.expected = n
    traced: dict = {}
    try:
        work_before = runner.work_snapshot()
        tracing = start_trace(runner, trace, tracker.done, traced) if trace is not None else None
        for i in range(n):
            tracker.slots.acquire()
            rid = f"req-{i}"
            tracker.rows[rid] = {"send": time.perf_counter(), "audio_s": 0.0, "codes": 0}
            codes = None if max_codes is None else lengths.randint(*max_codes)
            voice = voices[i % len(voices)] if voices else None
            runner.submit(RunnerRequest(rid, SENTENCES[i % len(SENTENCES)], seed=42 + i, max_codes=codes,
                                        prompt_audio=voice), tracker.callback(rid))
        tracker.done.wait(3600)
        if tracing is not None:
            tracing.join()  # a window still open closes by itself, the runner answers
        work = work_delta(work_before, runner.work_snapshot())
        memory = runner.memory_snapshot()
    finally:
        runner.stop()
    ok = [r for r in tracker.rows.values() if "error" not in r and r["audio_s"] > 0]
    rtf = [(r["last"] - r["send"]) / r["audio_s"] for r in ok]
    ttfp = [(r["first"] - r["send"]) * 1000 for r in ok]
    return {
        "tier": f"{concurrency}x{replicas}",
        "start_s": round(start_s, 2),
        "completed": len(ok),
        "failed": n - len(ok),
        "errors": sorted({r["error"][:200] for r in tracker.rows.values() if "error" in r}),
        "mean_audio_rtf": statistics.fmean(rtf) if rtf else None,
        "median_audio_rtf": statistics.median(rtf) if rtf else None,
        "mean_audio_ttfp_ms": statistics.fmean(ttfp) if ttfp else None,
        "median_audio_ttfp_ms": statistics.median(ttfp) if ttfp else None,
        "audio_seconds": sum(r["audio_s"] for r in ok),
        "codes": sum(r["codes"] for r in ok),
        "memory": memory,
        "work": work,
        "processes": runner.info,
        **traced,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/stages/minicpmo45.yaml")
    ap.add_argument("--tiers", default="8x1,32x4")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a stage config field (repeatable), e.g. runner.max_num_seqs=4")
    ap.add_argument("--fake-talker", type=float, default=None, metavar="STEP_S",
                    help="the runner tests' fake talker (no device work), one code a request every STEP_S s")
    ap.add_argument("--voices", action="store_true", help="each request brings a seed-tts prompt wav")
    ap.add_argument("--trace", type=float, default=None, metavar="SECONDS",
                    help="a profiler window of SECONDS in the talker's process, per tier")
    ap.add_argument("--trace-after", type=float, default=20.0, metavar="SECONDS",
                    help="seconds into a tier (its requests, after the start) to open the window (default 20)")
    add_out(ap)
    args = ap.parse_args()
    if args.trace is not None and not args.trace > 0:
        ap.error(f"--trace must be > 0 seconds, got {args.trace}")
    path = Path(args.config)
    cfg = apply_overrides(load_stages(path), args.sets)
    factories, max_codes = None, None
    if args.fake_talker is not None:
        factories = StageFactories(talker=partial(FakeTalker, step_s=args.fake_talker),
                                   talker_request=FakeTalkerRequest)
        max_codes = (100, 300)  # the fake has no EOS: a spread of lengths, as real requests have
    voices = prompt_voices() if args.voices else []
    results = []
    for tier in args.tiers.split(","):
        c, r = (int(x) for x in tier.lower().split("x"))
        trace = None
        if args.trace is not None:
            trace = TraceWindow(args.trace_after, args.trace, Path(args.out or ".") / f"trace_{c}x{r}.json.gz")
        res = run_tier(cfg, c, r, max(args.num_requests, c), factories=factories, voices=voices,
                       max_codes=max_codes, trace=trace)
        results.append(res)
        print(f"{res['tier']:>6}  start {res['start_s']:6.1f} s  done {res['completed']:4d}  "
              f"failed {res['failed']:3d}  mean RTF {res['mean_audio_rtf'] or float('nan'):.3f}  "
              f"median TTFP {res['median_audio_ttfp_ms'] or float('nan'):.0f} ms  "
              f"peak MiB {max((m['peak_bytes'] for m in res['memory']), default=0) / 2**20:.0f}")
        for line in format_work(res["work"]):
            print(f"        {line}")
        if trace is not None:
            lines = format_trace(res["trace"]) if "trace" in res else [
                "trace: none (the tier ended before the window opened, or the talker did not answer)"]
            for line in lines:
                print(f"        {line}")
    doc = {"config": str(path), "sets": args.sets, "runtime_variables": runtime_variables(),
           "fake_talker_step_s": args.fake_talker, "voices": len(voices), "tiers": results}
    emit(doc, args.out, "runner_smoke")


if __name__ == "__main__":
    main()
