"""Microbenchmark of the code2wav per-request cache split: per-row (4B stores) vs batched (3).

Times `chunk_decode.store_small_caches` — a chunk's conformer_cnn, conformer_att and
estimator_cnn caches written into the rows' slots of the replica's slot pool, the part the two
implementations differ in (the estimator_att stores are batched in both) — at full-size cache
shapes for B = 1, 4, 8, 16, plus the estimator_cnn store alone. Device time with CUDA events on
CUDA (perf_counter on CPU), warmup excluded, synchronize before every clock read. Launches per
split are counted with `stages.profiling.launches.count_launches` (CUDA kernels plus memcpys on CUDA,
top-level non-view aten ops on CPU): per-row is 4B (one `index_copy_` per row for each conformer
cache, one per CFG half of each row for the estimator cnn), batched is 3. Prints a header, a
fixed-width table, and one JSON line last; with $OUT set the JSON is also written to
$OUT/bench_split.json. The rows go to the odd slots of a pool of 2B slots, so neither arm
writes one contiguous block.

    PYTHONPATH=. python3 scripts/bench_split.py                 # cuda if present, else cpu
    PYTHONPATH=. python3 scripts/bench_split.py --device cpu --iters 20 --batches 1,4
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
import time
from dataclasses import dataclass

import torch

from scripts._report import add_out, emit
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.chunk_decode import store_small_caches
from stages.code2wav.slots import SlotPool
from stages.platform import cuda_available, device_name, is_cpu, is_cuda, synchronize, timing_event
from stages.profiling.launches import count_launches


@dataclass
class SplitInputs:
    pool: dict[str, torch.Tensor]  # the three pool tensors the split writes (2B slots)
    slots: torch.Tensor
    pairs: torch.Tensor
    conformer_cnn: torch.Tensor
    conformer_att: torch.Tensor
    estimator_cnn: torch.Tensor


def full_size_inputs(rows: int, conformer_frames: int, device, dtype) -> SplitInputs:
    """A B-row chunk's new caches and the pool tensors they go to, at the real dims."""
    c = Code2WavConfig()
    f, d = c.flow, c.dit
    layers, cap = f.num_blocks + f.num_up_blocks, 2 * rows

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    slots = torch.arange(1, cap, 2, device=device)
    return SplitInputs(
        pool={
            "conformer_cnn": rand(cap, f.input_size, 2 + 2 * f.up_rate),
            "conformer_att": rand(layers, cap, f.attention_heads, conformer_frames, 2 * f.head_dim),
            "estimator_cnn": rand(c.n_timesteps, d.depth, 2 * cap, 2 * d.hidden_size, 2),
        },
        slots=slots,
        pairs=SlotPool.pair_index(slots),
        conformer_cnn=rand(rows, f.input_size, 2 + 2 * f.up_rate),
        conformer_att=rand(layers, rows, f.attention_heads, conformer_frames, 2 * f.head_dim),
        estimator_cnn=rand(c.n_timesteps, d.depth, 2 * rows, 2 * d.hidden_size, 2),
    )


def split(x: SplitInputs, batched: bool) -> None:
    store_small_caches(x.pool, x.slots, x.pairs, x.conformer_cnn, x.conformer_att, x.estimator_cnn, batched=batched)


def estimator_cnn_only(x: SplitInputs, batched: bool) -> None:
    dst = x.pool["estimator_cnn"]
    if batched:
        dst.index_copy_(2, x.pairs, x.estimator_cnn)
        return
    for half in range(x.pairs.shape[0]):
        dst.index_copy_(2, x.pairs[half : half + 1], x.estimator_cnn.narrow(2, half, 1))


def time_us(fn, device: torch.device, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    synchronize(device)
    if not is_cpu(device):
        start, end = timing_event(device), timing_event(device)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e6 / iters


def launches(fn, device: torch.device) -> int:
    """Device launches per call, memcpys included (kernels + copies; aten ops on CPU)."""
    count = count_launches(fn, device=device, repeats=1)
    return round(count.per_call + count.copies_per_call)


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = torch.float32
    rows_out = []
    for rows in args.batches:
        x = full_size_inputs(rows, args.conformer_frames, device, dtype)
        rec = {"B": rows}
        for label, op in (("split", split), ("ecnn", estimator_cnn_only)):
            for arm, batched in (("per_row", False), ("batched", True)):
                fn = functools.partial(op, x, batched)
                rec[f"{label}_{arm}_us"] = round(time_us(fn, device, args.iters, args.warmup), 2)
                rec[f"{label}_{arm}_launches"] = launches(fn, device)
            rec[f"{label}_speedup"] = round(rec[f"{label}_per_row_us"] / rec[f"{label}_batched_us"], 2)
        rows_out.append(rec)
        del x
    return {
        "bench": "code2wav_cache_split",
        "schema_version": 2,  # 2: stores into slot-pool tensors (1: split into new tensors)
        "device": device_name(device) or platform.processor() or "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "conformer_frames": args.conformer_frames,
        "iters": args.iters,
        "warmup": args.warmup,
        "launch_unit": "cuda_kernels" if is_cuda(device) else "cpu_aten_ops",
        "results": rows_out,
    }


def render(doc: dict) -> str:
    head = (
        f"{'B':>3} | {'split per-row us':>16} {'batched us':>10} {'x':>6} {'launches':>9} | "
        f"{'ecnn per-row us':>15} {'batched us':>10} {'x':>6} {'launches':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in doc["results"]:
        lines.append(
            f"{r['B']:>3} | {r['split_per_row_us']:>16.1f} {r['split_batched_us']:>10.1f} "
            f"{r['split_speedup']:>6.2f} {r['split_per_row_launches']:>4}->{r['split_batched_launches']:<3} | "
            f"{r['ecnn_per_row_us']:>15.1f} {r['ecnn_batched_us']:>10.1f} {r['ecnn_speedup']:>6.2f} "
            f"{r['ecnn_per_row_launches']:>4}->{r['ecnn_batched_launches']:<3}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if cuda_available() else "cpu")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 16])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument(
        "--conformer-frames", type=int, default=400, help="2*t1 of conformer_att (prompt 300 + keep 100)"
    )
    add_out(p)
    args = p.parse_args(argv)
    doc = run(args)
    print(
        f"# code2wav cache split | device {doc['device']} | torch {doc['torch']} | fp32 | "
        f"conformer_att frames {doc['conformer_frames']} | iters {doc['iters']} (+{doc['warmup']} warmup) "
        f"| launches = {doc['launch_unit']}"
    )
    print(render(doc))
    emit(doc, args.out, "bench_split")
    return 0


if __name__ == "__main__":
    sys.exit(main())
