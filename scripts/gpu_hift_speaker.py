"""GPU check of the HiFT vocoder and the CAM++ speaker paths at full size (seeded weights).

Prints a header card, a small table, and one JSON document as the last stdout line; the same
JSON is written to $OUT/hift_speaker_gpu.json when $OUT is set. Figures:
* HiFT: CUDA vs CPU max |diff| on one 58-frame chunk with a deterministic source (NSF alpha =
  sigma = 0), streaming sample counts on CUDA (first 20160, steady 24000), and per-chunk latency
  at batch 1 and 8 (CUDA events, warmup excluded).
* CAM++: device torch vs CPU onnxruntime max |diff| on the same weights, and latency of each.

    PYTHONPATH=. python3 scripts/gpu_hift_speaker.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from stages.code2wav.config import HiFTConfig, SpeakerConfig
from stages.code2wav.hift import HiFTGenerator, HiFTStream, fold_weight_norm
from stages.code2wav.speaker import SpeakerEmbedder

WARMUP, ITERS = 3, 10


def cuda_ms(fn) -> float:
    for _ in range(WARMUP):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / ITERS


def hift_figures(dev: torch.device) -> dict:
    cfg = dataclasses.replace(HiFTConfig(), nsf_alpha=0.0, nsf_sigma=0.0)
    torch.manual_seed(0)
    cpu = HiFTGenerator(cfg).eval()
    fold_weight_norm(cpu)
    gpu = HiFTGenerator(cfg).eval()
    fold_weight_norm(gpu)
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.to(dev)
    gpu.init_buffers()
    mel = torch.randn(1, 80, 58)
    a, _ = cpu.inference(mel, torch.zeros(1, 1, 0))
    b, _ = gpu.inference(mel.to(dev), torch.zeros(1, 1, 0, device=dev))
    stream = HiFTStream(cfg)
    first, states = stream.decode(gpu, torch.randn(1, 80, 50, device=dev), [None], [False])
    steady, _ = stream.decode(gpu, torch.randn(1, 80, 50, device=dev), states, [False])
    out = {
        "hift_cuda_vs_cpu_max_abs_diff": float((b.cpu() - a).abs().max()),
        "hift_first_chunk_samples": first[0].numel(),
        "hift_steady_chunk_samples": steady[0].numel(),
    }
    for rows in (1, 8):
        m = torch.randn(rows, 80, 58, device=dev)
        empty = torch.zeros(rows, 1, 0, device=dev)
        out[f"hift_chunk58_b{rows}_ms"] = cuda_ms(lambda: gpu.inference(m, empty))
    return out


def speaker_figures(dev: torch.device) -> dict:
    fbank = torch.randn(598, 80, generator=torch.Generator().manual_seed(0))  # 6 s of frames
    on_dev = SpeakerEmbedder(SpeakerConfig(), device=dev)
    on_cpu = SpeakerEmbedder(SpeakerConfig(), device=dev, device_spk=False)
    diff = float((on_dev.embed(fbank) - on_cpu.embed(fbank)).abs().max())
    t0 = time.perf_counter()
    for _ in range(ITERS):
        on_cpu.embed(fbank)
    ort_ms = (time.perf_counter() - t0) * 1000 / ITERS
    return {
        "campplus_device_vs_onnx_max_abs_diff": diff,
        "campplus_device_ms": cuda_ms(lambda: on_dev.embed(fbank)),
        "campplus_onnx_cpu_ms": ort_ms,
        "tf32_conv": torch.backends.cudnn.allow_tf32,
    }


def main() -> None:
    dev = torch.device("cuda")
    print(f"# hift + speaker on {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    result = {**hift_figures(dev), **speaker_figures(dev)}
    for key, value in result.items():
        print(f"{key:<40} {value:.6g}" if isinstance(value, float) else f"{key:<40} {value}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "hift_speaker_gpu.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
