"""Offline CPU speech recognition for the WER gate (faster-whisper default, openai-whisper reference).

    from tts_bench.asr import AsrOptions, make_transcriber
    t = make_transcriber(AsrOptions(backend="faster-whisper", model="tiny.en"))
    text = t.transcribe(load_wav_16k(path))

Backends are imported lazily (openai-whisper pulls torch; faster-whisper loads CTranslate2).
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


def _versions(*dists: str) -> dict[str, str]:
    import importlib.metadata

    out = {}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def describe_asr(options: AsrOptions) -> AsrProvenance:
    """Provenance of `options` without loading the model (hashes the weights file once).

    For openai-whisper on a converted model the hash is the CTranslate2 source's: conversion is
    lossless and deterministic, so the source identifies the weights."""
    from pathlib import Path

    from tts_bench.asr.models import BUILTIN_MODELS, resolve_ct2_model, weights_sha256

    o = options
    if o.backend == "openai-whisper" and Path(o.model).suffix == ".pt":
        weights = Path(o.model).expanduser()
        if not weights.is_file():
            from tts_bench.errors import ConfigError

            raise ConfigError(f"error: checkpoint {weights} not found (--asr-model); check the path")
    else:
        weights = resolve_ct2_model(o.model) / "model.bin"
    if o.backend == "faster-whisper":
        compute, versions = o.compute_type, _versions("faster-whisper", "ctranslate2")
    else:
        compute, versions = "float32", _versions("openai-whisper", "torch")
    name = o.model if o.model in BUILTIN_MODELS else (
        weights.name if weights.suffix == ".pt" else weights.parent.name)
    return AsrProvenance(
        backend=o.backend, model=name, model_sha256=weights_sha256(weights), compute_type=compute,
        beam_size=o.beam_size, vad=o.vad, language=o.language, temperature=o.temperature,
        library_versions=versions,
    )


def backend_parallelism(options: AsrOptions) -> int:
    """Concurrent `transcribe` calls a backend supports: faster-whisper runs `workers` (its
    `num_workers`); the openai-whisper reference runs one at a time."""
    return options.workers if options.backend == "faster-whisper" else 1


def make_transcriber(options: AsrOptions) -> Transcriber:
    """Load the ASR model `options` names (seconds: do it once per run)."""
    if options.backend == "faster-whisper":
        from tts_bench.asr.faster import FasterWhisperTranscriber

        return FasterWhisperTranscriber(options)
    from tts_bench.asr.openai_ref import OpenAIWhisperTranscriber

    return OpenAIWhisperTranscriber(options)
