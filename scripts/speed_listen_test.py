"""Listening test by measurement: what `speed` (FFmpeg's atempo, as `tts-bench serve` applies it)
does to real speech, the piper voice.

For each speed the same sentence goes through `tts_bench.wire.encode.AudioEncoder` (chunk by
chunk, as the server streams it) and is measured three ways, standing in for a listener:

- duration: should be the original's / speed;
- pitch: the median f0 of voiced 40 ms frames (normalized autocorrelation, 60-400 Hz), which a
  time-stretch keeps and a naive resample (shown beside it) multiplies by the speed;
- intelligibility: faster-whisper tiny.en's transcript of the stretched audio, and its WER
  against the text (seed-tts normalizer).

    PYTHONPATH=. python scripts/speed_listen_test.py

Prints a fixed-width table and one JSON document as the last stdout line
(results/cpu/serve-speed-atempo.json keeps one run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform

import numpy as np
from scipy.signal import resample_poly

from tts_bench.backends.base import SynthesisRequest
from tts_bench.backends.piper import PiperBackend
from tts_bench.config import load_config
from tts_bench.wire.audio import WavDecoder
from tts_bench.wire.encode import AudioEncoder

TEXT = ("The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore, "
        "and the shells she sells are surely sea shells.")
SPEEDS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)


async def synthesize() -> tuple[list[np.ndarray], int]:
    backend = PiperBackend(load_config("configs/ab/piper.yaml"))
    await backend.start(1)
    try:
        chunks = [c async for c in backend.synthesize(SynthesisRequest("listen", TEXT, seed=0))]
    finally:
        await backend.stop()
    return [c.samples for c in chunks], chunks[0].sample_rate


def median_f0(x: np.ndarray, rate: int) -> float:
    """Median f0 (Hz) of voiced frames: normalized autocorrelation peak in 60-400 Hz above 0.5."""
    frame, hop = int(0.04 * rate), int(0.01 * rate)
    lo, hi = int(rate / 400), int(rate / 60)
    f0s = []
    for start in range(0, len(x) - frame, hop):
        w = x[start:start + frame] * np.hanning(frame)
        if np.sqrt(np.mean(w ** 2)) < 0.01:
            continue
        ac = np.correlate(w, w, "full")[frame - 1:]
        ac = ac / (ac[0] + 1e-12)
        lag = lo + int(np.argmax(ac[lo:hi]))
        if ac[lag] > 0.5:
            f0s.append(rate / lag)
    return float(np.median(f0s)) if f0s else float("nan")


def stretched(chunks: list[np.ndarray], rate: int, speed: float) -> tuple[np.ndarray, int]:
    enc = AudioEncoder("wav", rate, speed=speed, streaming=False)
    body = b"".join(enc.feed(c) for c in chunks) + enc.finish()
    dec = WavDecoder()
    return dec.feed(body), dec.sample_rate


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # --help; no options
    from tts_bench.asr import make_transcriber
    from tts_bench.asr.base import AsrOptions, resample
    from tts_bench.wer.normalize import get_normalizer
    import jiwer

    chunks, rate = asyncio.run(synthesize())
    original = np.concatenate(chunks)
    asr = make_transcriber(AsrOptions())
    norm = get_normalizer("seed-tts")
    rows = []
    base_f0 = median_f0(original, rate)
    for speed in SPEEDS:
        y, sr = stretched(chunks, rate, speed)
        text = asr.transcribe(resample(y, sr, 16000))
        naive = resample_poly(original, 100, int(round(100 * speed)))  # played faster: pitch x speed
        rows.append({"speed": speed, "duration_s": round(len(y) / sr, 3),
                     "duration_ratio": round(len(original) / rate / (len(y) / sr), 3),
                     "f0_hz": round(median_f0(y, sr), 1), "f0_naive_resample_hz": round(median_f0(naive, rate), 1),
                     "wer": round(jiwer.wer(norm(TEXT), norm(text) or "-"), 3), "transcript": text})
    print(f"piper voice, {rate} Hz, {len(original) / rate:.2f} s; median f0 {base_f0:.1f} Hz")
    print(f"{'speed':>6}{'dur s':>8}{'ratio':>7}{'f0 Hz':>8}{'naive f0':>10}{'WER':>7}  transcript")
    for r in rows:
        print(f"{r['speed']:>6}{r['duration_s']:>8.2f}{r['duration_ratio']:>7.2f}{r['f0_hz']:>8.1f}"
              f"{r['f0_naive_resample_hz']:>10.1f}{r['wer']:>7.3f}  {r['transcript']}")
    print(json.dumps({"what": "atempo time-stretch on the piper voice: duration, median f0, tiny.en WER per speed",
                      "text": TEXT, "rate": rate, "original_s": round(len(original) / rate, 3),
                      "original_f0_hz": round(base_f0, 1), "rows": rows,
                      "env": {"python": platform.python_version()}}))


if __name__ == "__main__":
    main()
