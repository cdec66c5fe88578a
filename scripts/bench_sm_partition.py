"""SM-partition benchmark: how long a talker-like chain of small dependent kernels takes beside
replica-like load, with the load on the whole GPU or confined to the SMs a reservation leaves.

The chain is one device graph of ~800 kernels shaped like a talker decode step at B = 64
(20 blocks of 4 linears on [64, 768] rows plus elementwise ops), replayed on a high-priority
stream of the primary context, as the talker runs with `runner.execution: single`. The load is
`--load-threads` threads, each looping over replica-like work on its own stream (1-D convs over a
second of 24 kHz audio, 128 channels, and 2048 x 512 matmuls), eager or as a captured graph.
Cases: the chain alone; beside load on the whole device (today's `single`); beside load on the
partition left after reserving each of `--reserve` SMs (`stages.platform.partition`), with the
load eager and as graphs captured on the partition; the landmine, load graphs captured on the
primary context and replayed into partition streams; and the chain confined to the reserved SMs,
alone and beside the graph load (the talker on SMs of its own, which the runner measured slower
and does not do: D-EXEC-4).
Each case: median and p90 of `--reps` chain replays (synchronized), and the load's iterations a
second meanwhile (the partition's cost to the replicas). CUDA only. Prints a table and one JSON
document as the last stdout line; `--out DIR` (default `$OUT`) writes `DIR/bench_sm_partition.json`.

    PYTHONPATH=. python3 scripts/bench_sm_partition.py --reserve 8,16,32
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from scripts._report import add_out, emit
from stages.platform import GraphAPI, cuda_available, describe_device, graph_api, synchronize
from stages.platform.partition import SmSplit, new_cuda_stream, split_sms

ROWS, DIM, BLOCKS = 64, 768, 20


def make_chain(device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = ((3 * DIM, DIM), (DIM, DIM), (8 * DIM, DIM), (DIM, 4 * DIM))
    weights = [[torch.randn(o, i, device=device, generator=gen) * 0.02 for o, i in shapes]
               for _ in range(BLOCKS)]

    def chain(x: torch.Tensor) -> torch.Tensor:  # x: [ROWS, DIM]
        for w_qkv, w_o, w_up, w_down in weights:
            h = x
            for _ in range(6):
                h = h * 1.0001 + 0.0001
            q = torch.nn.functional.linear(h, w_qkv)[:, :DIM]
            for _ in range(6):
                q = q * 0.999 + 0.001
            x = x + torch.nn.functional.linear(q, w_o)
            a, b = torch.nn.functional.linear(x, w_up).chunk(2, dim=-1)
            m = torch.nn.functional.silu(a) * b
            for _ in range(6):
                m = m * 0.999
            x = x + torch.nn.functional.linear(m, w_down)
            for _ in range(6):
                x = x * 0.5 + 0.5 * x
        return x

    return chain


def make_load(device: torch.device) -> tuple[Callable[[], object], tuple[torch.Tensor, ...]]:
    weight = torch.randn(128, 128, 7, device=device) * 0.01
    inputs = (torch.randn(2048, 512, device=device), torch.randn(4, 128, 24000, device=device))

    def load() -> object:
        a, s = inputs
        for _ in range(4):
            y = torch.nn.functional.conv1d(s, weight, padding=3) * 0.5
            z = a @ a.T[:, :2048]
        return y, z

    return load, inputs


def capture(api: GraphAPI, fn: Callable[[], object], stream) -> Any:
    """`fn` as a device graph captured on `stream` (a partition's stream: the graph runs there)."""
    stream.wait_stream(api.current_stream())
    with api.use_stream(stream):
        fn()  # warmup off the capture's default stream (CUDA rule)
    synchronize(stream.device)
    graph = api.graph()
    with api.capture(graph, stream=stream):
        fn()
    synchronize(stream.device)
    return graph


def time_chain(api: GraphAPI, graph: Any, stream, reps: int) -> dict:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with api.use_stream(stream):
            graph.replay()
        stream.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"median_ms": round(statistics.median(times), 3), "p90_ms": round(times[int(0.9 * (reps - 1))], 3)}


def beside_load(api: GraphAPI, chain: Any, stream, loads: list[Callable[[], object]], streams: list,
                reps: int) -> dict:
    stop, counts = threading.Event(), [0] * len(loads)

    def worker(i: int) -> None:
        while not stop.is_set():
            with api.use_stream(streams[i]):
                loads[i]()
            streams[i].synchronize()
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(loads))]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the load running steadily
    done, t0 = sum(counts), time.perf_counter()
    out = time_chain(api, chain, stream, reps)
    out["load_iters_per_s"] = round((sum(counts) - done) / (time.perf_counter() - t0), 1)
    stop.set()
    for t in threads:
        t.join()
    return out


def partition_cases(api: GraphAPI, split: SmSplit, chain, chain_fn, talker, load, threads: int,
                    reps: int) -> dict:
    """The load on `split.rest`, the chain on the whole device or confined to `split.held`."""
    device = split.rest.device
    streams = [split.rest.stream() for _ in range(threads)]
    graphs = [capture(api, load, s) for s in streams]
    primary_graphs = [capture(api, load, new_cuda_stream(device)) for _ in range(threads)]
    held = split.held.stream(priority=-1)
    confined = capture(api, chain_fn, split.held.stream())
    return {
        "load_eager": beside_load(api, chain, talker, [load] * threads, streams, reps),
        "load_graphs": beside_load(api, chain, talker, [g.replay for g in graphs], streams, reps),
        # the landmine: graphs captured on the primary context, replayed into partition streams
        "load_primary_graphs_into_partition": beside_load(api, chain, talker, [g.replay for g in primary_graphs],
                                                          streams, reps),
        # the chain itself on the held SMs only
        "chain_on_held_alone": time_chain(api, confined, held, reps),
        "chain_on_held_load_graphs": beside_load(api, confined, held, [g.replay for g in graphs], streams, reps),
    }


def render(doc: dict) -> str:
    lines = [f"{'case':<44}{'chain median ms':>16}{'p90 ms':>9}{'load it/s':>11}"]
    for name, r in doc["cases"].items():
        lines.append(f"{name:<44}{r['median_ms']:>16.2f}{r['p90_ms']:>9.2f}{r.get('load_iters_per_s', ''):>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reserve", default="8,16,32", help="SMs to reserve, one case each")
    ap.add_argument("--load-threads", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    add_out(ap)
    args = ap.parse_args(argv)
    if not cuda_available():
        raise SystemExit("error: the SM-partition benchmark needs a CUDA device")
    device = torch.device("cuda", 0)
    api = graph_api(device)
    chain_fn, (load, _) = make_chain(device), make_load(device)
    x = torch.randn(ROWS, DIM, device=device)
    talker = new_cuda_stream(device, priority=-1)  # the primary context's SMs, high priority
    step = lambda: chain_fn(x)  # noqa: E731
    chain = capture(api, step, new_cuda_stream(device))
    print(f"sm partition bench | {describe_device(device)} | chain {BLOCKS} blocks at B={ROWS}")
    cases = {"alone": time_chain(api, chain, talker, args.reps),
             "load_on_whole_device": beside_load(api, chain, talker, [load] * args.load_threads,
                                                 [new_cuda_stream(device) for _ in range(args.load_threads)],
                                                 args.reps)}
    partitions = {}
    for count in (int(c) for c in args.reserve.split(",")):
        split = split_sms(device, count)
        partitions[count] = split.describe()
        for kind, r in partition_cases(api, split, chain, step, talker, load, args.load_threads, args.reps).items():
            cases[f"reserve_{split.held.sms}_{kind}"] = r
    doc = {"schema": "sm-partition-bench/1", "device": describe_device(device), "reps": args.reps,
           "load_threads": args.load_threads, "partitions": partitions, "cases": cases}
    print(render(doc))
    emit(doc, args.out, "bench_sm_partition")


if __name__ == "__main__":
    main()
