"""Phase 1 of the WER gate: synthesize every prompt with every arm, keep the audio as WAV files.

The arm's backend is started (1 replica by default), every prompt is sent through the shared
load generator (`tts_bench.load.loadgen.run_phase`, C requests in flight) and stopped again before
the next arm starts — and before any ASR runs (phase 2), so the system under test never competes
with the recognizer for the CPU.

Nothing is dropped: each (arm, prompt) yields exactly one `GenRecord`, appended durably to the
run's requests.jsonl as it finishes. Failures keep their cause:

| failure_kind | why | detail starts with |
|---|---|---|
| `request_failed` | the backend raised, timed out, or the prompt wav is missing | the backend's kind (`timeout`, `backend_error`, `missing_prompt_wav`) |
| `no_audio` | the request finished with zero samples | `empty_audio` |

Audio is written as 16-bit mono WAV (`wavs/<arm>/<request_id>.wav`,
`stages.audio.write_wav16`); its `audio_sha256` is the sha256 of the WAV *file*, the same
hash the transcript cache and the output-identity line use.

    records = asyncio.run(generate_arm("base", backend, prompts, run, concurrency=4))
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from stages.audio import write_wav16
from tts_bench.backends.base import AudioChunk, Backend, SynthesisRequest
from tts_bench.load.loadgen import run_phase
from tts_bench.rundir.records import Job, PhaseLabels, RequestRecord, from_known_fields

log = logging.getLogger(__name__)

WER_TIER = "wer"  # the `tier` label of generation records in requests.jsonl
GEN_FAILURES = ("request_failed", "no_audio")
# Every load-generator failure kind maps here (a new kind there must be placed here too).
_LOADGEN_TO_WER = {
    "timeout": "request_failed", "backend_error": "request_failed", "http_error": "request_failed",
    "connection_error": "request_failed", "empty_audio": "no_audio",
    "invalid_request": "request_failed",
    "bad_prompt": "request_failed",  # its reference voice could not be used
}  # fmt: skip


@dataclass(frozen=True)
class GenRecord:
    """One (arm, prompt) after generation; `wav` is relative to the run directory."""

    arm: str
    request_id: str
    text: str
    wav: str | None = None
    audio_sha256: str | None = None
    audio_seconds: float = 0.0
    sample_rate: int = 0
    failure_kind: str | None = None
    failure_detail: str = ""

    @property
    def ok(self) -> bool:
        return self.failure_kind is None

    def to_json(self) -> dict:
        # The four fields results.request_key() expects, plus ours.
        return {"tier": WER_TIER, "repeat": 0, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> GenRecord:
        return from_known_fields(cls, data)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class _TeeBackend:
    """Wraps a backend and keeps every chunk's samples per request id (for the WAV)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.audio: dict[str, list[np.ndarray]] = {}
        self.rate: dict[str, int] = {}

    async def start(self, replicas: int) -> None:
        await self.inner.start(replicas)

    async def stop(self) -> None:
        await self.inner.stop()

    def describe(self) -> dict:
        return self.inner.describe()

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioChunk]:
        pieces = self.audio.setdefault(request.request_id, [])
        pieces.clear()  # a retried id starts over
        stream = self.inner.synthesize(request)
        # Close the inner stream when the client abandons ours (timeout), not at garbage collection.
        closer = contextlib.aclosing(stream) if hasattr(stream, "aclose") else contextlib.nullcontext()
        async with closer:
            async for chunk in stream:
                pieces.append(np.asarray(chunk.samples, dtype=np.float32))
                self.rate[request.request_id] = chunk.sample_rate
                yield chunk


def _missing_prompt(prompt) -> str | None:
    wav = getattr(prompt, "prompt_wav", None)
    if wav is not None and not Path(wav).is_file():
        return f"missing_prompt_wav: {wav}"
    return None


def _request(prompt, seed: int) -> SynthesisRequest:
    return SynthesisRequest(
        request_id=prompt.request_id, text=prompt.text, prompt_text=prompt.prompt_text,
        prompt_wav=prompt.prompt_wav, seed=seed,
    )


def _finish(arm: str, prompt, rec: RequestRecord, tee: _TeeBackend, run_path: Path) -> GenRecord:
    if not rec.ok:
        kind = _LOADGEN_TO_WER.get(rec.failure_kind, "request_failed")
        return GenRecord(arm, prompt.request_id, prompt.text, failure_kind=kind,
                         failure_detail=f"{rec.failure_kind}: {rec.failure_detail}".rstrip(": "))
    samples = np.concatenate(tee.audio.pop(prompt.request_id))
    rate = tee.rate[prompt.request_id]
    rel = Path("wavs") / arm / f"{prompt.request_id}.wav"
    (run_path / rel).parent.mkdir(parents=True, exist_ok=True)
    write_wav16(run_path / rel, samples, rate)
    return GenRecord(arm, prompt.request_id, prompt.text, wav=str(rel),
                     audio_sha256=file_sha256(run_path / rel),
                     audio_seconds=len(samples) / rate, sample_rate=rate)


async def generate_arm(
    arm: str,
    backend: Backend,
    prompts: Sequence,
    run_path: Path,
    *,
    concurrency: int = 4,
    replicas: int = 1,
    timeout_s: float = 120.0,
    seed: int = 42,
    sink: Callable[[GenRecord], None] | None = None,
) -> list[GenRecord]:
    """Start `backend`, synthesize every prompt, stop it; one GenRecord per prompt, in order.

    `prompts` are `tts_bench.inputs.prompts.Prompt`s (anything with request_id, text, prompt_text,
    prompt_wav)."""
    done: dict[str, GenRecord] = {}

    def emit(rec: GenRecord) -> None:
        done[rec.request_id] = rec
        if sink is not None:
            sink(rec)

    jobs = []
    for p in prompts:
        missing = _missing_prompt(p)
        if missing:
            emit(GenRecord(arm, p.request_id, p.text, failure_kind="request_failed", failure_detail=missing))
        else:
            jobs.append(Job(_request(p, seed), utt=p.request_id))
    by_id = {p.request_id: p for p in prompts}
    tee = _TeeBackend(backend)
    if jobs:
        await tee.start(replicas)
        try:
            await run_phase(
                tee, jobs, concurrency=concurrency, labels=PhaseLabels(arm, WER_TIER, 0),
                timeout_s=timeout_s,
                sink=lambda r: emit(_finish(arm, by_id[r.request_id], r, tee, run_path)),
            )
        finally:
            await tee.stop()
    return [done[p.request_id] for p in prompts]
