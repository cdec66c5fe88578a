"""Offline CPU speech recognition for the WER gate (faster-whisper default, openai-whisper reference).

    from tts_bench.asr import AsrOptions, make_transcriber
    t = make_transcriber(AsrOptions(backend="faster-whisper", model="tiny.en"))
    text = t.transcribe(load_wav_16k(path))

The backends' libraries are imported when a model is loaded (openai-whisper pulls torch;
faster-whisper loads CTranslate2): both are optional (`[speech]`, `[asr-reference]`).
"""

from __future__ import annotations

from tts_bench.asr.base import (
    ASR_BACKENDS,
    AsrOptions,
    AsrProvenance,
    AudioDecodeError,
    Transcriber,
    load_wav_16k,
)
from tts_bench.asr.faster import FasterWhisperTranscriber
from tts_bench.asr.models import describe_asr
from tts_bench.asr.openai_ref import OpenAIWhisperTranscriber

__all__ = [
    "ASR_BACKENDS",
    "AsrOptions",
    "AsrProvenance",
    "AudioDecodeError",
    "Transcriber",
    "load_wav_16k",
    "backend_parallelism",
    "describe_asr",
    "make_transcriber",
]


def backend_parallelism(options: AsrOptions) -> int:
    """Concurrent `transcribe` calls a backend supports: faster-whisper runs `workers` (its
    `num_workers`); the openai-whisper reference runs one at a time."""
    return options.workers if options.backend == "faster-whisper" else 1


def make_transcriber(options: AsrOptions) -> Transcriber:
    """Load the ASR model `options` names (seconds: do it once per run)."""
    if options.backend == "faster-whisper":
        return FasterWhisperTranscriber(options)
    return OpenAIWhisperTranscriber(options)
