"""faster-whisper (CTranslate2) on CPU: the default, fast ASR backend of the WER gate.

int8 compute is applied at load time to the fp16 weights of the bundled models; `float32`
compute is what the openai-whisper reference matches transcript for transcript. Decoding is
pinned: one temperature (0.0, no fallback ladder), language "en", the bundled Silero VAD when
`vad` is on, no network (local model directories only).

    t = FasterWhisperTranscriber(AsrOptions(model="tiny.en", compute_type="int8"))
    t.transcribe(load_wav_16k(path))      # "The quick brown fox ..."
"""

from __future__ import annotations

import logging
import os

import numpy as np

from tts_bench.asr.base import AsrOptions, AsrProvenance
from tts_bench.asr.models import describe_asr, resolve_ct2_model
from tts_bench.errors import ConfigError

log = logging.getLogger(__name__)


class FasterWhisperTranscriber:
    """A loaded faster-whisper model (CPU)."""

    def __init__(self, options: AsrOptions) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise ConfigError(
                "error: faster-whisper is not installed (--asr faster-whisper); "
                "pip install 'omni-tts-bench[speech]'"
            ) from None
        self.options = options
        self.model_dir = resolve_ct2_model(options.model)
        # Split the cores between the workers unless told otherwise: 2 workers x 1 thread ran
        # 16x real time on 2 cores where 1 worker x 2 threads ran 9.7x (short clips).
        threads = options.cpu_threads or (max(1, (os.cpu_count() or 1) // options.workers)
                                           if options.workers > 1 else 0)
        self._model = WhisperModel(
            str(self.model_dir),
            device="cpu",
            compute_type=options.compute_type,
            cpu_threads=threads,
            num_workers=options.workers,
            local_files_only=True,
        )

    def provenance(self) -> AsrProvenance:
        return describe_asr(self.options)

    def transcribe(self, audio: np.ndarray) -> str:
        # audio: [n] float32 mono, 16 kHz
        o = self.options
        segments, _info = self._model.transcribe(
            audio,
            language=o.language,
            beam_size=o.beam_size,
            temperature=[o.temperature],  # a one-element list: no fallback sampling
            vad_filter=o.vad,
        )
        # Segments are produced lazily: joining them runs the decoder.
        return " ".join(s.text.strip() for s in segments).strip()
