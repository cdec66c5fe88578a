"""Mel drift of reduced-precision code2wav against fp32, beside fp32's own seed-to-seed spread.

A precision change (TF32 matmuls, a bfloat16 DiT, the DiT's 3xTF32 GEMMs and attention) moves the mel a little; whether that matters
for the ear is judged against how much the mel moves anyway when only the CFM's noise changes
(same request, same weights, another noise seed): if a precision's drift is far below that
spread, it changes nothing a listener could attribute to it. Every variant decodes the same
streams (seeded random codes, steady 1 s chunks) with the same weights; the figure is the mean
absolute log-mel difference in dB (20 log10(e) x |delta ln|) over all frames and bins.

    PYTHONPATH=. python3 scripts/precision_drift.py --streams 4 --chunks 6          # H200
    PYTHONPATH=. python3 scripts/precision_drift.py --device cpu --tiny --chunks 3  # smoke

The last stdout line is one JSON document; a fixed-width table precedes it.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace

import torch

from scripts._report import add_out, emit
from scripts._stages import tiny_stages
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.streaming import Chunker
from stages.code2wav.token2wav import Token2Wav
from stages.platform import deterministic_kernels, resolve_device

DB_PER_NEPER = 20.0 / math.log(10.0)
# The reference: fp32 with cuBLAS's fp32 GEMMs and the small chunks' attention as cuBLAS GEMMs
# (the DiT's 3xTF32 GEMMs and Triton attention, both on by default, are variants).
FP32 = {"code2wav_dit_tf32x3": False, "code2wav_triton_attention": False}
VARIANTS = {  # name -> code2wav extra flags (on top of FP32)
    "3xTF32 DiT linears": {"code2wav_dit_tf32x3": True},
    "Triton attention (3xTF32)": {"code2wav_triton_attention": True},
    "default (both 3xTF32)": {"code2wav_dit_tf32x3": True, "code2wav_triton_attention": True},
    "tf32 flow": {"token2wav_allow_tf32": "flow"},
    "tf32 all": {"token2wav_allow_tf32": "all"},
    "bf16 DiT": {"code2wav_dit_dtype": "bfloat16"},
}


def decode_mels(cfg: Code2WavConfig, device: torch.device, streams: int, chunks: int, *, noise_seed: int | None = None) -> torch.Tensor:
    """[streams, 80, frames] mel of `streams` requests decoded together, chunk by chunk."""
    t2w = Token2Wav(cfg, device=device, dtype=torch.float32, init_seed=0, keep_mel=True, slots=streams)
    if noise_seed is not None:  # same weights, another CFM noise draw
        t2w.flow.decoder.init_noise(seed=noise_seed, device=device, dtype=torch.float32)
    gen = torch.Generator().manual_seed(123)
    payloads = []
    for r in range(streams):
        codes = torch.randint(0, cfg.flow.vocab_size, (chunks * cfg.codec_chunk_frames,), generator=gen)
        payloads.append(Chunker(cfg, f"drift-{r}", seed=r).push(codes.tolist()))
    mels = [[] for _ in range(streams)]
    for k in range(chunks):
        for r, out in enumerate(t2w.decode([p[k] for p in payloads])):
            mels[r].append(out.mel)
    for p in payloads:
        t2w.drop(p[0].request_id)
    return torch.stack([torch.cat(m, dim=1) for m in mels])


def l1_db(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().mean()) * DB_PER_NEPER


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=3, help="noise seeds for the fp32 spread")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tiny", action="store_true", help="the shipped tiny dims, configs/stages/minicpmo45-tiny.yaml (CPU smoke test)")
    add_out(ap)
    args = ap.parse_args()
    deterministic_kernels()  # as in the stage processes (runner.deterministic): replay == eager
    device = resolve_device(args.device)
    base = tiny_stages().code2wav if args.tiny else Code2WavConfig()
    base = replace(base, extra={**base.extra, **FP32})
    ref = decode_mels(base, device, args.streams, args.chunks)
    spread = [l1_db(ref, decode_mels(base, device, args.streams, args.chunks, noise_seed=1000 + s))
              for s in range(args.seeds)]
    rows = [{"variant": "fp32, other noise seed", "l1_db": sum(spread) / len(spread), "runs": spread}]
    for name, extra in VARIANTS.items():
        if device.type != "cuda" and ("tf32" in name.lower()):
            continue  # TF32 exists on CUDA only
        mel = decode_mels(replace(base, extra={**base.extra, **extra}), device, args.streams, args.chunks)
        rows.append({"variant": name, "l1_db": l1_db(ref, mel)})
    floor = rows[0]["l1_db"]
    for r in rows:
        r["vs_seed_spread"] = r["l1_db"] / floor if floor else float("nan")
        print(f"{r['variant']:28s} {r['l1_db']:9.4f} dB  ({r['vs_seed_spread']:.4f} x seed spread)", file=sys.stderr)
    doc = {"device": str(device), "streams": args.streams, "chunks": args.chunks, "rows": rows,
           "metric": "mean |delta log-mel| in dB vs fp32 (same weights, codes and noise)"}
    emit(doc, args.out, "precision_drift")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
