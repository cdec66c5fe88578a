"""How a stage process builds its engines: three picklable callables, real ones by default.

The runner's processes are started with `spawn`, so what builds the models must be importable by
name in the child: module-level functions (or `functools.partial`s of them). Tests swap in the
fakes of `stages.runner.fakes` to exercise the process plumbing without model compute.

    StageFactories()                                   # the real talker / Chunker / Token2Wav
    StageFactories(talker=fakes.make_talker, ...)      # fakes, same shapes

Interfaces the runner relies on (duck-typed):
- talker(cfg: TalkerConfig, *, device, dtype, max_batch, max_seq_len, init_seed, weights_dir)
  -> engine with add(TalkerRequest), step() -> [TalkerOutput(request_id, code, finished)],
  has_work(), cancel(request_id);
- chunker(cfg: Code2WavConfig, request_id, *, seed, prompt_audio) -> one request's stream:
  push(codes) -> [payload], finish() -> payload (the final flush, `last_chunk`);
- token2wav(cfg: Code2WavConfig, *, device, dtype, init_seed, weights_dir, slots, shared)
  -> prepare(first payload) -> {"cache_hit", "setup_ms"} (raises PromptError for a bad voice),
  decode([payload]) -> [DecodedAudio(request_id, chunk_seq, audio, last_chunk)], drop(id),
  prompt_cache() -> {"entries", "bytes"}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stages.code2wav.config import Code2WavConfig
from stages.talker.config import TalkerConfig


def build_talker(cfg: TalkerConfig, **kwargs: Any) -> Any:
    """The real talker engine (imported here, in the child, never at runner import)."""
    from stages.talker.engine import TalkerEngine  # lazy: the model's modules load in the child only

    return TalkerEngine(cfg, **kwargs)


def make_talker_request(request_id: str, text: str, seed: int, max_codes: int | None) -> Any:
    from stages.talker.engine import TalkerRequest  # lazy: as build_talker

    return TalkerRequest(request_id, text, seed=seed, max_codes=max_codes)


def build_chunker(cfg: Code2WavConfig, request_id: str, *, seed: int = 0, prompt_audio: bytes | None = None) -> Any:
    """The request's chunker; with `prompt_audio` its payloads name the voice by content hash
    and the first one carries the audio (the replica builds or reuses the voice from it)."""
    from stages.code2wav.prompt import prompt_id_of  # lazy: as build_talker
    from stages.code2wav.streaming import DEFAULT_PROMPT_ID, Chunker  # lazy: as build_talker

    prompt_id = DEFAULT_PROMPT_ID if prompt_audio is None else prompt_id_of(prompt_audio)
    return Chunker(cfg, request_id, prompt_id, seed=seed, prompt_audio=prompt_audio)


def build_token2wav(cfg: Code2WavConfig, **kwargs: Any) -> Any:
    from stages.code2wav.token2wav import Token2Wav  # lazy: as build_talker

    return Token2Wav(cfg, **kwargs)


@dataclass(frozen=True)
class StageFactories:
    """What each stage process calls to build its engines (must be picklable by reference)."""

    talker: Callable[..., Any] = build_talker
    talker_request: Callable[..., Any] = make_talker_request
    chunker: Callable[..., Any] = build_chunker
    token2wav: Callable[..., Any] = build_token2wav
