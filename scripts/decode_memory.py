"""Peak transient memory of one steady-state `Token2Wav.decode` of B rows.

Streams B requests until their estimator caches are saturated (prompt + prompt_keep_frames),
then measures the next decode's peak of live allocator bytes above what was live before it
(`torch.profiler` memory events on CPU, the allocator's peak on CUDA). The caches live in the
replica's slot pool, so a decode only adds its activations and one Euler step's attention
buffers (the gathered rows and the step buffer, each about B * A / n_timesteps), where
`A` = one request's estimator_att bytes. Each record also gives A per mel frame of the saturated
cache (`att_bytes_per_frame`; the spec's figure for the full-size DiT in fp32 is
10 steps x 16 blocks x K|V x 8 heads x 128 x 4 B = 1.25 MiB).

    PYTHONPATH=. python3 scripts/decode_memory.py --rows 4 --dit full       # CPU, ~1 min
    PYTHONPATH=. python3 scripts/decode_memory.py --rows 8 --device cuda --dit full --full
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from scripts._report import add_out, emit
from stages.code2wav.config import (
    Code2WavConfig,
    DiTConfig,
    FlowEncoderConfig,
    HiFTConfig,
)
from stages.code2wav.token2wav import Token2Wav
from stages.platform import is_cpu, memory_stats, reset_peak_memory, synchronize
from stages.profiling.code2wav_step import prepare_streams, steady_start


def peak_bytes(fn, device: torch.device) -> int:
    """Peak live bytes above those live before `fn` on `device` (an accelerator: the allocator's
    peak counter; CPU: profiler memory events, where frees of blocks allocated before `fn` are
    not seen, so the CPU figure is an upper bound by at most those blocks)."""
    if not is_cpu(device):
        synchronize(device)
        reset_peak_memory(device)
        base = memory_stats(device)["allocated_bytes"]
        fn()
        synchronize(device)
        return memory_stats(device)["peak_bytes"] - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events = [e for e in events if e.device_type().name.lower() == "cpu"]
    cur = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


def build_config(dit: str, full: bool) -> Code2WavConfig:
    if full:
        return Code2WavConfig()
    flow = FlowEncoderConfig(input_size=32, attention_heads=2, linear_units=64, num_blocks=2, num_up_blocks=1)
    small = DiTConfig(hidden_size=32, depth=2, num_heads=2, head_dim=16)
    hift = HiFTConfig(base_channels=16, f0_predictor_channels=16)
    return Code2WavConfig(flow=flow, dit=DiTConfig() if dit == "full" else small, hift=hift)


def measure(cfg: Code2WavConfig, *, rows: int, device: torch.device) -> dict:
    # Eager decodes: the transient measured here is the eager one (with graphs on, the first decode
    # of a shape would also capture, and its pool would count as transient).
    cfg = replace(cfg, extra={**cfg.extra, "code2wav_device_graph": False})
    t2w = Token2Wav(cfg, device=device, dtype=torch.float32, init_seed=0, slots=rows)
    start = steady_start(cfg)  # chunks before the caches are saturated (prompt + keep frames)
    streams = prepare_streams(cfg, rows, start + 1, "memory")
    for step in range(start):
        t2w.decode([s[step] for s in streams])
    att = t2w.pool["estimator_att"]  # [n_t, depth, 2S, H, F, 2D]
    per_request = 2 * att[:, :, 0].numel() * att.element_size()
    frames = t2w._requests[streams[0][0].request_id].caches.estimator_len
    assert frames == att.shape[4], "the caches are saturated"
    batch = [s[start] for s in streams]
    peak = peak_bytes(lambda: t2w.decode(batch), device)
    return {
        "rows": rows,
        "att_cache_shape": [att.shape[0], att.shape[1], 2, *att.shape[3:]],
        "att_bytes_per_request": per_request,
        "att_frames": frames,
        "att_bytes_per_frame": per_request // frames,
        "att_mib_per_frame": round(per_request / frames / 2**20, 4),
        "peak_bytes": peak,
        "peak_over_B_times_A": round(peak / (rows * per_request), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--dit", choices=("tiny", "full"), default="full")
    ap.add_argument("--full", action="store_true", help="full-size encoder and HiFT too")
    ap.add_argument("--device", default="cpu")
    add_out(ap)
    args = ap.parse_args()
    cfg = replace(build_config(args.dit, args.full))
    device = torch.device(args.device)
    emit({"results": [measure(cfg, rows=args.rows, device=device)]}, args.out, "decode_memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
