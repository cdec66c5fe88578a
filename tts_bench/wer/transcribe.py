"""Phase 2 of the WER gate: transcribe every generated WAV, after every backend has stopped.

A `TranscriptCache` (one JSON file per ASR setup, in the cache directory) maps the WAV file's
sha256 to its transcript. The setup key covers the backend, model name *and weights hash*, and
every decoding option, so a changed model or option never reuses an old transcript. Identical
arms and re-scoring an old run cost no ASR at all, and the model is loaded only on the first
cache miss.

Failures (each counted, never dropped):

| failure_kind | why |
|---|---|
| `asr_failed` | the WAV is missing, unreadable (random bytes), has zero samples, or the ASR raised |
| `empty_transcript` | the ASR returned no text (e.g. digital silence: the VAD removes everything) |

Generation failures (`request_failed`, `no_audio`) pass through unchanged.

    session = AsrSession(options, provenance, factory=make_transcriber, cache=TranscriptCache(dir, key),
                         parallel=backend_parallelism(options))
    results = transcribe_records(records, run_path, session)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from tts_bench.asr.base import AsrOptions, AsrProvenance, AudioDecodeError, Transcriber, load_wav_16k
from tts_bench.wer.generate import GenRecord, file_sha256

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UttTranscript:
    """One (arm, prompt) after ASR: the generation record plus the transcript or failure."""

    gen: GenRecord
    transcript: str | None = None
    failure_kind: str | None = None  # generation failure kinds pass through
    failure_detail: str = ""
    asr_seconds: float = 0.0  # 0 on a cache hit
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.failure_kind is None


def setup_key(provenance: AsrProvenance) -> str:
    """Hash of everything that changes a transcript (library versions included)."""
    blob = json.dumps(provenance.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class TranscriptCache:
    """audio sha256 -> transcript for one ASR setup, persisted as `<dir>/<setup key>.json`."""

    def __init__(self, directory: Path | None, key: str) -> None:
        self.path = None if directory is None else Path(directory) / f"{key}.json"
        self.entries: dict[str, str] = {}
        self.dirty = False
        if self.path is not None and self.path.is_file():
            try:
                self.entries = json.loads(self.path.read_text(encoding="utf-8"))["transcripts"]
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable transcript cache %s", self.path)

    def get(self, audio_sha256: str) -> str | None:
        return self.entries.get(audio_sha256)

    def put(self, audio_sha256: str, text: str) -> None:
        self.entries[audio_sha256] = text
        self.dirty = True

    def save(self) -> None:
        """Atomic rewrite (temp file + rename): concurrent runs lose entries, never the file."""
        if self.path is None or not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"transcripts": self.entries}, indent=0, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)
        self.dirty = False


@dataclass
class AsrSession:
    """The ASR of one run: options, provenance, a lazily loaded model and the cache."""

    options: AsrOptions
    provenance: AsrProvenance
    factory: Callable[[AsrOptions], Transcriber]
    cache: TranscriptCache
    parallel: int = 1  # clips the model may decode at once (asr.backend_parallelism for real ones)
    load_seconds: float = 0.0
    _model: Transcriber | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def model(self) -> Transcriber:
        # Loaded on the first cache miss (a fully cached run never loads it), once, even when
        # several transcription threads miss at the same time.
        with self._lock:
            if self._model is None:
                t0 = time.perf_counter()
                self._model = self.factory(self.options)
                self.load_seconds = time.perf_counter() - t0
        return self._model


def _transcribe_one(gen: GenRecord, run_path: Path, session: AsrSession) -> UttTranscript:
    if not gen.ok:
        return UttTranscript(gen, failure_kind=gen.failure_kind, failure_detail=gen.failure_detail)
    wav = run_path / str(gen.wav)
    try:
        sha = file_sha256(wav)
    except OSError as exc:
        return UttTranscript(gen, failure_kind="asr_failed", failure_detail=f"cannot read {wav}: {exc}")
    text = session.cache.get(sha)
    seconds, cached = 0.0, text is not None
    if text is None:
        try:
            audio = load_wav_16k(wav)
            model = session.model()
            t0 = time.perf_counter()
            text = model.transcribe(audio)
            seconds = time.perf_counter() - t0
        except AudioDecodeError as exc:
            return UttTranscript(gen, failure_kind="asr_failed", failure_detail=str(exc))
        except Exception as exc:  # a decoder crash on one file is that file's failure
            return UttTranscript(gen, failure_kind="asr_failed", failure_detail=f"{type(exc).__name__}: {exc}")
        session.cache.put(sha, text)
    gen = replace(gen, audio_sha256=sha)
    if not text.strip():
        return UttTranscript(gen, transcript="", failure_kind="empty_transcript",
                             failure_detail="ASR returned no text", asr_seconds=seconds, cached=cached)
    return UttTranscript(gen, transcript=text, asr_seconds=seconds, cached=cached)


def transcribe_records(
    records: Sequence[GenRecord],
    run_path: Path,
    session: AsrSession,
    *,
    progress: Callable[[UttTranscript], None] | None = None,
) -> list[UttTranscript]:
    """Transcribe every record, results in record order; the cache is saved even when
    interrupted. Up to `session.parallel` clips are decoded at once; each clip's transcript does
    not depend on the others."""
    workers = max(1, session.parallel)
    out = []
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            # map() yields in submission order, so progress and results keep the record order.
            for result in pool.map(lambda gen: _transcribe_one(gen, run_path, session), records):
                out.append(result)
                if progress is not None:
                    progress(result)
    finally:
        session.cache.save()
    return out

