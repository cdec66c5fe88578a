"""Check that faster-whisper (fp32 compute) and openai-whisper give identical transcripts.

The openai-whisper model is the lossless conversion of the same bundled CTranslate2 fp16 weights
(`tts_bench.asr.ct2_convert`), so with fp32 compute on both sides and identical decoding options
(temperature 0, beam, language, the same Silero VAD pre-pass) every transcript should match
character for character. Run it on the WAVs of a WER run (`tts-bench wer --generate-only`):

    python -m tts_bench.asr.parity results/runs/<run>/wavs/base --model tiny.en --beam 5
    python -m tts_bench.asr.parity <dir> --model base --beam 1 --no-vad --out parity.json
    python -m tts_bench.asr.parity <dir> --model base --language zh     # a Chinese set's decoding

Prints one line per differing file and a summary; the last stdout line is one JSON document.
Exit 0 when all transcripts are identical, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tts_bench.asr import AsrOptions, make_transcriber
from tts_bench.asr.base import load_wav_16k
from tts_bench.rundir.atomic_json import write_json_atomic


def _transcribe_all(options: AsrOptions, audio: list) -> tuple[list[str], float]:
    model = make_transcriber(options)
    t0 = time.perf_counter()
    texts = [model.transcribe(a) for a in audio]
    return texts, time.perf_counter() - t0


def compare(wavs: list[Path], *, model: str, beam_size: int, vad: bool, language: str = "en") -> dict:
    """Transcribe `wavs` with both backends; a summary dict with every difference."""
    audio = [load_wav_16k(w) for w in wavs]
    common = dict(model=model, beam_size=beam_size, vad=vad, language=language)
    fast, fast_s = _transcribe_all(AsrOptions(backend="faster-whisper", compute_type="float32", **common), audio)
    ref, ref_s = _transcribe_all(AsrOptions(backend="openai-whisper", **common), audio)
    diffs = [{"wav": str(w), "faster_whisper": a, "openai_whisper": b}
             for w, a, b in zip(wavs, fast, ref) if a != b]
    return {
        "model": model, "language": language, "beam_size": beam_size, "vad": vad, "files": len(wavs),
        "identical": len(wavs) - len(diffs), "differences": diffs,
        "audio_seconds": sum(len(a) for a in audio) / 16000.0,
        "faster_whisper_fp32_seconds": fast_s, "openai_whisper_seconds": ref_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wav_dir", type=Path, help="directory searched recursively for *.wav")
    p.add_argument("--model", default="tiny.en", help="tiny.en | base | CTranslate2 model dir")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--no-vad", action="store_true")
    p.add_argument("--language", default="en", help="decoding language: en | zh (zh needs a multilingual model: base)")
    p.add_argument("--out", type=Path, help="also write the JSON summary here")
    args = p.parse_args(argv)
    wavs = sorted(args.wav_dir.rglob("*.wav"))
    if not wavs:
        print(f"error: no .wav files under {args.wav_dir} (wav_dir); run tts-bench wer --generate-only first",
              file=sys.stderr)
        return 2
    doc = compare(wavs, model=args.model, beam_size=args.beam, vad=not args.no_vad, language=args.language)
    for d in doc["differences"]:
        print(f"DIFF {d['wav']}\n  faster-whisper: {d['faster_whisper']}\n  openai-whisper: {d['openai_whisper']}")
    print(f"{doc['identical']}/{doc['files']} identical transcripts ({args.model}, {args.language}, beam {args.beam}, "
          f"vad {'off' if args.no_vad else 'on'}); audio {doc['audio_seconds']:.1f} s, faster-whisper fp32 "
          f"{doc['faster_whisper_fp32_seconds']:.1f} s, openai-whisper {doc['openai_whisper_seconds']:.1f} s")
    if args.out:
        write_json_atomic(args.out, doc)
    print(json.dumps(doc))
    return 0 if not doc["differences"] else 1


if __name__ == "__main__":
    sys.exit(main())
