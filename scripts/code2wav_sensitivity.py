"""Does code2wav's audio depend on its input? Codes, voice and mel sensitivity of the vocoder chain.

A random-weight decoder is only a fair system under test if what it is given reaches the audio:
two code sequences, two voices or two mels must give audio that differs by far more than one
int16 step (3.05e-5), or every "identical audio" check vouches for the talker and the noise seed
alone. This measures, for one build of code2wav (tiny or full dims, the project's seeded init):

* codes -> audio: two seeded code sequences of one length, one voice, one noise seed;
* voice -> audio: one code sequence, the default voice against a builtin prompt voice;
* mel -> audio: HiFT on a decoded mel against HiFT on an all-zero mel, same NSF noise, with the
  difference traced after conv_pre, each up-layer and conv_post;
* the f0 predictor: the share of frames above `nsf_voiced_threshold` and the f0 range;
* activation scale: the std of each traced HiFT stage and of the audio.

`--init official` measures the same dims built by the official modules (minicpmo-utils 1.0.7,
`tts_bench.reference.official`) with their own initialisation, decoding the same codes and
voices (the project's prompt features), as the yardstick for what "random weights" did upstream.

Each comparison reports max |delta|, the relative rms difference (rms(delta) / rms(a)) and the
share of int16 samples that differ. The last stdout line is one JSON document.

    PYTHONPATH=. python3 scripts/code2wav_sensitivity.py --tiny            # CPU, seconds
    PYTHONPATH=. python3 scripts/code2wav_sensitivity.py --seconds 2       # full dims (CPU: ~1 min)
    PYTHONPATH=. python3 scripts/code2wav_sensitivity.py --tiny --init official
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from scripts._report import add_out, emit
from scripts._stages import load_stages, prompt_wav_paths, tiny_stages
from stages.audio import to_pcm16
from stages.code2wav.streaming import DEFAULT_PROMPT_ID
from stages.code2wav.token2wav import Token2Wav

FULL = "configs/stages/minicpmo45.yaml"


def compare(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> dict:
    """max |a - b|, rms(a - b) / rms(a), and (for audio) the share of int16 samples that differ."""
    a, b = torch.as_tensor(a, dtype=torch.float64).flatten(), torch.as_tensor(b, dtype=torch.float64).flatten()
    n = min(a.numel(), b.numel())
    a, b = a[:n], b[:n]
    d = a - b
    rms_a = float(a.pow(2).mean().sqrt())
    return {
        "max_abs": float(d.abs().max()),
        "rel_rms": float(d.pow(2).mean().sqrt()) / rms_a if rms_a > 0 else float("inf"),
        "int16_differ": float((to_pcm16(a.float().numpy()) != to_pcm16(b.float().numpy())).mean()),
    }


def trace_hift(hift, vocode: Callable[[torch.Tensor], torch.Tensor], mel: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`vocode(mel)` (mel [1, 80, T] -> audio [T*480], a seeded NSF draw) and the named
    intermediate outputs of `hift` (the project's or the official HiFT: the same module names)."""
    outputs: dict[str, torch.Tensor] = {}
    named = {"conv_pre": hift.conv_pre, "conv_post": hift.conv_post}
    named |= {f"up{i}": resblock for i, resblock in enumerate(hift.ups)}
    hooks = [m.register_forward_hook(lambda _m, _i, out, k=k: outputs.__setitem__(k, out.detach().clone()))
             for k, m in named.items()]
    try:
        audio = vocode(mel)
    finally:
        for h in hooks:
            h.remove()
    return audio, outputs


def f0_stats(hift, mel: torch.Tensor, voiced_threshold: float) -> dict:
    with torch.inference_mode():
        f0 = hift.f0_predictor(mel).flatten().double()
    voiced = f0 > voiced_threshold
    return {"voiced_share": float(voiced.float().mean()), "f0_min_hz": float(f0.min()),
            "f0_median_hz": float(f0.median()), "f0_max_hz": float(f0.max())}


class Decoded(NamedTuple):
    mel: torch.Tensor  # [80, T]
    audio: np.ndarray  # [T * 480]


class Build(NamedTuple):
    """One code2wav build under test: decode(codes, voice) and vocode(mel), and its HiFT."""

    decode: Callable[[list[int], str | None], Decoded]
    vocode: Callable[[torch.Tensor], torch.Tensor]
    hift: torch.nn.Module


def project_build(t2w: Token2Wav, seed: int) -> Build:
    """The project's Token2Wav: its non-streaming reference decode, HiFT with a seeded generator."""
    def decode(codes: list[int], voice: str | None) -> Decoded:
        if voice is not None:
            t2w.register_prompt(voice, voice)
        out = t2w.reference(codes, voice or DEFAULT_PROMPT_ID)
        return Decoded(out.mel, out.audio)

    def vocode(mel: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator(device=mel.device).manual_seed(seed)
        return t2w.hift.inference(mel, mel.new_zeros(1, 1, 0), generator=gen)[0][0]

    return Build(decode, vocode, t2w.hift)


def official_build(cfg, seed: int) -> Build:
    """The official modules at the same dims with their own initialisation, fed the project's
    prompt features for each voice (tokens, mel, speaker embedding)."""
    from stages.code2wav.prompt import PromptBuilder
    from tts_bench.reference.official import build_official

    dec = build_official(cfg, init="official", seed=seed)
    prompts = PromptBuilder(cfg, device=torch.device("cpu"), dtype=torch.float32, weights_dir=None, init_seed=seed)

    def decode(codes: list[int], voice: str | None) -> Decoded:
        pf = prompts.build(voice)
        mel, audio = dec.decode(codes, pf.tokens, pf.mel.t()[None], pf.spk_embedding, seed=seed)
        return Decoded(mel, audio.numpy())

    return Build(decode, lambda mel: dec.vocode(mel, seed=seed)[0][0], dec.hift)


def measure(build: Build, cfg, *, seconds: float, seed: int = 0) -> dict:
    n_codes = int(round(seconds * cfg.token_rate_hz))
    gen = torch.Generator().manual_seed(seed)
    codes_a, codes_b = (torch.randint(0, cfg.flow.vocab_size - 1, (n_codes,), generator=gen).tolist() for _ in range(2))
    voice = str(prompt_wav_paths()[0])
    a = build.decode(codes_a, None)
    b = build.decode(codes_b, None)
    v = build.decode(codes_a, voice)
    mel = a.mel[None].float()  # [1, 80, T]
    with torch.inference_mode():
        audio_mel, trace_mel = trace_hift(build.hift, build.vocode, mel)
        audio_zero, trace_zero = trace_hift(build.hift, build.vocode, torch.zeros_like(mel))
    return {
        "codes": {"audio": compare(a.audio, b.audio), "mel": compare(a.mel, b.mel)},
        "voice": {"audio": compare(a.audio, v.audio), "mel": compare(a.mel, v.mel)},
        "mel_vs_zero_mel": {
            "audio": compare(audio_mel, audio_zero),
            "trace_max_abs": {k: compare(trace_mel[k], trace_zero[k])["max_abs"] for k in trace_mel},
        },
        "f0": f0_stats(build.hift, mel, cfg.hift.nsf_voiced_threshold),
        "scale": {
            "mel_std": float(mel.std()),
            **{f"{k}_std": float(trace_mel[k].std()) for k in trace_mel},
            "audio_rms": float(torch.as_tensor(a.audio).pow(2).mean().sqrt()),
            "audio_peak": float(np.abs(a.audio).max()),
        },
    }


def _table(doc: dict) -> str:
    rows = [("codes -> audio", doc["codes"]["audio"]), ("codes -> mel", doc["codes"]["mel"]),
            ("voice -> audio", doc["voice"]["audio"]), ("voice -> mel", doc["voice"]["mel"]),
            ("mel vs zero mel -> audio", doc["mel_vs_zero_mel"]["audio"])]
    out = [f"{'comparison':<26} {'max |d|':>10} {'rel rms':>9} {'int16 differ':>13}"]
    out += [f"{name:<26} {r['max_abs']:>10.3g} {r['rel_rms']:>9.3g} {r['int16_differ']:>13.3f}" for name, r in rows]
    f0 = doc["f0"]
    out.append(f"f0: voiced {f0['voiced_share']:.2f} of frames, {f0['f0_min_hz']:.1f}-{f0['f0_max_hz']:.1f} Hz "
               f"(median {f0['f0_median_hz']:.1f}); audio rms {doc['scale']['audio_rms']:.3g}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the shipped tiny dims (configs/stages/minicpmo45-tiny.yaml)")
    ap.add_argument("--config", default=FULL, help="stage config for the dims (ignored with --tiny)")
    ap.add_argument("--seconds", type=float, default=2.0, help="length of the decoded code sequences")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", choices=("project", "official"), default="project",
                    help="the project's seeded init, or the official modules' own (minicpmo-utils 1.0.7)")
    add_out(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    stages = tiny_stages() if args.tiny else load_stages(args.config)
    cfg, seed = stages.code2wav, stages.runner.seed
    if args.init == "official":
        build = official_build(cfg, seed)
    else:
        build = project_build(Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=seed), args.seed)
    doc = {"dims": "tiny" if args.tiny else args.config, "init": args.init, "seconds": args.seconds,
           "default_voice": DEFAULT_PROMPT_ID, **measure(build, cfg, seconds=args.seconds, seed=args.seed)}
    print(_table(doc), file=sys.stderr)
    suffix = "" if args.init == "project" else "_official_init"
    emit(doc, args.out, "code2wav_sensitivity_" + ("tiny" if args.tiny else "full") + suffix)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
