"""One steady code2wav chunk (1 s of audio per row): device graphs vs eager (and the DiT's fused
norm vs its eager chain, the DiT's attention paths), side by side.

For each B, full-size replicas, one per arm (`--arms`, default graphs on and off), decode the
same B streams' payloads; streams are first fed until their caches are saturated (the steady
shape), then `--reps` chunks are timed, the arms alternating in forward / reverse order so host
drift cancels out of the ratios (each arm's time over the first arm's, per chunk).
A chunk's time is host wall time from `decode()` call to its audio on the host (what a replica
loop waits for). Also reported per chunk: device kernels and host launch calls (a replayed graph
is one launch), and whether the two arms' audio was identical (graph replay == eager, bit for
bit, for the same batch composition; arms that differ in the fused norm are not expected to be).

    PYTHONPATH=. python3 scripts/bench_code2wav.py --rows 1,4,8,16 --reps 10
    PYTHONPATH=. python3 scripts/bench_code2wav.py --rows 1,8 --tf32 off,flow --out $OUT
    PYTHONPATH=. python3 scripts/bench_code2wav.py --rows 1,8 --arms graph,graph-unfused,eager,eager-unfused
    PYTHONPATH=. python3 scripts/bench_code2wav.py --rows 1,2,4,8,16 --arms graph-sdpa,graph-matmul

The last stdout line is one JSON document; a fixed-width table precedes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import numpy as np
import torch

from scripts._report import add_out, emit
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.token2wav import Token2Wav
from stages.platform import deterministic_kernels, empty_cache, resolve_device, synchronize, thread_stream
from stages.profiling.code2wav_step import prepare_streams, steady_start
from stages.profiling.launches import count_launches
from tts_bench.verdicts.stats import block_interval, pct

def _timed(t2w: Token2Wav, batch: list) -> tuple[float, list[np.ndarray]]:
    synchronize(t2w.device)
    t0 = time.perf_counter()
    outs = t2w.decode(batch)
    return (time.perf_counter() - t0) * 1000.0, [o.audio for o in outs]


def bench_rows(arms: dict[str, Token2Wav], rows: int, reps: int) -> dict:
    cfg = next(iter(arms.values())).cfg
    warm = steady_start(cfg) + 1  # + 1: the graph arm captures its steady graph on the first
    streams = prepare_streams(cfg, rows, warm + reps + 1, "bench")
    for step in range(warm):
        for t2w in arms.values():
            t2w.decode([s[step] for s in streams])
    names = list(arms)
    times = {n: [] for n in names}
    identical = {n: 0 for n in names[1:]}  # chunks whose audio equals the first arm's
    for k in range(reps):
        step = warm + k
        order = names if k % 2 == 0 else names[::-1]
        audio = {}
        for n in order:
            ms, audio[n] = _timed(arms[n], [s[step] for s in streams])
            times[n].append(ms)
        for n in names[1:]:
            identical[n] += all(np.array_equal(a, b) for a, b in zip(audio[names[0]], audio[n]))
    counts = {}
    step = warm + reps
    for n, t2w in arms.items():
        batch = [s[step] for s in streams]
        counts[n] = count_launches(lambda t=t2w, b=batch: t.decode(b), device=t2w.device, repeats=1, warmup=0)
    for n, t2w in arms.items():
        for s in streams:
            t2w.drop(s[0].request_id)
    out = {"rows": rows, "reps": reps, "identical_chunks": identical}
    for n in names:
        out[n] = {
            "median_ms": statistics.median(times[n]),
            "times_ms": times[n],  # per timed chunk, in order (paired across arms by index)
            "p90_ms": float(np.percentile(times[n], 90)),
            "kernels_per_chunk": counts[n].per_call,
            "copies_per_chunk": counts[n].copies_per_call,
            "host_launches_per_chunk": counts[n].host_per_call,
        }
    first = times[names[0]]
    out["over_first_median"] = {n: statistics.median([a / f for a, f in zip(times[n], first)]) for n in names[1:]}
    # Each timed chunk is a block of the arms side by side: the t interval of the mean log ratio,
    # as `tts-bench ab` reads its repeats (percent change of each arm against the first).
    out["over_first_ci95_pct"] = {}
    for n in names[1:]:
        iv = block_interval(np.log(np.array(times[n]) / np.array(first)))
        out["over_first_ci95_pct"][n] = [pct(iv.center), pct(iv.lo), pct(iv.hi)] if iv.resolved else None
    if "eager" in arms and "graph" in arms:
        out["eager_over_graph_median"] = statistics.median([e / g for e, g in zip(times["eager"], times["graph"])])
    return out


# What each arm ran, from its engine's run-record facts (Token2Wav.describe).
DESCRIBED = ("dit_norm", "dit_attention", "dit_conv", "dit_gemm", "dit_conv_norm", "dit_conv_gemm", "hift_snake")

def _graph_and_eager(name: str, flags: dict) -> dict[str, dict]:
    """Arms "graph-<name>" and "eager-<name>": `flags` with device graphs on and off."""
    return {f"{mode}-{name}": {"code2wav_device_graph": mode == "graph", **flags} for mode in ("graph", "eager")}


# Arm name -> the code2wav stage extra it runs with (on top of --tf32's mode).
ARMS = {
    "graph": {"code2wav_device_graph": True},
    "eager": {"code2wav_device_graph": False},
    **_graph_and_eager("unfused", {"code2wav_fused_norm": False}),
    # The DiT's attention at every row count through one path (the default switches by rows):
    # the fused kernel, the batched GEMMs, the Triton kernel (code2wav_triton_attention).
    "graph-sdpa": {"code2wav_device_graph": True, "code2wav_matmul_attention_requests": 0},
    "graph-matmul": {"code2wav_device_graph": True, "code2wav_matmul_attention_requests": 4096,
                     "code2wav_triton_attention": False},
    "graph-flash-all": {"code2wav_device_graph": True, "code2wav_matmul_attention_requests": 4096},
    "graph-channels-first": {"code2wav_device_graph": True, "code2wav_frames_first_conv": False},
    # The DiT's linears on cuBLAS fp32 (the default runs them as Triton 3xTF32 GEMMs on CUDA).
    **_graph_and_eager("cublas", {"code2wav_dit_tf32x3": False}),
    # Small chunks' attention as batched cuBLAS GEMMs (the default runs one Triton kernel).
    **_graph_and_eager("gemm-attention", {"code2wav_triton_attention": False}),
    # The DiT conv block's LayerNorm + Mish + cache writes as the modules' ops (default: one launch).
    "graph-eager-conv-norm": {"code2wav_device_graph": True, "code2wav_fused_conv_norm": False},
    # The DiT's causal convs on cuDNN (default: 3xTF32 Triton GEMMs over the window).
    "graph-cudnn-conv": {"code2wav_device_graph": True, "code2wav_conv_gemm": False},
    # The three kernels of 2026-12-05 off: conv GEMMs, the conv-block norm, HiFT's Snakes.
    "graph-unfused-c2w": {"code2wav_device_graph": True, "code2wav_conv_gemm": False,
                          "code2wav_fused_conv_norm": False, "code2wav_fused_snake": False},
    # HiFT's Snakes as the module's eight-kernel formula (the default runs one Triton launch each).
    **_graph_and_eager("module-snake", {"code2wav_fused_snake": False}),
    # The pool's attention-cache loads and stores as one Triton pass each way (the default since
    # D-C2W-4) and as torch's index_select / cat / index_put_ chains.
    **_graph_and_eager("cache-copy", {"code2wav_fused_cache_copy": True}),
    **_graph_and_eager("torch-cache-copy", {"code2wav_fused_cache_copy": False}),
    # HiFT's stride-1 convs as 3xTF32 Triton GEMMs (default: cuDNN's fp32 convs, D-HIFT-2).
    **_graph_and_eager("hift-conv-gemm", {"code2wav_hift_conv_gemm": True}),
    # Both kernels of 2026-12-05 on (the cache copies, D-C2W-4, and HiFT's conv GEMMs, D-HIFT-2).
    "graph-opt-in": {"code2wav_device_graph": True, "code2wav_fused_cache_copy": True,
                     "code2wav_hift_conv_gemm": True},
    # The DiT's launch fusions off (stages/code2wav/fusions.py; bit-exact, on by default since
    # D-DIT-9): split k-sums added by the next fused kernel, the conv window written by the norm
    # step, each alone and both.
    **_graph_and_eager("no-open-sums", {"code2wav_open_split_sums": False}),
    **_graph_and_eager("no-conv-window", {"code2wav_norm_writes_conv_window": False}),
    **_graph_and_eager("no-dit-fusions", {"code2wav_open_split_sums": False, "code2wav_norm_writes_conv_window": False}),
    # The MLP branch as one launch at up to two requests (stages/code2wav/dit_mlp.py; opt-in, not
    # bit-exact: its audio is not identical to the default's, by fp32 rounding).
    **_graph_and_eager("fused-mlp", {"code2wav_fused_mlp": True}),
    "graph-bf16": {"code2wav_device_graph": True, "code2wav_dit_dtype": "bfloat16"},  # the DiT and its caches
    "graph-bf16-channels-first": {"code2wav_device_graph": True, "code2wav_dit_dtype": "bfloat16",
                                  "code2wav_frames_first_conv": False},
}


def kernel_table(t2w: Token2Wav, rows: int, top: int = 25) -> dict:
    """Device time per chunk by kernel name (one steady chunk of `rows` rows, under the
    profiler): where a chunk's device time goes, for the targets a graph cannot reach."""
    from torch.profiler import ProfilerActivity, profile

    start = steady_start(t2w.cfg)
    streams = prepare_streams(t2w.cfg, rows, start + 1, "kernels")
    for step in range(start):  # the eager arm: no graph to capture first
        t2w.decode([s[step] for s in streams])
    synchronize(t2w.device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t2w.decode([s[start] for s in streams])
        synchronize(t2w.device)
    for s in streams:
        t2w.drop(s[0].request_id)
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation:
            by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    total = sum(sum(v) for v in by_name.values())
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"rows": rows, "device_ms": total / 1000, "kernels": sum(len(v) for v in by_name.values()),
            "top": [{"name": n[:90], "count": len(v), "ms": sum(v) / 1000} for n, v in ranked]}


def bench_threads(base: Code2WavConfig, device: torch.device, replicas: int, rows: int, chunks: int) -> dict:
    """`replicas` graph replicas on threads of this process (own stream each, shared weights),
    each decoding `rows` steady streams for `chunks` chunks at once: audio seconds per second."""
    import threading

    first = Token2Wav(base, device=device, dtype=torch.float32, slots=rows)
    reps = [first] + [Token2Wav(base, device=device, dtype=torch.float32, slots=rows, shared=first)
                      for _ in range(replicas - 1)]
    warm = steady_start(base) + 1  # + 1: each replica captures its steady graph
    streams = [prepare_streams(base, rows, warm + chunks, f"t{i}") for i in range(replicas)]
    barrier = threading.Barrier(replicas + 1)
    errors: list[BaseException] = []

    def work(t2w: Token2Wav, mine: list) -> None:
        try:
            with thread_stream(device):  # its own device stream, as a replica thread runs
                for step in range(warm):
                    t2w.decode([s[step] for s in mine])
                barrier.wait()
                for step in range(warm, warm + chunks):
                    t2w.decode([s[step] for s in mine])
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(t, st)) for t, st in zip(reps, streams)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    audio_s = replicas * rows * chunks * base.codec_chunk_frames / base.token_rate_hz
    return {"replicas": replicas, "rows": rows, "chunks": chunks, "wall_s": wall,
            "audio_s_per_s": audio_s / wall, "rtf_if_fed": wall * base.token_rate_hz / (chunks * base.codec_chunk_frames)}


def _ci(ci: list[float] | None) -> str:
    return "n/a" if ci is None else f"{ci[0]:+.1f}% [{ci[1]:+.1f}, {ci[2]:+.1f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,8,16",
                    help="comma list of B; empty: no per-chunk arms (e.g. --threads alone)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--tf32", default="off", help="comma list of token2wav_allow_tf32 modes (off, conv, flow, all)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", default="", help="comma list of replica-thread counts (graphs on)")
    ap.add_argument("--thread-rows", type=int, default=8)
    ap.add_argument("--thread-chunks", type=int, default=8)
    ap.add_argument("--thread-arm", default="graph", choices=[a for a in ARMS if a.startswith("graph")],
                    help="the stage flags of the replica threads (e.g. graph-bf16)")
    ap.add_argument("--kernels", default="", help="comma list of B: device time by kernel (eager)")
    ap.add_argument("--arms", default="graph,eager", help=f"comma list of arms, first = reference: {', '.join(ARMS)}")
    add_out(ap)
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",") if x]
    kernel_rows = [int(x) for x in args.kernels.split(",") if x]
    arm_names = [a for a in args.arms.split(",") if a] if rows or kernel_rows else []
    unknown = [a for a in arm_names if a not in ARMS]
    if arm_names and (unknown or len(arm_names) < 2 or len(set(arm_names)) != len(arm_names)):
        ap.error(f"--arms takes two or more distinct names of {', '.join(ARMS)}; got {args.arms!r}")
    if args.kernels and not any(a.startswith("eager") for a in arm_names):
        ap.error(f"--kernels profiles an eager chunk: add eager or eager-unfused to --arms (got {args.arms!r})")
    deterministic_kernels()  # as in the stage processes (runner.deterministic): replay == eager
    device = resolve_device(args.device)
    results = []
    for mode in args.tf32.split(",") if arm_names else []:
        base = Code2WavConfig(extra={"token2wav_allow_tf32": mode})
        arms = {
            name: Token2Wav(replace(base, extra={**base.extra, **ARMS[name]}), device=device,
                            dtype=torch.float32, slots=max(rows + kernel_rows))
            for name in arm_names
        }
        for t2w in arms.values():
            t2w.prompt_setup()
        for b in kernel_rows if mode == "off" else []:
            k = kernel_table(next(t for n, t in arms.items() if n.startswith("eager")), b)
            results.append({"kernel_table": k, "tf32": mode})
            print(f"eager B={b}: {k['device_ms']:.1f} device ms in {k['kernels']} kernels", file=sys.stderr)
            for row in k["top"][:12]:
                print(f"  {row['ms']:8.2f} ms {row['count']:6d}x  {row['name']}", file=sys.stderr)
        for b in rows:
            r = bench_rows(arms, b, args.reps)
            r["tf32"] = mode
            r["graphs_disabled"] = {n: (t.graphs.disabled if t.graphs else "no graph API") for n, t in arms.items()}
            described = {n: t.describe() for n, t in arms.items()}
            for key in DESCRIBED:
                r[key] = {n: d[key] for n, d in described.items()}
            results.append(r)
            cols = "  ".join(
                f"{n} {r[n]['median_ms']:.2f} ms ({r[n]['host_launches_per_chunk']} launches, "
                f"{r[n]['kernels_per_chunk']:.0f} kernels"
                + (f", x{r['over_first_median'][n]:.3f} {_ci(r['over_first_ci95_pct'][n])}, "
                   f"identical {r['identical_chunks'][n]}/{r['reps']})" if n != arm_names[0] else ")")
                for n in arm_names
            )
            print(f"tf32={mode:4s} B={b:3d}  {cols}", file=sys.stderr, flush=True)
        del arms
        empty_cache(device)
    threads = []
    for r in [int(x) for x in args.threads.split(",") if x]:
        t = bench_threads(Code2WavConfig(extra=dict(ARMS[args.thread_arm])), device, r, args.thread_rows,
                          args.thread_chunks)
        t["arm"] = args.thread_arm
        threads.append(t)
        print(f"threads={r} rows={t['rows']}: {t['audio_s_per_s']:.2f} audio s/s "
              f"(each stream at RTF {t['rtf_if_fed']:.3f})", file=sys.stderr, flush=True)
        empty_cache(device)
    doc = {"device": str(device), "torch": torch.__version__, "results": results, "threads": threads}
    emit(doc, args.out, "bench_code2wav")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
