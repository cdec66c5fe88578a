"""What travels between the runner's processes (all picklable, all small).

    client ──Submit/Cancel/StatsQuery/TraceQuery/Shutdown──▶ talker ──[payloads]/Drop──▶ code2wav-<r>
       ▲                                              │                           │
       └────────────── Ready / ChunkReady / RequestError / StatsReport / Fatal ◀─┘

`None` on an inbox is the shutdown sentinel (the talker's is `Shutdown`, which says what to
flush first). Payload batches are lists of the chunker's payload objects (anything with
request_id, chunk_seq, codes, last_chunk), one list per talker step and replica so a busy step
costs one queue put, not one per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class RunnerRequest:
    """One utterance for the runner; `seed` seeds this request's sampling generator."""

    request_id: str
    text: str
    seed: int = 42
    max_codes: int | None = None  # None: the talker's length model / EOS decides
    # The reference voice as an encoded audio file (WAV); None: the default voice. Cached by
    # content hash in each replica, so repeated voices are built once.
    prompt_audio: bytes | None = None


@dataclass(frozen=True)
class Submit:
    request: RunnerRequest
    replica: int  # the code2wav replica this request is pinned to


@dataclass(frozen=True)
class Cancel:
    """Client -> talker: stop generating; the talker then sends Drop to the pinned replica."""

    request_id: str
    replica: int


@dataclass(frozen=True)
class Drop:
    """Talker -> replica: forget this request's pending payloads and decoder state."""

    request_id: str


@dataclass(frozen=True)
class Shutdown:
    """Client -> talker: flush the payloads queued for the replicas, then exit. `gone`: replicas
    whose process already died (nobody reads their inbox: waiting on it would never end)."""

    gone: tuple[int, ...] = ()


@dataclass(frozen=True)
class StatsQuery:
    """Client -> stage process: report memory and work counters (answered between steps)."""

    token: int


@dataclass(frozen=True)
class TraceQuery:
    """Client -> talker's process: profile it for `seconds` while it serves, write the Chrome
    trace to `path` and answer with a StatsReport whose stats hold "trace" (the summary of
    stages.profiling.window, or {"error": ...})."""

    token: int
    seconds: float
    path: str


@dataclass(frozen=True)
class Ready:
    """A stage process built its model (error is None) or failed to (error is the traceback)."""

    process: str
    pid: int
    error: str | None = None
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ChunkReady:
    """One decoded audio chunk; `codes` are the new codec tokens behind it (no left context)."""

    request_id: str
    chunk_seq: int
    audio: np.ndarray  # [n] float32 mono at the code2wav sample rate
    codes: tuple[int, ...]
    last_chunk: bool
    # First chunk only: how the request's voice was set up, {"cache_hit": bool, "setup_ms": float}.
    prompt: dict | None = None
    mel_sha256: str = ""  # sha256 of the chunk's float32 mel bytes (code2wav's flow output)


# RequestError kinds: the request itself is unacceptable (a client's mistake: bad seed, text
# too long for the cache), a stage failed while serving it, or the runner cannot serve at all.
INVALID_REQUEST = "invalid_request"
STAGE_ERROR = "stage_error"
RUNNER_BROKEN = "runner_broken"
BAD_PROMPT = "bad_prompt"  # the request's reference audio cannot be decoded or used


@dataclass(frozen=True)
class RequestError:
    """A request failed in a stage; the runner carries on with the others."""

    request_id: str
    message: str
    kind: str = STAGE_ERROR  # INVALID_REQUEST | STAGE_ERROR | RUNNER_BROKEN | BAD_PROMPT


@dataclass(frozen=True)
class StatsReport:
    token: int
    # process, pid, allocated_bytes, reserved_bytes, peak_bytes, rss_bytes, source; "work": the
    # loop counters of each stage in the process ({stage name: counters}, stages.runner.work);
    # the answer to a TraceQuery: process, pid and "trace"
    stats: dict


@dataclass(frozen=True)
class Fatal:
    """A stage process hit an error it cannot recover from and is about to exit."""

    process: str
    message: str


RunnerEvent = ChunkReady | RequestError
