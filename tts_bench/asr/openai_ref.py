"""openai-whisper on CPU: the reference implementation the faster-whisper numbers are checked against.

It loads a `.pt` checkpoint, or converts one of the bundled CTranslate2 fp16 models losslessly
(`tts_bench.asr.ct2_convert`) and caches the result as `<cache>/openai-whisper/<name>-<sha>.pt`.
Decoding mirrors the faster-whisper backend: fp32 compute (fp16 is a GPU thing), temperature 0.0
only, language "en", and — when `vad` is on — the *same* Silero VAD pass faster-whisper runs
(its `get_speech_timestamps` + `collect_chunks`), so both see identical samples. With
`compute_type=float32` on the faster-whisper side the two give identical transcripts
(scripts/asr_parity.py checks it on the shipped set).

openai-whisper is optional (it pulls numba and tiktoken; `pip install openai-whisper`); a missing
package is a ConfigError naming that command.

    t = OpenAIWhisperTranscriber(AsrOptions(backend="openai-whisper", model="tiny.en"))
    t.transcribe(audio_16k)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from tts_bench.asr.base import AsrOptions, AsrProvenance
from tts_bench.asr.ct2_convert import convert_ct2_to_openai
from tts_bench.asr.models import BUILTIN_MODELS, cache_root, describe_asr, resolve_ct2_model, weights_sha256
from tts_bench.errors import ConfigError

log = logging.getLogger(__name__)


def _import_whisper():
    try:
        import whisper
    except ImportError:
        raise ConfigError(
            "error: openai-whisper is not installed (--asr openai-whisper); "
            "pip install openai-whisper, or use --asr faster-whisper"
        ) from None
    return whisper


def converted_checkpoint(model: str) -> Path:
    """The cached openai-whisper checkpoint converted from CTranslate2 model `model` (made once)."""
    import torch  # lazy: optional ([asr-reference]) and heavy

    model_dir = resolve_ct2_model(model)
    sha = weights_sha256(model_dir / "model.bin")
    name = model if model in BUILTIN_MODELS else model_dir.name
    target = cache_root() / "openai-whisper" / f"{name}-{sha}.pt"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("converting %s to an openai-whisper checkpoint at %s (once)", model_dir, target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    torch.save(convert_ct2_to_openai(model_dir), tmp)
    os.replace(tmp, target)  # atomic: readers never see half a checkpoint
    return target


def resolve_checkpoint(model: str) -> Path:
    """A `.pt` path as given, else the converted bundled / directory model."""
    path = Path(model).expanduser()
    if path.suffix == ".pt":
        if not path.is_file():
            raise ConfigError(f"error: checkpoint {path} not found (--asr-model); check the path")
        return path
    return converted_checkpoint(model)


def vad_speech(audio: np.ndarray) -> np.ndarray:
    """Exactly faster-whisper's VAD pre-pass: keep the speech chunks, concatenated."""
    # audio: [n] float32, 16 kHz
    from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

    chunks = get_speech_timestamps(audio, VadOptions())
    pieces, _meta = collect_chunks(audio, chunks)
    return np.concatenate(pieces, axis=0)


class OpenAIWhisperTranscriber:
    """A loaded openai-whisper model on CPU, fp32."""

    def __init__(self, options: AsrOptions) -> None:
        whisper = _import_whisper()
        self.options = options
        self.checkpoint = resolve_checkpoint(options.model)
        if options.cpu_threads:
            import torch

            torch.set_num_threads(options.cpu_threads)
        self._model = whisper.load_model(str(self.checkpoint), device="cpu")

    def provenance(self) -> AsrProvenance:
        return describe_asr(self.options)

    def transcribe(self, audio: np.ndarray) -> str:
        # audio: [n] float32 mono, 16 kHz
        o = self.options
        if o.vad:
            audio = vad_speech(audio)
        if audio.size == 0:
            return ""  # faster-whisper's answer for no speech; openai-whisper would pad silence
        result = self._model.transcribe(
            audio.astype(np.float32),
            language=o.language,
            temperature=o.temperature,
            beam_size=o.beam_size,
            fp16=False,
            verbose=None,
        )
        return " ".join(s["text"].strip() for s in result["segments"]).strip()
