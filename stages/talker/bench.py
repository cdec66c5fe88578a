"""Talker decode-step benchmark: ms per step and device kernels per step, by batch and prelude.

Full-size dims (or `--tiny`), seeded random weights, every request decoding for the whole
measurement (fixed `max_codes`). For decode graphs off/on (stage extra `talker_decode_graph`;
on is eager where the platform has no graphs), each prelude (eager reference, and whatever
`select_prelude(fused=True)` picks on this device) and each batch size B, after one discarded
pass that captures the graphs the timed pass needs:
prefill B requests, warm up, then time `--steps` engine steps (synchronize before each clock
read; `step()` itself reads the sampled ids back once per step), and count the device kernels
of one step with `torch.profiler`. Prints a header, a fixed-width table, and one JSON document as
the last stdout line; `--out DIR` also writes `DIR/talker_bench.json`.

    PYTHONPATH=. python3 -m stages.talker.bench --device cuda --out "$OUT"
    PYTHONPATH=. python3 -m stages.talker.bench --device cpu --tiny --batches 1,4 --steps 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from stages.platform.device import describe_device, dtype_from_name, resolve_device, synchronize
from stages.talker.config import TalkerConfig
from stages.talker.engine import TalkerEngine, TalkerRequest
from stages.talker.prelude import penalty_temperature_eager, select_prelude

TEXT = "The quick brown fox jumps over the lazy dog while the band plays on the river bank."


def tiny_config() -> TalkerConfig:
    return TalkerConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                        intermediate_size=128, llm_dim=64)


def kernels_per_step(engine: TalkerEngine, device: torch.device) -> int:
    """Device kernels (CUDA) or top-level aten ops (CPU) launched by one `step()`."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        engine.step()
        synchronize(device)
    if device.type == "cuda":
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and (
        e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def measure(engine: TalkerEngine, device, *, batch: int, steps: int, warmup: int) -> dict:
    budget = warmup + steps + 4
    for i in range(batch):
        engine.add(TalkerRequest(f"b{batch}-{i}", TEXT, seed=i, max_codes=budget))
    synchronize(device)
    t0 = time.perf_counter()
    engine.step()  # admits and prefills all B requests, samples code #0
    synchronize(device)
    prefill_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(warmup):
        engine.step()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    synchronize(device)
    step_ms = (time.perf_counter() - t0) * 1e3 / steps
    kernels = kernels_per_step(engine, device)
    for i in range(batch):
        engine.cancel(f"b{batch}-{i}")
    return {"batch": batch, "prefill_ms": prefill_ms, "step_ms": step_ms,
            "codes_per_s": batch * 1e3 / step_ms, "kernels_per_step": kernels}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device, dtype = resolve_device(args.device), dtype_from_name(args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    base = tiny_config() if args.tiny else TalkerConfig()
    rows = []
    for graph in (False, True):
        cfg = dataclasses.replace(base, extra={"talker_decode_graph": graph})
        engine = TalkerEngine(cfg, device=device, dtype=dtype, max_batch=max(batches),
                              max_seq_len=args.max_seq_len, prelude=penalty_temperature_eager)
        print(f"talker bench | {describe_device(device)} | {args.dtype} | {engine.describe()}")
        for name, prelude in (("eager", penalty_temperature_eager),
                              ("selected", select_prelude(fused=True, device=device))):
            engine.prelude = prelude
            for b in batches:
                # The first pass captures graphs / warms caches for every (rows, kv_len) bucket
                # the timed pass will meet; only the second pass is reported.
                measure(engine, device, batch=b, steps=args.steps, warmup=args.warmup)
                row = measure(engine, device, batch=b, steps=args.steps, warmup=args.warmup)
                rows.append({"decode_graph": engine.graphs is not None, "prelude": name,
                             "impl": prelude.__name__, **row})
        del engine
    print(f"{'graph':<6}{'prelude':<28}{'B':>5}{'prefill ms':>12}{'step ms':>10}"
          f"{'codes/s':>11}{'kernels':>9}")
    for r in rows:
        print(f"{str(r['decode_graph']):<6}{r['impl']:<28}{r['batch']:>5}"
              f"{r['prefill_ms']:>12.2f}{r['step_ms']:>10.3f}"
              f"{r['codes_per_s']:>11.0f}{r['kernels_per_step']:>9}")
    doc = {"schema": "talker-bench/1", "device": describe_device(device), "dtype": args.dtype,
           "config": "tiny" if args.tiny else "full", "max_seq_len": args.max_seq_len,
           "rows": rows}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "talker_bench.json").write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
