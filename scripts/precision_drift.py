"""Each code2wav precision mode against the fp32 reference decoder, on the same codes, voice and noise.

The reference is the official token2wav modules (minicpmo-utils 1.0.7, `tts_bench.reference.official`)
with the project's weights, in fp32 on the CPU, where they import; else the project's own strict
fp32 path on the CPU (`--reference project` asks for it); the output says which. Every mode decodes
`--streams` requests together, chunk by chunk, on `--device` with the project's `Token2Wav`
(init_seed 0: the same weights and CFM noise buffer as the reference); the reference decodes each
request alone (the official flow takes one request). Audio: each mode's mel through the project's
HiFT (under the mode's TF32 setting) with the reference's NSF source, against the official HiFT
on the reference mel (the project draws its NSF noise in another element order, so a shared
source is what makes the audio comparable; see `fidelity.vocode_project`).

Figures per mode (`tts_bench.reference.fidelity`): max |delta mel|, mel SNR (dB), mel log-spectral
distance, max |delta wav|, audio SNR and log-spectral distance (dB); a mode below 60 dB mel SNR
is labelled lossy. The CPU runs fp32 and the bf16 DiT; the TF32 and 3xTF32 modes are CUDA's.

    PYTHONPATH=. python3 scripts/precision_drift.py --streams 4 --chunks 6                    # H200
    PYTHONPATH=. python3 scripts/precision_drift.py --device cpu --tiny --out results/cpu     # seconds

The last stdout line is one JSON document; a fixed-width table precedes it on stderr, and with
`--out` a markdown table lands beside the JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from scripts._report import add_out, emit
from scripts._stages import tiny_stages
from stages.code2wav.config import Code2WavConfig
from stages.precision import region_scope
from stages.code2wav.token2wav import Token2Wav
from stages.platform import deterministic_kernels, is_cuda, resolve_device
from tts_bench.reference import fidelity as fd
from tts_bench.reference.official import build_official, official_available

# The project's fp32 path: cuBLAS/CPU fp32 GEMMs, attention as torch's (the DiT's 3xTF32 GEMMs and
# Triton attention, on by default on CUDA, are modes below).
FP32 = {"code2wav_dit_tf32x3": False, "code2wav_triton_attention": False, "token2wav_allow_tf32": "off"}
MODES = {  # name -> code2wav extra flags (on top of FP32)
    "fp32": {},
    "3xTF32 DiT linears": {"code2wav_dit_tf32x3": True},
    "Triton attention (3xTF32)": {"code2wav_triton_attention": True},
    "default with cuDNN convs": {"code2wav_dit_tf32x3": True, "code2wav_triton_attention": True,
                             "code2wav_conv_gemm": False},
    # With the linears 3xTF32, the DiT's causal convs are 3xTF32 GEMMs too (D-DIT-8).
    "default (both 3xTF32)": {"code2wav_dit_tf32x3": True, "code2wav_triton_attention": True},
    # The opt-in HiFT conv GEMMs (code2wav_hift_conv_gemm) on top of the default.
    "default + HiFT conv GEMMs": {"code2wav_dit_tf32x3": True, "code2wav_triton_attention": True,
                                  "code2wav_hift_conv_gemm": True},
    "tf32 conv (cuDNN only)": {"token2wav_allow_tf32": "conv"},
    "tf32 flow": {"token2wav_allow_tf32": "flow"},
    "tf32 all": {"token2wav_allow_tf32": "all"},
    "bf16 DiT": {"code2wav_dit_dtype": "bfloat16"},
}
CUDA_ONLY = ("3xTF32 DiT linears", "Triton attention (3xTF32)", "default with cuDNN convs", "default (both 3xTF32)", "tf32 conv (cuDNN only)", "tf32 flow",
             "tf32 all")
RAN = ("tf32_mode", "dit_dtype", "dit_gemm", "dit_attention", "dit_norm", "dit_conv", "dit_conv_gemm")  # describe() facts kept


def request_codes(cfg: Code2WavConfig, streams: int, chunks: int) -> list[list[int]]:
    """Seeded random codes: `chunks` full chunks and a 7-code tail per request."""
    gen = torch.Generator().manual_seed(123)
    n = chunks * cfg.codec_chunk_frames + 7
    return [torch.randint(0, cfg.flow.vocab_size, (n,), generator=gen).tolist() for _ in range(streams)]


def reference(cfg: Code2WavConfig, codes: list[list[int]], which: str) -> dict:
    """The reference mels and audio (CPU, fp32), one request at a time, and what it was."""
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True)
    official = None if which == "project" else build_official(cfg, init="project", project=t2w)
    mels, wavs, sources = [], [], []
    for r, stream in enumerate(codes):
        payloads = fd.stream_payloads(cfg, stream, f"ref-{r}", seed=r)
        if official is not None:
            mel = fd.official_mel(official, t2w, payloads)
            wav, source = fd.vocode_official(official, mel, seed=r)
        else:
            mel = fd.project_mels(t2w, [payloads])[0]
            wav, source = _project_vocode_with_source(t2w, mel, seed=r)
        mels.append(mel), wavs.append(wav), sources.append(source)
    name = ("official minicpmo-utils 1.0.7 modules, project weights, CPU fp32" if official is not None
            else "project strict fp32 path (Token2Wav, CPU)")
    return {"name": name, "official": official is not None, "mels": mels, "wavs": wavs, "sources": sources}


@torch.inference_mode()
def _project_vocode_with_source(t2w: Token2Wav, mel: torch.Tensor, seed: int):
    """The project's HiFT with its source drawn from the global RNG seeded with `seed`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        audio, source = t2w.hift.inference(mel[None], mel.new_zeros(1, 1, 0))
    return audio[0], source


def run_mode(cfg: Code2WavConfig, device: torch.device, codes: list[list[int]], ref: dict) -> dict:
    t2w = Token2Wav(cfg, device=device, dtype=torch.float32, init_seed=0, keep_mel=True, slots=len(codes))
    streams = [fd.stream_payloads(cfg, c, f"mode-{r}", seed=r) for r, c in enumerate(codes)]
    mels = fd.project_mels(t2w, streams)
    with region_scope(t2w.options.tf32_mode, device, region="hift"):
        wavs = [fd.vocode_project(t2w.hift, m, s) for m, s in zip(mels, ref["sources"])]
    dev = fd.deviation(torch.cat(ref["mels"], dim=1), torch.cat(mels, dim=1),
                       torch.cat(ref["wavs"]), torch.cat(wavs))
    facts = t2w.describe()
    return {**dev.as_dict(), "ran": {k: facts[k] for k in RAN if k in facts}}


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def table(rows: list[dict]) -> list[str]:
    head = "| mode | max abs Δmel | mel SNR (dB) | mel LSD (dB) | max abs Δwav | audio SNR (dB) | LSD (dB) | lossy |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['mode']} | skipped: {r['skipped']} | | | | | | |")
            continue
        cells = [_fmt(r[k]) for k in ("max_abs_mel", "mel_snr_db", "mel_lsd_db", "max_abs_wav", "wav_snr_db", "lsd_db")]
        lines.append(f"| {r['mode']} | " + " | ".join(cells) + f" | {'lossy' if r['lossy'] else 'no'} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=6, help="full 25-code chunks per request (plus a 7-code tail)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tiny", action="store_true", help="the shipped tiny dims, configs/stages/minicpmo45-tiny.yaml")
    ap.add_argument("--reference", choices=("auto", "official", "project"), default="auto",
                    help="auto: the official modules where they import, else the project's strict fp32 path")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    ap.add_argument("--name", default=None, help="output file stem (default precision_drift_<reference>_<dims>)")
    add_out(ap)
    args = ap.parse_args()
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    deterministic_kernels()  # as in the stage processes (runner.deterministic): replay == eager
    device = resolve_device(args.device)
    why = official_available()
    if args.reference == "official" and why is not None:
        print(why, file=sys.stderr)
        return 2
    which = "project" if args.reference == "project" or why is not None else "official"
    base = tiny_stages().code2wav if args.tiny else Code2WavConfig()
    base = replace(base, extra={**base.extra, **FP32})
    codes = request_codes(base, args.streams, args.chunks)
    ref = reference(base, codes, which)
    rows = []
    for name in args.modes.split(","):
        if name in CUDA_ONLY and not is_cuda(device):
            rows.append({"mode": name, "skipped": f"CUDA only (device {device.type})"})
            continue
        cfg = replace(base, extra={**base.extra, **MODES[name]})
        rows.append({"mode": name, **run_mode(cfg, device, codes, ref)})
    dims = "tiny" if args.tiny else "full"
    doc = {"reference": ref["name"], "reference_is_official": ref["official"],
           "reference_fallback_reason": None if which == "official" else (why or "--reference project"),
           "device": str(device), "dims": dims, "streams": args.streams, "chunks": args.chunks,
           "lossy_below_mel_snr_db": fd.LOSSY_MEL_SNR_DB, "torch": torch.__version__, "rows": rows,
           "method": "same weights, codes, voice (default prompt) and CFM noise; audio = each mode's mel "
                     "through the project's HiFT with the reference's NSF source"}
    lines = [f"Reference: {ref['name']}. Device: {device}. Dims: {dims}, {args.streams} requests x "
             f"{args.chunks} chunks + a 7-code tail. Lossy: mel SNR below {fd.LOSSY_MEL_SNR_DB:g} dB.",
             "Audio: each mode's mel through the project's HiFT with the reference's NSF source. "
             "Random weights (scale-keeping, D-INIT-1): the mel is noise-like and reaches the audio.", "",
             *table(rows)]
    print("\n".join(lines), file=sys.stderr)
    name = args.name or f"precision_drift_{which}_{dims}"
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, f"{name}.md").write_text("\n".join(lines) + "\n")
    emit(doc, args.out, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
