"""Talker decode-step benchmark: ms per step and device kernels per step, by batch and prelude.

Full-size dims (or `--tiny`), seeded random weights, every request decoding for the whole
measurement (fixed `max_codes`). For device graphs off/on (stage extras `talker_decode_graph`
and `talker_prefill_graph` together, so `prefill ms`, admitting B requests in one step, reads
prefill graphs off/on; on is eager where the platform has no graphs), each prelude (eager
reference, and whatever `select_prelude(fused=True)` picks on this device) and each batch size B, after one discarded
pass that captures the graphs the timed pass needs: prefill B requests once, warm up, then time
`--reps` windows of `--steps` engine steps per prelude, the preludes alternating window by window
(A B, B A, ...) on the same running requests (synchronize before each clock read; `step()`
itself reads the sampled ids back once per step); report the median window per prelude, the
selected/eager ratio (median of per-repetition pairs), and the launches of one step
(`stages.profiling.launches.count_launches`: kernels + memcpys on CUDA, top-level non-view aten
operators on CPU). Timing the preludes one after another instead let host drift pose as a
prelude effect (the eager-mode step at B = 128 read 26.5 ms with one and 38.7 ms with the
other, run after it). Prints a header, a fixed-width table, and one JSON document as the last
stdout line; `--out DIR` (default `$OUT`) also writes `DIR/talker_bench.json`.
Deterministic kernels are on, as in the stage processes (`runner.deterministic`): CUDA takes
other index-write kernels under them, and a bench without them once hid a whole-cache copy per
layer from these figures (stages.platform.indexing).

    PYTHONPATH=. python3 scripts/bench_talker.py --device cuda --out "$OUT"
    PYTHONPATH=. python3 scripts/bench_talker.py --device cpu --tiny --batches 1,4 --steps 5
    PYTHONPATH=. python3 scripts/bench_talker.py --device cuda --extra talker_fused_layers=false
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from scripts._report import add_out, emit
from scripts._stages import tiny_stages
from stages.platform.device import (
    describe_device,
    deterministic_kernels,
    dtype_from_name,
    resolve_device,
    synchronize,
)
from stages.profiling.launches import count_launches
from stages.talker.config import TalkerConfig
from stages.talker.engine import TalkerEngine, TalkerRequest
from stages.talker.prelude import penalty_temperature_eager, select_prelude

TEXT = "The quick brown fox jumps over the lazy dog while the band plays on the river bank."


def tiny_config() -> TalkerConfig:
    """The shipped tiny stage config's talker (configs/stages/minicpmo45-tiny.yaml)."""
    return tiny_stages().talker


# Kernel names kept per cell in the JSON (most frequent first): where a step's launches go.
TOP_KERNELS = 40


def kernels_per_step(engine: TalkerEngine, device: torch.device) -> tuple[int, dict[str, float]]:
    """Launches of one `step()`: device kernels + memcpy/memset (CUDA), top-level non-view aten
    operators (CPU), and the TOP_KERNELS most frequent names with their counts. One profiled
    step, no warmup: the timed windows warmed it up."""
    count = count_launches(engine.step, device=device, repeats=1, warmup=0)
    top = dict(list(count.by_name.items())[:TOP_KERNELS])
    return int(count.per_call + count.copies_per_call), top


@dataclasses.dataclass
class Cell:
    """One (decode graph, prelude, B) measurement; step times per timed window."""

    decode_graph: bool
    prelude: str
    impl: str
    batch: int
    prefill_ms: float
    windows_ms: list[float]  # ms per step, one entry per timed window
    kernels_per_step: int
    kernels_by_name: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def step_ms(self) -> float:
        return statistics.median(self.windows_ms)

    def row(self) -> dict:
        return {"decode_graph": self.decode_graph, "prelude": self.prelude, "impl": self.impl,
                "batch": self.batch, "prefill_ms": self.prefill_ms, "step_ms": self.step_ms,
                "codes_per_s": self.batch * 1e3 / self.step_ms,
                "kernels_per_step": self.kernels_per_step, "kernels_by_name": self.kernels_by_name,
                "windows_ms": [round(x, 4) for x in self.windows_ms]}  # fmt: skip


def time_steps(engine: TalkerEngine, device, steps: int) -> float:
    """ms per `step()` over `steps` back-to-back steps (synchronized at both ends)."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3 / steps


def measure(engine: TalkerEngine, device, preludes: dict, *, batch: int, steps: int, warmup: int,
            reps: int) -> list[Cell]:
    """B requests decoding; windows of `steps` steps per prelude, round-robin (A B, B A, ...).

    All preludes share one prefill and one set of running requests, and alternate window by
    window with the order reversed every repetition, so host drift and the slowly growing KV
    length land on every prelude alike: their ratio is the measurement, not the cells' order.
    """
    names = list(preludes)
    budget = warmup + reps * len(names) * steps + 4
    for i in range(batch):
        engine.add(TalkerRequest(f"b{batch}-{i}", TEXT, seed=i, max_codes=budget))
    synchronize(device)
    t0 = time.perf_counter()
    engine.step()  # admits and prefills all B requests, samples code #0
    synchronize(device)
    prefill_ms = (time.perf_counter() - t0) * 1e3
    for name in names:
        engine.prelude = preludes[name]
        time_steps(engine, device, max(1, warmup // len(names)))
    windows: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in names if r % 2 == 0 else names[::-1]:
            engine.prelude = preludes[name]
            windows[name].append(time_steps(engine, device, steps))
    cells = []
    for name in names:
        engine.prelude = preludes[name]
        launches, by_name = kernels_per_step(engine, device)
        cells.append(Cell(decode_graph=engine.graphs is not None, prelude=name,
                          impl=preludes[name].__name__, batch=batch, prefill_ms=prefill_ms,
                          windows_ms=windows[name], kernels_per_step=launches,
                          kernels_by_name=by_name))  # fmt: skip
    for i in range(batch):
        engine.cancel(f"b{batch}-{i}")
    return cells


def ratios(cells: list[Cell]) -> list[dict]:
    """selected / eager step time per (decode graph, B): < 1 means the selected prelude is faster.

    Paired by repetition: window r of each prelude ran back to back, so each pair's ratio is
    free of the slow drift along the run (the KV length grows by every window; with decode
    graphs at B = 128 the step time rose ~60% from first to last window on an H200). The
    median of the pair ratios is the estimate; the ratio of the two medians is kept beside it.
    """
    by = {(c.decode_graph, c.batch, c.prelude): c for c in cells}
    out = []
    for (graph, batch, name), cell in by.items():
        eager = by.get((graph, batch, "eager"))
        if name == "eager" or eager is None:
            continue
        pairs = [a / b for a, b in zip(cell.windows_ms, eager.windows_ms, strict=True)]
        out.append({"decode_graph": graph, "batch": batch, "prelude": name,
                    "step_ratio_vs_eager": round(statistics.median(pairs), 4),
                    "pair_ratio_min": round(min(pairs), 4),
                    "pair_ratio_max": round(max(pairs), 4),
                    "ratio_of_medians": round(cell.step_ms / eager.step_ms, 4),
                    "kernels_saved": eager.kernels_per_step - cell.kernels_per_step})  # fmt: skip
    return out


def render(cells: list[Cell], compared: list[dict]) -> str:
    ratio = {(r["decode_graph"], r["batch"]): r["step_ratio_vs_eager"] for r in compared}
    lines = [f"{'graph':<6}{'prelude':<28}{'B':>5}{'prefill ms':>12}{'step ms':>10}"
             f"{'codes/s':>11}{'kernels':>9}{'vs eager':>10}"]  # fmt: skip
    for c in cells:
        vs = ratio.get((c.decode_graph, c.batch)) if c.prelude != "eager" else None
        lines.append(f"{str(c.decode_graph):<6}{c.impl:<28}{c.batch:>5}{c.prefill_ms:>12.2f}"
                     f"{c.step_ms:>10.3f}{c.batch * 1e3 / c.step_ms:>11.0f}"
                     f"{c.kernels_per_step:>9}{'' if vs is None else f'{vs:.3f}':>10}")  # fmt: skip
    return "\n".join(lines)


def parse_extras(pairs: list[str]) -> dict[str, str]:
    """`KEY=VALUE` strings -> stage extras (values parsed strictly by the engine's flags)."""
    extras = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --extra wants KEY=VALUE, got {pair!r}")
        extras[key.strip()] = value.strip()
    return extras


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed window")
    ap.add_argument("--reps", type=int, default=12, help="timed windows per prelude")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE",
                    help="talker stage extra for every engine, e.g. talker_fused_layers=false (repeatable)")
    add_out(ap)
    args = ap.parse_args(argv)
    extras = parse_extras(args.extra)
    deterministic_kernels()  # as in the stage processes (runner.deterministic): their kernels
    device, dtype = resolve_device(args.device), dtype_from_name(args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    base = tiny_config() if args.tiny else TalkerConfig()
    preludes = {"eager": penalty_temperature_eager,
                "selected": select_prelude(fused=True, device=device)}  # fmt: skip
    cells: list[Cell] = []
    for graph in (False, True):
        extra = {**extras, "talker_decode_graph": graph, "talker_prefill_graph": graph}
        cfg = dataclasses.replace(base, extra=extra)
        engine = TalkerEngine(cfg, device=device, dtype=dtype, max_batch=max(batches),
                              max_seq_len=args.max_seq_len, prelude=penalty_temperature_eager)
        if graph and engine.graphs is None:  # no graph API here: the same pass as graph off
            print(f"talker bench | decode graphs unavailable on {device.type}: one pass only")
            break
        print(f"talker bench | {describe_device(device)} | {args.dtype} | {engine.describe()}")
        for b in batches:
            # The first pass captures graphs / warms caches for every (rows, kv_len) bucket
            # the timed pass will meet; only the second pass is reported.
            opts = {"batch": b, "steps": args.steps, "warmup": args.warmup, "reps": args.reps}
            measure(engine, device, preludes, **opts)
            cells += measure(engine, device, preludes, **opts)
        del engine
    compared = ratios(cells)
    print(render(cells, compared))
    doc = {"schema": "talker-bench/2", "device": describe_device(device), "dtype": args.dtype,
           "config": "tiny" if args.tiny else "full", "max_seq_len": args.max_seq_len,
           "extra": extras,
           "steps_per_window": args.steps, "windows": args.reps, "timing": "round_robin",
           "rows": [c.row() for c in cells], "ratios": compared}  # fmt: skip
    emit(doc, args.out, "talker_bench")


if __name__ == "__main__":
    main()
