"""GPU check of the HiFT vocoder and the CAM++ speaker paths at full size (seeded weights).

Prints a header card, a small table, and one JSON document as the last stdout line; the same
JSON is written to `--out DIR` (default $OUT)/hift_speaker_gpu.json. Figures:
* HiFT: CUDA vs CPU max |diff| on one 58-frame chunk with a deterministic source (NSF alpha =
  sigma = 0), streaming sample counts on CUDA (first 20160, steady 24000), and per-chunk latency
  at batch 1 and 8 (CUDA events, warmup excluded).
* CAM++: device torch vs CPU onnxruntime max |diff| on the same weights, and latency of each.

    PYTHONPATH=. python3 scripts/gpu_hift_speaker.py
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from scripts._report import add_out, emit
from stages.code2wav.config import HiFTConfig, SpeakerConfig
from stages.code2wav.hift import HiFTGenerator, HiFTStream, fold_weight_norm
from stages.code2wav.speaker import SpeakerEmbedder
from stages.platform import device_name, live_tf32, resolve_device, synchronize, timing_event

WARMUP, ITERS = 3, 10


def device_ms(fn, dev: torch.device) -> float:
    """Device time of one call (device events around ITERS calls, after WARMUP untimed ones)."""
    for _ in range(WARMUP):
        fn()
    start, end = timing_event(dev), timing_event(dev)
    synchronize(dev)
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    synchronize(dev)
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
        out[f"hift_chunk58_b{rows}_ms"] = device_ms(lambda: gpu.inference(m, empty), dev)
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
        "campplus_device_ms": device_ms(lambda: on_dev.embed(fbank), dev),
        "campplus_onnx_cpu_ms": ort_ms,
        "tf32_conv": live_tf32(dev).cudnn,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out(ap)
    args = ap.parse_args(argv)
    dev = resolve_device("cuda")
    print(f"# hift + speaker on {device_name(dev)}, torch {torch.__version__}")
    result = {**hift_figures(dev), **speaker_figures(dev)}
    for key, value in result.items():
        print(f"{key:<40} {value:.6g}" if isinstance(value, float) else f"{key:<40} {value}")
    emit(result, args.out, "hift_speaker_gpu")


if __name__ == "__main__":
    main()
