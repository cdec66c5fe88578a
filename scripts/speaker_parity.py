"""Speaker-embedding parity: CAM++ on the device (torch) against CPU onnxruntime, per prompt.

Seed item 2 switches where the speaker embedding of a reference voice is computed
(`token2wav_device_spk`); this reads every prompt wav of a seed-tts meta.lst through the same
front end the stages use (normalised to 6 s, 16 kHz Kaldi fbank) and reports, per prompt, the
largest absolute difference and the cosine similarity between the two paths' 192-d embeddings
(same weights: the seeded CAM++, or lifted from `<weights>/assets/token2wav/campplus.onnx`), plus
each path's time per embedding (median of `--reps`, device synchronized).

    PYTHONPATH=. python3 scripts/speaker_parity.py                         # builtin set, auto device
    PYTHONPATH=. python3 scripts/speaker_parity.py --meta my-set/meta.lst --device cuda --out $OUT

The last stdout line is one JSON document; a fixed-width table precedes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from scripts._report import add_out, emit
from stages.audio import decode_audio
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.mel import FbankConfig, kaldi_fbank, resample
from stages.code2wav.prompt import TOKENIZER_RATE, normalize_reference
from stages.code2wav.speaker import SpeakerEmbedder
from stages.platform import resolve_device, synchronize
from tts_bench.inputs.prompts import load_prompts


def _timed(fn, device: torch.device, reps: int) -> tuple[torch.Tensor, float]:
    out = fn()  # warm (graph export / kernels)
    times = []
    for _ in range(reps):
        synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1000.0)
    return out, statistics.median(times)


def parity(meta: str, device: torch.device, reps: int, weights: str | None) -> list[dict]:
    cfg = Code2WavConfig()
    on_device = SpeakerEmbedder(cfg.speaker, device=device, device_spk=True, weights_dir=weights)
    on_cpu = SpeakerEmbedder(cfg.speaker, device=device, device_spk=False, weights_dir=weights)
    rows, seen = [], set()
    for prompt in load_prompts(meta):
        if prompt.prompt_wav in seen:  # a voice used by several lines is measured once
            continue
        seen.add(prompt.prompt_wav)
        wav, rate = decode_audio(prompt.prompt_wav)
        wav24 = normalize_reference(torch.from_numpy(wav), rate, cfg, where=str(prompt.prompt_wav))
        fbank = kaldi_fbank(resample(wav24, cfg.sample_rate, TOKENIZER_RATE), FbankConfig(n_mels=cfg.speaker.fbank_bins))
        a, ms_device = _timed(lambda: on_device.embed(fbank), device, reps)
        b, ms_cpu = _timed(lambda: on_cpu.embed(fbank), device, reps)
        a, b = a.float().cpu(), b.float().cpu()
        rows.append({
            "utt": prompt.utt, "prompt_wav": prompt.prompt_wav.name,
            "max_abs": float((a - b).abs().max()),
            "cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
            "norm": float(a.norm()), "device_ms": ms_device, "onnxruntime_ms": ms_cpu,
        })
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meta", default="builtin:seed-tts-en")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--weights", default=None, help="official MiniCPM-o 4.5 directory (campplus.onnx)")
    add_out(ap)
    args = ap.parse_args()
    device = resolve_device(args.device)
    rows = parity(args.meta, device, args.reps, args.weights)
    unique = rows
    print(f"# CAM++ {device} torch vs CPU onnxruntime, {len(unique)} voices of {args.meta}", file=sys.stderr)
    print(f"{'voice':14s} {'max |diff|':>11s} {'cosine':>12s} {'device ms':>10s} {'ort ms':>8s}", file=sys.stderr)
    for r in unique:
        print(f"{r['prompt_wav']:14s} {r['max_abs']:11.3g} {r['cosine']:12.9f} {r['device_ms']:10.2f} "
              f"{r['onnxruntime_ms']:8.2f}", file=sys.stderr)
    doc = {"device": str(device), "torch": torch.__version__, "meta": args.meta, "voices": list(unique)}
    emit(doc, args.out, "speaker_parity")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
