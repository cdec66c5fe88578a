"""Per-call cost of the sampling prelude: eager chain vs fused Triton kernel vs the launch floor.

Measures, in ONE process, for B in {1, 8, 32, 128} rows of V = 6562 codec logits and a 16-slot
history (both from the talker config):
  eager        `penalty_temperature_eager` (14 small kernels on an H200, host-bound), called as
               the talker's sampler calls it: bound to slot buffers of 128 rows (`bind_prelude`),
               `step(logits)` for their first B rows, under torch.inference_mode()
  fused        the dispatcher's fused path (`select_prelude(fused=True)`: one Triton launch),
               bound and called the same way: exactly the sampler's call
  fused_alloc  the fused function called per call on [B] tensors without `out=` (each call
               allocates its [B, V] output); informational, not the acceptance
  eager_alloc  the eager function the same way; informational: shows how much of the
               eager/fused ratio the call form itself moves
  eager_graph  the eager chain captured once in a CUDA graph, replayed
  empty        an empty Triton kernel launched through `JITFunction[grid](...)`: the launch
               floor the acceptance criteria name (acceptance is judged against this one)
  empty_direct the same empty kernel launched through `CompiledKernel[grid](...)`: Triton's
               Python binder removed
  empty_raw    the same empty kernel through `triton_launch.direct_launch` (what the fused
               wrapper does after its first call: the C launcher called directly, no hook
               plumbing while no launch hook is registered): the floor of the fused path
Per call = median over `--reps` timed windows of `--inner` back-to-back calls (CUDA events on
CUDA, a wall clock on CPU), the impls of one B timed round-robin (window r of every impl, in an
order rotated by r) so host drift cancels out of the ratios; warmup calls are excluded; raw
window samples are kept in the JSON.
Kernels per call come from the torch profiler (CUDA kernel activities; CPU: aten operators).
The fused output is checked bit for bit against eager before anything is timed.

On CPU the fused/empty rows need TRITON_INTERPRET=1 (interpreter: correctness speed, not a
benchmark); without it they are skipped with a note. eager_graph needs a CUDA device.

    PYTHONPATH=. python3 scripts/bench_prelude.py --out results/bench   # table, then JSON line

Acceptance, evaluated per B on CUDA: fused >= 10x faster than eager, fused <= 1.5x
the empty kernel, exactly 1 kernel per fused call.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# Runnable as `python scripts/bench_prelude.py` from the repo root, PYTHONPATH or not.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts._report import add_out, emit
from stages.platform import (
    GraphAPI,
    cuda_available,
    device_name,
    graph_api,
    is_cpu,
    is_cuda,
    synchronize,
    timing_event,
)
from stages.platform.graphs import SideStreamCapture
from stages.profiling.launches import count_launches
from stages.talker import prelude
from stages.talker.config import SamplingConfig, TalkerConfig
from stages.talker.prelude import (
    bind_prelude,
    penalty_pow_table,
    penalty_temperature_eager,
    select_prelude,
)

SCHEMA = "tts-bench/bench-prelude/1"
MIN_SPEEDUP = 10.0  # fused vs eager, every B
MAX_FLOOR_RATIO = 1.5  # fused vs empty Triton kernel, every B
MAX_ROWS = 128  # the talker's max_batch at full size: rows of the sampler's prelude buffer
IMPLS = ("eager", "eager_alloc", "fused", "fused_alloc", "eager_graph", "empty", "empty_direct",
         "empty_raw")


@dataclass
class Cell:
    """One (implementation, batch) measurement."""

    impl: str
    batch: int
    us_per_call: float | None = None  # median over windows
    us_p10: float | None = None
    us_p90: float | None = None
    kernels_per_call: float | None = None
    launch_unit: str | None = None
    samples_us: list[float] = field(default_factory=list)  # per-call µs of each window
    note: str | None = None


def resolve_device(kind: str) -> torch.device:
    """auto|cuda|cpu, with errors that name this script's flag (stages.platform's name the
    stage config's key, and this script has no NPU kernel to time)."""
    if kind not in ("auto", "cuda", "cpu"):
        raise SystemExit(f"error: unknown device {kind!r} (--device); valid: auto, cuda, cpu")
    if kind == "auto":
        kind = "cuda" if cuda_available() else "cpu"
    if kind == "cuda" and not cuda_available():
        raise SystemExit("error: no CUDA device (--device cuda); use --device auto or cpu")
    return torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")


def make_inputs(batch: int, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    """Realistic decode-step inputs: full windows with repeats, talker default sampling."""
    vocab = TalkerConfig().num_audio_tokens
    sampling = SamplingConfig()
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=g) * 4.0
    window = sampling.history_window
    history = torch.randint(0, vocab, (batch, window), generator=g, dtype=torch.int32)
    history[:, window // 2 :] = history[:, : window - window // 2]  # repeats: counts of 2
    history_len = torch.full((batch,), window, dtype=torch.int32)
    table = penalty_pow_table(sampling.repetition_penalty, window)
    pow_table = table.expand(batch, -1).contiguous()
    temperature = torch.full((batch,), sampling.temperature)
    tensors = (logits, history, history_len, pow_table, temperature)
    return tuple(t.to(device) for t in tensors)


def time_interleaved(fns: dict[str, Callable[[], object]], inner: dict[str, int],
                     device: torch.device, *, reps: int, warmup: int) -> dict[str, list[float]]:
    """Per-call µs of `reps` windows per impl, `inner[name]` back-to-back calls each.

    Round-robin: repetition r times every impl once, in an order rotated by r, so a drift of
    the host (other tenants, clocks) lands on all impls alike. Timing them one block after
    another let such a drift pose as a ratio: on an H200 the fused/empty ratio at B = 32 read
    1.71 in one run and 1.02 in another, in a run whose eager row read 306-321 us at B = 8 and
    32 but 192 us at B = 128.
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    synchronize(device)
    events = not is_cpu(device)  # device events on a device, the host's wall clock on CPU
    marks: dict[str, list] = {name: [] for name in names}
    for r in range(reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn, n = fns[name], inner[name]
            if events:
                start, end = timing_event(device), timing_event(device)
                start.record()
                for _ in range(n):
                    fn()
                end.record()
                marks[name].append((start, end))
            else:
                t0 = time.perf_counter_ns()
                for _ in range(n):
                    fn()
                marks[name].append((time.perf_counter_ns() - t0) / 1e3)
    synchronize(device)
    if not events:
        return {name: [us / inner[name] for us in marks[name]] for name in names}
    return {name: [a.elapsed_time(b) * 1e3 / inner[name] for a, b in marks[name]]
            for name in names}  # fmt: skip


def slot_buffers(args: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """The sampler's slot buffers (MAX_ROWS rows, allocated once) with `args` in the first rows."""
    rows = args[0].shape[0]
    slots = max(rows, MAX_ROWS)
    state = {}
    for name, t in zip(("history", "history_len", "pow_table", "temperature"), args[1:],
                       strict=True):  # fmt: skip
        state[name] = t.new_zeros((slots, *t.shape[1:]))
        state[name][:rows] = t
    state["out"] = args[0].new_empty((slots, args[0].shape[1]))
    return state


def build_impls(device: torch.device, args: tuple[torch.Tensor, ...]) -> tuple[dict, dict]:
    """name -> zero-arg callable, and name -> note for the ones that cannot run here."""
    logits, state = args[0], slot_buffers(args)
    eager = bind_prelude(penalty_temperature_eager, **state)
    impls: dict[str, Callable[[], object]] = {
        "eager": lambda: eager(logits),
        "eager_alloc": lambda: penalty_temperature_eager(*args),
    }
    notes: dict[str, str] = {}
    fused = select_prelude(fused=True, device=device)
    if fused is prelude.penalty_temperature_fused:
        fused_step = bind_prelude(fused, **state)
        impls["fused"] = lambda: fused_step(logits)
        impls["fused_alloc"] = lambda: fused(*args)
        from stages.talker.prelude_triton import _empty_kernel
        from stages.platform.triton_launch import direct_launch, kernel_for

        empty = kernel_for(_empty_kernel, device)
        impls["empty"] = lambda: empty[(1,)](args[0])
        compiled = empty[(1,)](args[0])  # JITFunction.run returns the CompiledKernel
        if not is_cpu(device) and callable(getattr(compiled, "__getitem__", None)):
            impls["empty_direct"] = lambda: compiled[(1, 1, 1)](args[0])
            raw = direct_launch(compiled)
            impls["empty_raw"] = lambda: raw(1, 1, 1, args[0])
        else:
            notes["empty_direct"] = notes["empty_raw"] = "needs a compiled (device) kernel"
    else:
        why = "no fused path here (CPU needs TRITON_INTERPRET=1, or triton is missing)"
        for impl in ("fused", "fused_alloc", "empty", "empty_direct", "empty_raw"):
            notes[impl] = why
    api = graph_api(device)
    if api is not None:
        impls["eager_graph"] = capture_eager(api, args)
    else:
        notes["eager_graph"] = "needs a CUDA device"
    return impls, notes


def capture_eager(api: GraphAPI, args: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    """Capture the eager chain once on static inputs, as the stages capture (warmed up on a side
    stream that first waits for the inputs' stream); the callable replays it."""
    graph, _ = SideStreamCapture(api).capture(lambda: penalty_temperature_eager(*args))
    return graph.replay


def check_bit_exact(impls: dict, device: torch.device, args: tuple[torch.Tensor, ...]
                    ) -> bool | None:
    """Fused == eager bit for bit on these inputs (exits otherwise); None: no fused path."""
    if "fused" not in impls:
        return None
    fused, fused_alloc = impls["fused"]().clone(), impls["fused_alloc"]()
    eager = penalty_temperature_eager(*args)
    synchronize(device)
    bits = eager.view(torch.int32)
    same = all(torch.equal(x.view(torch.int32), bits) for x in (fused, fused_alloc))
    # After a failed launch the process latch drops every fused call to eager: ask again.
    still_fused = select_prelude(fused=True, device=device) is prelude.penalty_temperature_fused
    if not same or not still_fused:
        raise SystemExit("error: fused prelude is not bit-exact with eager here (bench_prelude)")
    return True


def window_plan(fn: Callable[[], object], device: torch.device, opts: argparse.Namespace
                ) -> tuple[int, int]:
    """(inner, reps) for one impl: the options on a device; on CPU (possibly the interpreter,
    ~35 ms a call) shrunk to fit `--cpu-budget-s` per cell."""
    if not is_cpu(device):
        return opts.inner, opts.reps
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    inner = max(1, min(opts.inner, int(opts.cpu_budget_s / 10 / one)))
    return inner, max(3, min(opts.reps, int(opts.cpu_budget_s / (one * inner))))


def measure_batch(impls: dict[str, Callable[[], object]], batch: int, device: torch.device,
                  opts: argparse.Namespace) -> list[Cell]:
    """One Cell per impl at `batch`, timed interleaved (see `time_interleaved`)."""
    plans = {name: window_plan(fn, device, opts) for name, fn in impls.items()}
    reps = min(r for _, r in plans.values())
    inner = {name: i for name, (i, _) in plans.items()}
    warmup = opts.warmup if not is_cpu(device) else min(opts.warmup, *inner.values())
    samples = time_interleaved(impls, inner, device, reps=reps, warmup=warmup)
    cells = []
    for name, fn in impls.items():
        xs = samples[name]
        q = statistics.quantiles(xs, n=10) if len(xs) >= 2 else [xs[0]] * 9
        launches = count_launches(fn, device=device, repeats=3)
        cells.append(Cell(impl=name, batch=batch, us_per_call=statistics.median(xs), us_p10=q[0],
                          us_p90=q[-1], kernels_per_call=launches.per_call,
                          launch_unit=launches.unit, samples_us=[round(x, 3) for x in xs]))
    return cells


def acceptance(cells: list[Cell], device: torch.device) -> dict:
    """Issue-4 criteria per batch; only meaningful on CUDA (None elsewhere)."""
    by = {(c.impl, c.batch): c for c in cells}
    rows = {}
    for batch in sorted({c.batch for c in cells}):
        eager, fused, fused_alloc, empty, direct, raw = (
            by.get((i, batch))
            for i in ("eager", "fused", "fused_alloc", "empty", "empty_direct", "empty_raw")
        )
        if not (fused and fused.us_per_call and empty and empty.us_per_call):
            continue
        speedup = eager.us_per_call / fused.us_per_call
        floor_ratio = fused.us_per_call / empty.us_per_call
        rows[str(batch)] = {
            "speedup_vs_eager": round(speedup, 2),
            "ratio_to_empty_kernel": round(floor_ratio, 3),
            "ratio_to_empty_direct": round(fused.us_per_call / direct.us_per_call, 3)
            if direct and direct.us_per_call else None,
            "ratio_to_empty_raw": round(fused.us_per_call / raw.us_per_call, 3)
            if raw and raw.us_per_call else None,
            "fused_alloc_speedup_vs_eager": round(eager.us_per_call / fused_alloc.us_per_call, 2)
            if fused_alloc and fused_alloc.us_per_call else None,
            "fused_kernels_per_call": fused.kernels_per_call,
            "pass": speedup >= MIN_SPEEDUP and floor_ratio <= MAX_FLOOR_RATIO
            and fused.kernels_per_call == 1.0,
        }
    applies = is_cuda(device) and bool(rows)
    return {"applies": applies, "criteria": {"min_speedup": MIN_SPEEDUP,
            "max_ratio_to_empty": MAX_FLOOR_RATIO, "fused_kernels_per_call": 1},
            "per_batch": rows, "pass": all(r["pass"] for r in rows.values()) if applies else None}


def environment(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "device": str(device), "triton": None, "triton_interpret": None}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # no triton: the fused rows are skipped with a note
        pass
    info["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    name = device_name(device)
    if name is not None:
        info["device_name"] = name
    else:
        info["torch_threads"] = torch.get_num_threads()
    return info


def render_table(cells: list[Cell], batches: list[int]) -> str:
    by = {(c.impl, c.batch): c for c in cells}

    def us(impl, b):
        c = by.get((impl, b))
        return f"{c.us_per_call:10.2f}" if c and c.us_per_call is not None else f"{'-':>10}"

    def k(impl, b):
        c = by.get((impl, b))
        return f"{c.kernels_per_call:g}" if c and c.kernels_per_call is not None else "-"

    head = (f"{'B':>5} {'eager us':>10} {'e+alloc us':>10} {'fused us':>10} {'f+alloc us':>10} {'graph us':>10} "
            f"{'empty us':>10} {'direct us':>10} {'raw us':>10} {'x eager':>8} {'/ empty':>8}"
            f"  kernels e/f/g")
    lines = [head, "-" * len(head)]
    for b in batches:
        e, f, m = (getattr(by.get((i, b)), "us_per_call", None)
                   for i in ("eager", "fused", "empty"))
        speed = f"{e / f:8.1f}" if e and f else f"{'-':>8}"
        ratio = f"{f / m:8.2f}" if f and m else f"{'-':>8}"
        lines.append(f"{b:>5} {us('eager', b)} {us('eager_alloc', b)} {us('fused', b)} {us('fused_alloc', b)} "
                     f"{us('eager_graph', b)} {us('empty', b)} {us('empty_direct', b)} "
                     f"{us('empty_raw', b)} {speed} {ratio}  "
                     f"{k('eager', b)}/{k('fused', b)}/{k('eager_graph', b)}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,8,32,128", help="comma-separated row counts")
    p.add_argument("--device", default="auto", help="auto|cuda|cpu")
    p.add_argument("--reps", type=int, default=200, help="timed windows per cell")
    p.add_argument("--inner", type=int, default=20, help="back-to-back calls per window")
    p.add_argument("--warmup", type=int, default=50, help="untimed calls before each cell")
    p.add_argument("--cpu-budget-s", type=float, default=2.0, help="CPU: seconds per cell")
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="CPU: torch intra-op threads (1 = stable numbers on a shared machine)")
    p.add_argument("--seed", type=int, default=0)
    add_out(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    device = resolve_device(opts.device)
    if is_cpu(device):
        torch.set_num_threads(opts.cpu_threads)
    batches = [int(b) for b in opts.batches.split(",")]
    env = environment(device)
    print(f"bench_prelude | {env.get('device_name', device)} | torch {env['torch']} | "
          f"triton {env['triton']} | V={TalkerConfig().num_audio_tokens} "
          f"W={SamplingConfig().history_window} | reps={opts.reps} inner={opts.inner}")
    cells, notes, exact = [], {}, {}
    for batch in batches:
        args = make_inputs(batch, device, opts.seed + batch)
        impls, skipped = build_impls(device, args)  # buffers built as the engine builds them
        notes.update(skipped)
        # inference_mode: the talker's decode step runs under it (cheaper views and dispatch).
        with torch.inference_mode():
            exact[str(batch)] = check_bit_exact(impls, device, args)
            timed = {c.impl: c for c in measure_batch(impls, batch, device, opts)}
        for impl in IMPLS:
            cell = timed.get(impl) or Cell(impl=impl, batch=batch, note=skipped.get(impl))
            cells.append(cell)
            if cell.us_per_call is not None:
                print(f"  B={batch:<4} {impl:<12} {cell.us_per_call:10.2f} us/call", file=sys.stderr)
    print(render_table(cells, batches))
    for impl, why in sorted(notes.items()):
        print(f"note: {impl}: {why}")
    doc = {"schema": SCHEMA, "env": env, "timer": "cuda_events" if is_cuda(device)
           else "wall_clock", "config": {k: (str(v) if isinstance(v, Path) else v)
           for k, v in vars(opts).items()}, "bit_exact": exact,
           "acceptance": acceptance(cells, device), "notes": notes,
           "cells": [asdict(c) for c in cells]}
    emit(doc, opts.out, "bench_prelude")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
