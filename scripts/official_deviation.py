"""How far the project's code2wav sits from the official modules' formulation on the CPU in fp32.

Same weights (the project's, copied into the official modules), same codes, voice and CFM noise.
Measured, each as max |delta| (and SNR where it is a signal):
* pieces: the DiT's `modulate` / `gated` (one `addcmul` each) against upstream's
  `x * (1 + scale) + shift` / `x + gate * y`, and `hift.istft` against `torch.istft`, on random
  data at the config's widths;
* one DiT estimator call (official `DiT.forward` against `DiT.forward_chunk`, random adaLN rows);
* the whole flow: the streamed mel of one request (official `setup_cache` + `inference_chunk`
  with 1.0.7's trims, against `Token2Wav.decode`);
* HiFT: f0 and the NSF sines (bit-equal expected), then the audio of the official `forward`
  against the project's `decode` on the same mel and the official source;
* `with_upstream_formulation`: the DiT call, the mel and the audio again with the project's six
  deviations from the official formulation undone (`official.upstream_formulation`: addcmul
  modulate/gate, custom iSTFT, float64 host t schedule, 1-row adaLN GEMMs, up_embed fed a
  transposed view): bit-exact expected.

    PYTHONPATH=. python3 scripts/official_deviation.py --tiny --out results/cpu   # seconds
    PYTHONPATH=. python3 scripts/official_deviation.py --out results/cpu          # full dims, minutes

Needs the official modules (`pip install --no-deps minicpmo-utils==1.0.7 && pip install einops`).
The last stdout line is one JSON document.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import torch

from scripts._report import add_out, emit
from scripts._stages import tiny_stages
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.dit import gated, modulate
from stages.code2wav.hift import istft
from stages.code2wav.token2wav import Token2Wav
from tts_bench.reference import fidelity as fd
from tts_bench.reference.official import build_official, official_modules, upstream_formulation

# The project's fp32 reference path (3xTF32 and Triton attention act on CUDA only anyway).
FP32 = {"code2wav_dit_tf32x3": False, "code2wav_triton_attention": False}


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"max_abs": float((a.double() - b.double()).abs().max()), "equal": bool(torch.equal(a, b)),
            "ref_max_abs": float(b.abs().max())}


def pieces(cfg: Code2WavConfig, gen: torch.Generator) -> dict:
    """modulate / gated against upstream's expressions; istft against torch.istft."""
    dit = official_modules().dit_module
    x, shift, scale, gate, y = (torch.randn(2, 50, cfg.dit.hidden_size, generator=gen) for _ in range(5))
    h = cfg.hift
    frames = cfg.sample_rate // h.istft_hop_len + 1  # one second of audio
    spec = torch.complex(torch.randn(1, h.istft_n_fft // 2 + 1, frames, generator=gen),
                         torch.randn(1, h.istft_n_fft // 2 + 1, frames, generator=gen))
    window = torch.hann_window(h.istft_n_fft, periodic=True, dtype=torch.float64).float()
    return {
        "modulate": _diff(modulate(x, shift, scale + 1), dit.modulate(x, shift, scale)),
        "gated": _diff(gated(x, gate, y), x + gate * y),
        "istft": _diff(istft(spec, h.istft_n_fft, h.istft_hop_len, window),
                       torch.istft(spec, h.istft_n_fft, h.istft_hop_len, h.istft_n_fft, window=window)),
    }


@torch.inference_mode()
def dit_call(t2w: Token2Wav, dec, gen: torch.Generator, frames: int = 50) -> dict:
    """One estimator call on 2 rows (cond | uncond) with random inputs and t = 0.3."""
    d = t2w.cfg.dit
    x, mu, cond = (torch.randn(2, d.out_channels, frames, generator=gen) for _ in range(3))
    spk, t = torch.randn(2, d.out_channels, generator=gen), torch.full((2,), 0.3)
    want = dec.flow.decoder.estimator(x, torch.ones(2, 1, frames), mu, t, spk, cond)
    x_in = torch.cat([x, mu, spk[:, :, None].expand(-1, -1, frames), cond], dim=1)
    got = t2w.flow.decoder.estimator.forward_chunk(x_in, t, None, None).velocity
    return _diff(got, want)


def streamed(t2w: Token2Wav, dec, codes: list[int]) -> dict:
    cfg = t2w.cfg
    payloads = fd.stream_payloads(cfg, codes, "official-deviation")
    got = fd.project_mels(t2w, [payloads])[0]
    want = fd.official_mel(dec, t2w, payloads)
    ref_wav, source = fd.vocode_official(dec, want, seed=0)
    with torch.inference_mode():
        mel = want[None]
        f0_off, f0_our = dec.hift.f0_predictor(mel), t2w.hift.f0_predictor(mel)
        up = torch.nn.functional.interpolate(f0_our[:, None], scale_factor=float(cfg.hift.samples_per_frame))
        fn = up.transpose(1, 2) * torch.arange(1, cfg.hift.nb_harmonics + 2, dtype=torch.float32)
        torch.manual_seed(0)
        sines_our = t2w.hift.m_source._sines(fn.clone(), None)
        torch.manual_seed(0)
        sines_off = dec.hift.m_source.l_sin_gen._f02sine(fn.clone())
    same_mel = fd.vocode_project(t2w.hift, want, source)
    return {
        "payloads": len(payloads), "mel_frames": int(want.shape[1]),
        "flow_mel": {**_diff(got, want), "snr_db": fd.snr_db(want, got)},
        "hift_f0": _diff(f0_our, f0_off), "hift_sines": _diff(sines_our, sines_off),
        "hift_audio_same_mel": {**_diff(same_mel, ref_wav), "snr_db": fd.snr_db(ref_wav, same_mel)},
        "end_to_end": fd.deviation(want, got, ref_wav, fd.vocode_project(t2w.hift, got, source)).as_dict(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the shipped tiny dims (configs/stages/minicpmo45-tiny.yaml)")
    ap.add_argument("--chunks", type=int, default=6, help="full 25-code chunks per request (plus a 7-code tail)")
    ap.add_argument("--seed", type=int, default=0, help="weights (init_seed) and input seed")
    ap.add_argument("--threads", type=int, default=1)
    add_out(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = tiny_stages().code2wav if args.tiny else Code2WavConfig()
    cfg = replace(base, extra={**base.extra, **FP32})
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=args.seed, keep_mel=True)
    dec = build_official(cfg, init="project", project=t2w)
    gen = torch.Generator().manual_seed(1000 + args.seed)
    codes = torch.randint(0, cfg.flow.vocab_size, (args.chunks * cfg.codec_chunk_frames + 7,), generator=gen).tolist()
    doc = {"dims": "tiny" if args.tiny else "full", "device": "cpu", "dtype": "float32", "seed": args.seed,
           "torch": torch.__version__, "threads": args.threads, "reference": "official minicpmo-utils 1.0.7",
           "pieces": pieces(cfg, gen), "dit_call": dit_call(t2w, dec, gen), **streamed(t2w, dec, codes)}
    # A fresh Token2Wav: its voice's prompt setup (a CFM solve) must be made inside too.
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=args.seed, keep_mel=True)
    with upstream_formulation(t2w.flow.decoder):
        again = streamed(t2w, dec, codes)
        doc["with_upstream_formulation"] = {
            "dit_call": dit_call(t2w, dec, torch.Generator().manual_seed(1000 + args.seed)),
            **{k: again[k] for k in ("flow_mel", "hift_audio_same_mel")}}
    for key in ("modulate", "gated", "istft"):
        print(f"{key:22s} max|d| {doc['pieces'][key]['max_abs']:.3g}  equal {doc['pieces'][key]['equal']}", file=sys.stderr)
    for key in ("dit_call", "flow_mel", "hift_f0", "hift_sines", "hift_audio_same_mel"):
        print(f"{key:22s} max|d| {doc[key]['max_abs']:.3g}  equal {doc[key]['equal']}", file=sys.stderr)
    for key, row in doc["with_upstream_formulation"].items():
        print(f"upstream formulation {key:9s} max|d| {row['max_abs']:.3g}  equal {row['equal']}", file=sys.stderr)
    emit(doc, args.out, f"official_deviation_{doc['dims']}" + (f"_seed{args.seed}" if args.seed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
