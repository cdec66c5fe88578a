"""The backend protocol: how the harness drives any TTS system.

A backend is started once per (arm, tier, repeat) with R stage-2 replicas, takes requests
concurrently, and streams audio back chunk by chunk. The load generator stamps times where a
chunk *arrives* (like a real client), so a backend must yield each chunk as soon as it exists.

    backend = make_backend(arm_config)          # tts_bench.backends.make_backend
    await backend.start(replicas=4)
    async for chunk in backend.synthesize(request):
        ...                                     # chunk.samples: float32 mono in [-1, 1]
    await backend.stop()

Per-request failures are raised from `synthesize` as `RequestFailed(kind, detail)`; the load
generator records them with their kind and carries on. `start` raising is a broken run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from tts_bench.inputs.voices import voice_file

# Failure kinds recorded per request (metric `failed` counts them; tables break them down).
# http_error: the server answered with an HTTP error status; connection_error: it could not be
# reached or the connection dropped mid-stream (http backend); invalid_request: the backend
# refused the request itself (seed out of range, text too long for the talker's cache), the
# client's mistake: `tts-bench serve` answers it with a 400; bad_prompt: the request's reference
# voice cannot be read or used (not audio, empty, too long).
FAILURE_KINDS = ("timeout", "backend_error", "empty_audio", "http_error", "connection_error",
                 "invalid_request", "bad_prompt")


@dataclass(frozen=True)
class SynthesisRequest:
    """One utterance to synthesize. `seed` makes sampling reproducible per request.

    The reference voice (zero-shot cloning, seed-tts style) is `prompt_audio` (an encoded audio
    file, e.g. from a server's `ref_audio`) or else the file `prompt_wav`; `prompt_text` is its
    transcript. Neither: the backend's default voice."""

    request_id: str
    text: str
    prompt_text: str = ""
    prompt_wav: Path | None = None
    seed: int = 42
    prompt_audio: bytes | None = None

    def voice(self) -> bytes | None:
        """The reference voice's encoded bytes, or None for the default voice. A prompt wav is
        read once per path (`tts_bench.inputs.voices.voice_file`); one that cannot be read is the
        request's fault: RequestFailed("bad_prompt")."""
        if self.prompt_audio is not None:
            return self.prompt_audio
        if self.prompt_wav is None:
            return None
        try:
            return voice_file(Path(self.prompt_wav))
        except OSError as exc:
            raise RequestFailed("bad_prompt", f"cannot read prompt wav {self.prompt_wav}: {exc.strerror}") from None


@dataclass(frozen=True)
class AudioChunk:
    """Audio as it arrives. `codes` carries the codec tokens behind it when the backend has them
    (the embedded runner does), so arms can be checked for identical outputs."""

    samples: np.ndarray  # [n] float32 mono, [-1, 1]
    sample_rate: int
    codes: tuple[int, ...] = ()
    # First chunk, where the backend knows it: how the request's voice was set up,
    # {"cache_hit": bool, "setup_ms": float} (the embedded runner reports it).
    prompt: dict | None = None
    # sha256 of the chunk's mel where the backend has one (the embedded runner's code2wav), so
    # output identity can check the flow's output apart from the vocoder's.
    mel_sha256: str = ""

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


class RequestFailed(Exception):
    """A request failed inside the backend; `kind` is one of FAILURE_KINDS."""

    def __init__(self, kind: str, detail: str = "") -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}; valid: {', '.join(FAILURE_KINDS)}")
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


@runtime_checkable
class Backend(Protocol):
    """What every backend implements. `describe()` goes into the run record (provenance)."""

    async def start(self, replicas: int) -> None: ...

    def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioChunk]: ...

    async def stop(self) -> None: ...

    def describe(self) -> dict: ...


@runtime_checkable
class SizesForConcurrency(Protocol):
    """Optional: backends that size per-request state when they start (the embedded runner's
    slot pools) are told the tier's concurrency before `start`, so nothing has to grow mid-phase
    (a growing slot pool drops every captured device graph)."""

    def expect_concurrency(self, concurrency: int) -> None: ...


@runtime_checkable
class ReportsMemory(Protocol):
    """Optional: backends whose processes can report their allocator (the `torch` mem sampler)."""

    def memory_snapshot(self) -> list[dict]: ...


@runtime_checkable
class ReportsHealth(Protocol):
    """Optional: backends that can tell they no longer serve (a stage process died). `health()`
    is None while serving, else the reason; `tts-bench serve` answers 503 with it."""

    def health(self) -> str | None: ...
