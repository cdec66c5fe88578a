"""One code2wav replica under runner-like traffic: graphs against an eager twin, chunk by chunk.

A runner replica at CxR sees about C/R live requests, takes at most `max_num_seqs` rows a
decode and one payload per request, and admits a new request whenever one ends (closed loop).
This drives one `Token2Wav` with device graphs and one without through exactly that traffic,
in one process, and reports:
* whether every chunk's audio is bit-identical (`np.array_equal`; deterministic kernels on,
  as in stage processes), with captures, replays and pool growth;
* device memory (allocated / reserved / peak, both twins together) and the median decode time
  of full batches, synchronized, for each twin.

It is the in-process control for the runner's A/Bs: on an H200 (2026-12-01) it stayed
bit-identical with voices changing and the pool growing, while the same replica inside a
runner process hit illegal memory accesses, until a new shape's first run moved off the
capture stream (D-GRAPH-1).

    PYTHONPATH=. python3 scripts/replica_traffic.py --live 16 --slots 16 --voices
    PYTHONPATH=. python3 scripts/replica_traffic.py --live 20 --slots 4      # the pool grows twice
    PYTHONPATH=. python3 scripts/replica_traffic.py --irregular --release-cache --requests 120

`--irregular` takes a random number of rows (1..rows) each decode, as a runner replica does when
the talker's payloads arrive unevenly, so far more batch shapes are captured. `--release-cache`
hands the allocator's cached free memory back to the driver after every decode (what the
allocator itself does when an allocation fails on a full card): a graph that still holds the
address of memory freed outside its pool then faults here at once instead of reading memory
that happens to be still mapped.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace

import numpy as np
import torch

from scripts._report import add_out, emit
from scripts._stages import prompt_voices
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.streaming import Chunker
from stages.code2wav.token2wav import Token2Wav
from stages.platform import deterministic_kernels, empty_cache, memory_stats, resolve_device, synchronize


def _requests(cfg: Code2WavConfig, n: int, voices: list[bytes], seed: int) -> list[list]:
    """n requests of 40-220 random codes, their payloads in order; voices cycled if given."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        voice = {"prompt_audio": voices[i % len(voices)]} if voices else {}
        ch = Chunker(cfg, f"q{i}", seed=i, **voice)
        codes = [rng.randrange(cfg.flow.vocab_size) for _ in range(rng.randint(40, 220))]
        out.append([*ch.push(codes), ch.finish()])
    return out


def _traffic(requests: list[list], live: int, rows: int, rng: random.Random | None = None):
    """Batches as a replica takes them: `live` requests in flight, the longest-waiting first;
    with `rng`, a random number of rows (1..rows) a decode."""
    queue, active = list(requests), []
    while queue or active:
        while queue and len(active) < live:
            active.append(queue.pop(0))
        n = rows if rng is None else rng.randint(1, rows)
        take, active = active[:n], active[n:]
        yield [q.pop(0) for q in take]
        active += [q for q in take if q]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--live", type=int, default=16, help="requests in flight (C/R of the tier)")
    ap.add_argument("--rows", type=int, default=8, help="rows a decode (runner.max_num_seqs)")
    ap.add_argument("--slots", type=int, default=16,
                    help="initial slot-pool capacity (the runner: --live, or 2 x max_num_seqs when unknown)")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--voices", action="store_true", help="each request brings a seed-tts prompt wav (3 voices)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--irregular", action="store_true", help="a random number of rows (1..rows) a decode")
    ap.add_argument("--release-cache", action="store_true",
                    help="return cached free device memory to the driver after every decode")
    add_out(ap)
    args = ap.parse_args()
    deterministic_kernels()  # as in stage processes: a replay equals its eager chunk
    device = resolve_device(args.device)
    base = Code2WavConfig()
    voices = prompt_voices() if args.voices else []
    twins = {}
    for name, graph in (("graph", True), ("eager", False)):
        twins[name] = Token2Wav(replace(base, extra={**base.extra, "code2wav_device_graph": graph}),
                                device=device, dtype=torch.float32, slots=args.slots)
        twins[name].prompt_setup()
    times: dict[str, list[float]] = {name: [] for name in twins}
    decodes = differing = 0
    rng = random.Random(args.seed + 1) if args.irregular else None
    for batch in _traffic(_requests(base, args.requests, voices, args.seed), args.live, args.rows, rng):
        outs = {}
        for name, t2w in twins.items():
            synchronize(device)
            t0 = time.perf_counter()
            outs[name] = t2w.decode(batch)
            synchronize(device)
            if len(batch) == args.rows:
                times[name].append((time.perf_counter() - t0) * 1e3)
        differing += sum(not np.array_equal(a.audio, b.audio) for a, b in zip(outs["graph"], outs["eager"]))
        decodes += 1
        if args.release_cache:
            empty_cache(device)
    graphs = twins["graph"].graphs
    report = {
        "device": str(device), "torch": torch.__version__, "args": vars(args), "decodes": decodes,
        "chunks_differing": differing,
        "graphs": None if graphs is None else {"captures": graphs.captures, "replays": graphs.replays,
                                               "disabled": graphs.disabled},
        "pool": {"capacity": twins["graph"].pool.capacity, "generation": twins["graph"].pool.generation,
                 "mib": round(twins["graph"].pool.nbytes / 2**20, 1)},
        "median_full_batch_ms": {k: (float(np.median(v)) if v else None) for k, v in times.items()},
        "memory_after_both_twins": memory_stats(device),
    }
    emit(report, args.out, "replica_traffic")
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
