"""Fake talker / chunker / token2wav with the real engines' shapes, for runner tests.

They run the runner's process plumbing (spawn, pinning, batching, streaming, failures) in
milliseconds, independent of model speed. Outputs are deterministic functions of the request
seed and the codes, so ordering and identity can be asserted exactly:

- talker: request `seed` s emits codes (s * 7919 + i * 104729) % eos for i = 0.., `max_codes`
  of them (default: `codes_per_word` per word), then one `code=None, finished=True` output;
- chunker: the streaming contract of spec §4.6 (25 new + 3 left context, first payload prefixed
  by 3 silence codes, final flush with `last_chunk`);
- token2wav: `samples_per_code` samples per new code, each code's samples = code / vocab;
  validates chunk_seq order per request like the real decoder does.

Fault injection (keyword options, bound with `functools.partial` so they pickle by reference):
`step_s` / `decode_s` sleep per call; `fail_start` raises at construction; `crash_after_decodes`
kills the process (`os._exit`) on that decode call; `fail_text` makes `add` refuse texts that
contain it; `fail_step` makes that `step()` call raise (`fail_steps_from`: that call and every
later one); `fail_decode_seq` makes a decode raise
when one of its rows has that chunk_seq. `log_dir` makes each replica append one JSON line per
decode call (`{"pid", "rows": [request ids]}`) so tests can see the batches.

    factories = fake_factories(decode_s=0.05, log_dir=str(tmp_path))
    runner = StageRunner(StageConfig(runner=RunnerConfig(device="cpu")), 2, factories=factories)
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from stages.audio import PromptError
from stages.code2wav.config import Code2WavConfig
from stages.runner.factories import StageFactories
from stages.talker.config import TalkerConfig


@dataclass(frozen=True)
class FakeTalkerRequest:
    request_id: str
    text: str
    seed: int = 42
    max_codes: int | None = None


@dataclass(frozen=True)
class FakeTalkerOutput:
    request_id: str
    code: int | None
    finished: bool


@dataclass(frozen=True)
class FakePayload:
    request_id: str
    chunk_seq: int
    codes: tuple[int, ...]
    last_chunk: bool
    prompt_id: str = "default"
    prompt_audio: bytes | None = None


@dataclass(frozen=True)
class FakeDecodedAudio:
    request_id: str
    chunk_seq: int
    audio: np.ndarray
    last_chunk: bool
    mel_sha256: str = ""  # the fake has no mel: reported as none


def fake_code(seed: int, index: int, eos: int) -> int:
    """The fake talker's code number `index` for a request seeded `seed`."""
    return (seed * 7919 + index * 104729) % eos


class FakeTalker:
    """TalkerEngine's shape: add / step / has_work / cancel."""

    def __init__(self, cfg: TalkerConfig, *, device: Any, dtype: Any, max_batch: int,
                 max_seq_len: int, init_seed: int = 0, weights_dir: str | None = None,
                 prelude: Any = None, step_s: float = 0.0, fail_text: str | None = None,
                 fail_step: int | None = None, fail_steps_from: int | None = None) -> None:
        self.cfg = cfg
        self.fail_step = fail_step  # step() number (1-based) that raises
        self.fail_steps_from = fail_steps_from  # from this step() on, every call raises
        self.steps = 0
        self.max_batch = max_batch
        self.step_s = step_s
        self.fail_text = fail_text
        self.active: dict[str, list[int]] = {}  # id -> [seed, emitted, budget]

    def add(self, req: FakeTalkerRequest) -> None:
        if self.fail_text is not None and self.fail_text in req.text:
            raise ValueError(f"fake talker refuses text containing {self.fail_text!r}")
        if len(self.active) >= self.max_batch:
            raise RuntimeError("fake talker: batch full")
        budget = req.max_codes
        if budget is None:
            budget = round(len(req.text.split()) * self.cfg.length.codes_per_word)
        self.active[req.request_id] = [req.seed, 0, budget]

    def has_work(self) -> bool:
        return bool(self.active)

    def cancel(self, request_id: str) -> None:
        self.active.pop(request_id, None)

    def step(self) -> list[FakeTalkerOutput]:
        self.steps += 1
        from_step = self.fail_steps_from
        if self.steps == self.fail_step or (from_step is not None and self.steps >= from_step):
            raise RuntimeError(f"fake talker step {self.steps} failed")
        if self.step_s:
            time.sleep(self.step_s)
        eos = self.cfg.eos_token_id
        out = []
        for rid, state in list(self.active.items()):
            seed, emitted, budget = state
            if emitted >= budget:
                out.append(FakeTalkerOutput(rid, None, True))
                del self.active[rid]
            else:
                out.append(FakeTalkerOutput(rid, fake_code(seed, emitted, eos), False))
                state[1] += 1
        return out


class FakeChunker:
    """The spec §4.6 streaming contract for one request, written plainly."""

    def __init__(self, cfg: Code2WavConfig, request_id: str, *, seed: int = 0,
                 prompt_audio: bytes | None = None) -> None:
        self.cfg = cfg
        self.request_id = request_id
        self.seed = seed
        self.prompt_audio = prompt_audio
        self.left = [cfg.silence_code] * cfg.codec_left_context_frames
        self.pending: list[int] = []
        self.seq = 0

    def _emit(self, last: bool) -> FakePayload:
        codes = self.left + self.pending
        audio = self.prompt_audio if self.seq == 0 else None
        payload = FakePayload(self.request_id, self.seq, tuple(codes), last, prompt_audio=audio)
        self.left, self.pending = codes[-self.cfg.codec_left_context_frames:], []
        self.seq += 1
        return payload

    def push(self, codes: Iterable[int]) -> list[FakePayload]:
        out = []
        for code in codes:
            self.pending.append(int(code))
            if len(self.pending) == self.cfg.chunk_codes(self.seq):
                out.append(self._emit(last=False))
        return out

    def finish(self) -> FakePayload:
        return self._emit(last=True)


class FakeToken2Wav:
    """Token2Wav's shape: decode(payloads) -> [DecodedAudio], drop(id)."""

    def __init__(self, cfg: Code2WavConfig, *, device: Any, dtype: Any, init_seed: int = 0,
                 weights_dir: str | None = None, decode_s: float = 0.0,
                 fail_start: str | None = None, crash_after_decodes: int | None = None,
                 fail_decode_seq: int | None = None, log_dir: str | None = None,
                 slots: int = 1, shared: Any = None) -> None:
        if fail_start is not None:
            raise RuntimeError(fail_start)
        self.cfg = cfg
        self.decode_s = decode_s
        self.crash_after = crash_after_decodes
        self.fail_decode_seq = fail_decode_seq  # decode raises when a row has this chunk_seq
        self.log = Path(log_dir) / f"decode-{os.getpid()}.jsonl" if log_dir else None
        self.calls = 0
        self.next_seq: dict[str, int] = {}
        self.voices: set[bytes] = set()  # reference voices seen (the real one caches setups)
        self.slots = slots

    def describe(self) -> dict:
        return {"slots": self.slots}  # the pool size the runner asked for (Token2Wav's key)

    @property
    def samples_per_code(self) -> int:
        return self.cfg.sample_rate // self.cfg.token_rate_hz

    def decode(self, payloads: list[FakePayload]) -> list[FakeDecodedAudio]:
        self.calls += 1
        if self.crash_after is not None and self.calls >= self.crash_after:
            os._exit(3)  # a hard crash: no exception, no message
        if self.log is not None:
            with self.log.open("a") as f:
                # "pid": the replica's identity (process and thread: replicas may be threads)
                who = f"{os.getpid()}-{threading.get_ident()}"
                f.write(json.dumps({"pid": who, "rows": [p.request_id for p in payloads],
                                    "shapes": [self.step_shape(p) for p in payloads]}) + "\n")
        if self.decode_s:
            time.sleep(self.decode_s)
        return [self._one(p) for p in payloads]

    def step_shape(self, p: FakePayload) -> str | None:
        """Token2Wav.step_shape's contract, by the stages of a stream's life: a first chunk, a
        second (caches still growing), a settled one; None for a final chunk."""
        if p.last_chunk:
            return None
        return ("first", "growing", "steady")[min(p.chunk_seq, 2)]

    def _one(self, p: FakePayload) -> FakeDecodedAudio:
        expected = self.next_seq.get(p.request_id, 0)
        if p.chunk_seq != expected or p.chunk_seq == self.fail_decode_seq:
            raise ValueError(
                f"request {p.request_id}: chunk_seq {p.chunk_seq}, expected {expected}"
            )
        self.next_seq[p.request_id] = expected + 1
        if p.last_chunk:
            del self.next_seq[p.request_id]
        new = np.asarray(p.codes[self.cfg.codec_left_context_frames:], dtype=np.float32)
        audio = np.repeat(new / self.cfg.flow.vocab_size, self.samples_per_code).astype(np.float32)
        return FakeDecodedAudio(p.request_id, p.chunk_seq, audio, p.last_chunk)

    def drop(self, request_id: str) -> None:
        self.next_seq.pop(request_id, None)

    def prepare(self, p: FakePayload) -> dict | None:
        """Token2Wav.prepare's contract: audio starting with b"BAD" is a bad voice."""
        if p.chunk_seq != 0:
            return None
        if p.prompt_audio is not None and p.prompt_audio.startswith(b"BAD"):
            raise PromptError(f"error: cannot decode reference audio (request {p.request_id}): Format not recognised.; give a WAV, FLAC, OGG or MP3 file")
        hit = p.prompt_audio is None or p.prompt_audio in self.voices
        if p.prompt_audio is not None:
            self.voices.add(p.prompt_audio)
        return {"cache_hit": hit, "setup_ms": 0.0 if hit else 1.0}

    def prompt_cache(self) -> dict:
        return {"entries": 1 + len(self.voices), "bytes": sum(len(v) for v in self.voices)}


def fake_factories(*, step_s: float = 0.0, fail_text: str | None = None,
                   fail_step: int | None = None, fail_steps_from: int | None = None,
                   **token2wav_options: Any) -> StageFactories:
    """StageFactories of the fakes; `token2wav_options` go to every FakeToken2Wav."""
    return StageFactories(
        talker=partial(FakeTalker, step_s=step_s, fail_text=fail_text, fail_step=fail_step,
                       fail_steps_from=fail_steps_from),
        talker_request=FakeTalkerRequest,
        chunker=FakeChunker,
        token2wav=partial(FakeToken2Wav, **token2wav_options),
    )
