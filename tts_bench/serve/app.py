"""An OpenAI-compatible speech server over any tts-bench backend (embedded runner, piper, synthetic).

Endpoints:
- `POST /v1/audio/speech` — body `{"input": str, "model"?: str, "voice"?: str,
  "response_format"?: "mp3" (default) | "opus" | "aac" | "flac" | "wav" | "pcm",
  "stream"?: bool (default true), "stream_format"?: "audio" | "sse", "seed"?: int,
  "ref_text"?: str, "speed"?: 0.25-4.0}`; other fields are ignored. `model` is the served name or
  one of OpenAI's (`tts-1`, `tts-1-hd`, `gpt-4o-mini-tts`: aliases, so the SDK's defaults work).
  Formats, rates and the `speed` time-stretch: `tts_bench.wire.encode` (pcm is 24 kHz, resampled
  when the backend's rate differs). An `X-Request-Id` header names the backend request (ids
  must be unique among requests in flight). As the OpenAI API does, answers stream by default:
  chunked transfer encoding, each backend chunk encoded and written as it arrives (a WAV header
  carries the streaming size 0xFFFFFFFF); `"stream": false` answers whole with a
  Content-Length; `stream_format: sse` sends OpenAI-style `speech.audio.delta` events with the
  format's bytes in base64 instead.
- `GET /v1/models` — the served model, with the backend's `describe()` under `tts_bench`, then
  OpenAI's names as aliases of it (`alias_of`).
- `GET /metrics` — Prometheus text (`tts_bench.wire.exposition`): serve RSS, the backend's
  `memory_snapshot()` when it implements ReportsMemory, request counters.
- `GET /health` — 200 `{"status": "ok"}` while the backend serves; 503 (JSON, saying why) once
  it stopped serving (a stage process died) or the server is stopping.

Failure contract (what the `http` backend relies on): every error is OpenAI-style JSON with the
status that says whose fault it is (`tts_bench.serve.request` has the table: 400 bad field,
409 duplicate `X-Request-Id`, 413 body over `--max-body-bytes`, 415 not JSON, 503 backend
broken or server stopping, 500 a backend failure or a server bug). A backend failure before
the first audio chunk is an HTTP 500 whose `code` is the failure kind (400 when the backend
refused the request itself: `invalid_request`, e.g. a text too long for the talker's cache, or
`bad_prompt`, a `ref_audio` the stages cannot decode);
a failure after audio was sent *drops the connection* instead of ending the chunked body,
because a clean end would pass truncated audio off as a complete answer. A client that goes
away closes the backend stream, which cancels the request in backends that support it
(embedded). Once the backend reports it stopped serving (`ReportsHealth`), new requests get 503
at once instead of a 500 each.

Headers are sent with the first audio chunk, not before, so the response status can still
report an early failure; the client's TTFP is unaffected (it is stamped at the first audio bytes).

Every request is handed to the backend at once (no queue here): admission and batching are
the backend's business, as in a serving engine, and the client's concurrency C is what the
server sees. Counters are touched only on the event loop, so they need no lock.

    server = SpeechServer(cfg, replicas=2, port=8091)
    await server.start()                          # starts the backend, then listens
    ...
    await server.stop()                           # stops listening, then stops the backend

    with running_server(cfg, port=0) as server:   # background thread, for tests and scripts
        urllib.request.urlopen(server.url + "/v1/models")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from aiohttp import web

from tts_bench import preflight
from tts_bench.backends import make_backend
from tts_bench.backends.base import (
    AudioChunk, ReportsHealth, ReportsMemory, RequestFailed, SizesForConcurrency, SynthesisRequest,
)
from tts_bench.config import BenchConfig, load_arm
from tts_bench.errors import BackendError, ConfigError
from tts_bench.serve.protocol import JsonErrorRunner
from tts_bench.serve.request import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_INPUT_CHARS,
    MODEL_ALIASES,
    BadRequest,
    SpeechSpec,
    error_middleware,
    error_response,
    parse_speech_body,
    read_json_body,
)
from tts_bench.wire import exposition
from tts_bench.wire.audio import sse_audio_event, sse_event
from tts_bench.wire.encode import AudioEncoder


log = logging.getLogger(__name__)

_SHUTDOWN_TIMEOUT_S = 5.0  # in-flight requests get this long to finish on SIGINT/SIGTERM
_BACKLOG = 1024  # 128+ clients may connect at once at the start of a tier
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
_MAX_REQUEST_ID = 200
# Backend failure kinds that are the client's fault (a 400), with the request field to blame.
_CLIENT_FAULTS = {"invalid_request": "input", "bad_prompt": "ref_audio"}


def _request_id(request: web.Request) -> str:
    """The client's `X-Request-Id` when sane (the embedded runner seeds code2wav noise from the
    id, so reusing the client's id reproduces in-process audio), else a fresh one."""
    rid = request.headers.get("X-Request-Id", "")
    ok = 0 < len(rid) <= _MAX_REQUEST_ID and rid.isprintable()
    return rid if ok else uuid.uuid4().hex[:16]


class SpeechServer:
    """One backend (started with `replicas`) behind the endpoints in the module docstring."""

    def __init__(self, cfg: BenchConfig, *, replicas: int = 1, host: str = "127.0.0.1",
                 port: int = 8091, model_name: str | None = None, backend: Any = None,
                 max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, concurrency: int | None = None) -> None:
        self.cfg = cfg
        self.replicas = replicas
        self.concurrency = concurrency  # requests clients will keep in flight, if known
        self.host, self.port = host, port
        self.model_name = model_name or cfg.http.model
        self.backend = backend if backend is not None else make_backend(cfg)  # tests pass one
        self.max_input_chars, self.max_body_bytes = max_input_chars, max_body_bytes
        self.counters = {"requests_total": 0, "request_failures_total": 0, "requests_in_flight": 0}
        self._runner: web.AppRunner | None = None
        self._created = int(time.time())
        self._ids_in_flight: set[str] = set()
        self._stopping = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def check_listen(self) -> None:
        """A ConfigError (exit 2) now if `host:port` cannot be listened on (taken, or an address
        not on this host), before the backend starts: with the embedded stages that start takes
        minutes on a GPU. Port 0 (the OS picks one) always can. A race with another program
        taking the port in between still ends in start()'s own error."""
        if not self.port:
            return
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
            with socket.socket(family, kind, proto) as probe:
                # As aiohttp's site binds (reuse_address on Unix): a TIME_WAIT port is free,
                # a port another program listens on is not.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(addr)
        except OSError as exc:
            raise ConfigError(f"error: cannot listen on {self.host}:{self.port} ({exc.strerror or exc}) "
                              "(tts-bench serve --host/--port); pick another --port or --host, or stop "
                              "what holds it") from None

    async def start(self) -> None:
        self.check_listen()
        if self.concurrency and isinstance(self.backend, SizesForConcurrency):
            # Per-request state sized up front (the embedded runner's slot pools), so serving
            # the expected load never grows it (a grown pool drops its captured device graphs).
            self.backend.expect_concurrency(self.concurrency)
        await self.backend.start(self.replicas)
        app = web.Application(middlewares=[error_middleware], client_max_size=self.max_body_bytes)
        app.add_routes([web.post("/v1/audio/speech", self._speech), web.get("/v1/models", self._models),
                        web.get("/metrics", self._metrics), web.get("/health", self._health)])
        # handler_cancellation: a client that disconnects (its timeout) cancels the handler at
        # once, which closes the backend stream and frees the backend's capacity (embedded
        # cancels the request) instead of generating audio nobody reads until the next write.
        # JsonErrorRunner: requests aiohttp's parser refuses get JSON and one log line, too.
        runner = JsonErrorRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
                                 handler_cancellation=True)
        try:
            await runner.setup()
            await web.TCPSite(runner, self.host, self.port, backlog=_BACKLOG).start()
        except BaseException as exc:
            await runner.cleanup()
            await self.backend.stop()
            if isinstance(exc, OSError):  # port taken, address not on this host, ...
                raise BackendError(
                    f"error: cannot listen on {self.host}:{self.port} ({exc.strerror or exc}) "
                    f"(tts-bench serve --host/--port); pick another --port, or stop what holds it"
                ) from exc
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]  # the real port when asked for port 0
        if self.host not in _LOOPBACK:
            log.warning("serving on %s: anyone who can reach this host can use it", self.host)

    async def stop(self) -> None:
        self._stopping = True  # from now on new requests get 503 (the grace period included)
        runner, self._runner = self._runner, None
        try:
            if runner is not None:
                await runner.cleanup()
        finally:
            await self.backend.stop()

    # -- handlers ------------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why this server takes no new work (stopping, or the backend stopped serving)."""
        if self._stopping:
            return "the server is stopping"
        if isinstance(self.backend, ReportsHealth):
            reason = self.backend.health()
            if reason:
                return f"the backend stopped serving: {reason}; restart tts-bench serve"
        return None

    async def _health(self, request: web.Request) -> web.Response:
        reason = self.unavailable()
        if reason is not None:
            return error_response(503, reason, code="backend_unavailable")
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model_name, "object": "model", "created": self._created,
                 "owned_by": "tts-bench", "tts_bench": self.backend.describe()}
        aliases = [{"id": name, "object": "model", "created": self._created, "owned_by": "tts-bench",
                    "alias_of": self.model_name} for name in MODEL_ALIASES if name != self.model_name]
        return web.json_response({"object": "list", "data": [model, *aliases]},
                                 dumps=lambda d: json.dumps(d, default=str))

    async def _metrics(self, request: web.Request) -> web.Response:
        rows: list[dict] = []
        if isinstance(self.backend, ReportsMemory):  # the embedded runner asks its processes
            rows = await asyncio.to_thread(self.backend.memory_snapshot)
        text = exposition.render(rows, rss_bytes=psutil.Process().memory_info().rss,
                                 counters=self.counters)
        return web.Response(body=text.encode("utf-8"), headers={"Content-Type": exposition.CONTENT_TYPE})

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        self.counters["requests_total"] += 1
        reason = self.unavailable()
        if reason is not None:  # a broken backend takes no work: clients see why, at once
            raise BadRequest(503, reason)
        body = await read_json_body(request, max_body_bytes=self.max_body_bytes)
        spec = parse_speech_body(body, self.model_name, max_input_chars=self.max_input_chars,
                                 ref_audio_limit_seconds=self.cfg.stages.code2wav.ref_audio_limit_seconds)
        rid = _request_id(request)
        if rid in self._ids_in_flight:
            raise BadRequest(409, f"request id {rid!r} (X-Request-Id) is already in flight; "
                                  f"use a unique id per request", code="duplicate_request_id")
        synth = SynthesisRequest(request_id=rid, text=spec.text, prompt_text=spec.prompt_text,
                                 seed=spec.seed, prompt_audio=spec.prompt_audio)
        self.counters["requests_in_flight"] += 1
        self._ids_in_flight.add(rid)
        try:
            stream = self.backend.synthesize(synth)
            async with contextlib.aclosing(stream):
                if spec.stream:
                    return await self._stream(request, spec, stream)
                return await self._whole(spec, stream)
        finally:
            self.counters["requests_in_flight"] -= 1
            self._ids_in_flight.discard(rid)

    async def _whole(self, spec: SpeechSpec, stream: AsyncIterator[AudioChunk]) -> web.Response:
        try:
            chunks = [chunk async for chunk in stream]
        except Exception as exc:  # noqa: BLE001 - every backend failure becomes a 500
            return self._failed(exc)
        rate = chunks[0].sample_rate if chunks else self.cfg.http.sample_rate
        samples = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.float32)
        enc = AudioEncoder(spec.response_format, rate, speed=spec.speed, streaming=False)
        body = await _encoded(enc, samples)
        return web.Response(body=body, headers={"Content-Type": enc.content_type})

    async def _stream(self, request: web.Request, spec: SpeechSpec,
                      stream: AsyncIterator[AudioChunk]) -> web.StreamResponse:
        response: web.StreamResponse | None = None
        enc: AudioEncoder | None = None
        try:
            async for chunk in stream:
                if enc is None:
                    enc = AudioEncoder(spec.response_format, chunk.sample_rate, speed=spec.speed)
                    response = await self._open_stream(request, spec, enc)
                assert response is not None
                await self._write(response, spec, await _encoded(enc, chunk.samples, last=False))
        except ConnectionResetError:  # the client gave up (its timeout): not a server failure
            log.debug("client went away; request abandoned")
            assert response is not None, "only writes raise ConnectionResetError"
            return response
        except Exception as exc:  # noqa: BLE001 - every backend failure is reported or dropped
            if response is None:
                return self._failed(exc)
            self.counters["request_failures_total"] += 1
            log.warning("request failed after audio was sent, dropping the connection: %s", exc)
            if request.transport is not None:  # see the failure contract in the module docstring
                request.transport.abort()
            return response
        if enc is None:  # no audio at all: a complete, empty answer (the client counts it)
            enc = AudioEncoder(spec.response_format, self.cfg.http.sample_rate, speed=spec.speed)
            response = await self._open_stream(request, spec, enc)
        assert response is not None
        await self._write(response, spec, await _encoded(enc, None))
        if spec.sse:
            await response.write(sse_event({"type": "speech.audio.done"}))
        await response.write_eof()
        return response

    @staticmethod
    async def _open_stream(request: web.Request, spec: SpeechSpec, enc: AudioEncoder) -> web.StreamResponse:
        content_type = "text/event-stream" if spec.sse else enc.content_type
        response = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        return response

    @staticmethod
    async def _write(response: web.StreamResponse, spec: SpeechSpec, data: bytes) -> None:
        if data:  # an encoder may hold a chunk back whole (less than one codec frame)
            await response.write(sse_audio_event(data) if spec.sse else data)

    def _failed(self, exc: Exception) -> web.Response:
        """A failure before the first audio chunk: 400 when the backend refused the request
        itself (a text too long, a voice it cannot use), 503 when the backend stopped serving meanwhile, else 500 with its kind."""
        self.counters["request_failures_total"] += 1
        kind = exc.kind if isinstance(exc, RequestFailed) else "backend_error"
        detail = exc.detail if isinstance(exc, RequestFailed) else f"{type(exc).__name__}: {exc}"
        log.warning("request failed (%s): %s", kind, detail)
        if kind in _CLIENT_FAULTS:
            return error_response(400, detail, code=kind, param=_CLIENT_FAULTS[kind])
        reason = self.unavailable()
        if reason is not None:
            return error_response(503, reason, code="backend_unavailable")
        return error_response(500, f"{kind}: {detail}" if detail else kind, code=kind)


async def _encoded(enc: AudioEncoder, samples: np.ndarray | None, *, last: bool = True) -> bytes:
    """`samples` through `enc` (None: only its tail); `last` adds the tail. Codecs and the
    time-stretch run in a worker thread (FFmpeg releases the GIL), plain PCM on the loop."""
    def run() -> bytes:
        out = enc.feed(samples) if samples is not None else b""
        return out + enc.finish() if last else out

    return await asyncio.to_thread(run) if enc.needs_codec else run()


# ---------------------------------------------------------------- running it


def serve_config(config: Path, *, sets: Sequence[str] = (), arm: str | None = None, replicas: int = 1,
                 host: str = "127.0.0.1", port: int = 8091, concurrency: int | None = None,
                 **limits: int) -> None:
    """`tts-bench serve` as one call: one arm of `config` (`tts_bench.config.load_arm`), refused
    when its backend is itself `http`, its memory checked at `concurrency` (default: the
    talker's admission limit), then served until SIGINT/SIGTERM (`serve_until_signalled`)."""
    cfg = load_arm(config, sets, arm)
    if cfg.backend == "http":
        raise ConfigError(f"error: the config's backend is http ({config}: backend); serve a local "
                          "backend (embedded, piper, synthetic), not another server")
    # Clients decide the concurrency; unless told, the most the talker admits at once.
    preflight.check_memory(cfg, replicas=replicas, concurrency=concurrency or cfg.stages.runner.talker_max_batch,
                 label=f"tts-bench serve --replicas {replicas}")
    asyncio.run(serve_until_signalled(cfg, replicas=replicas, host=host, port=port,
                                      concurrency=concurrency, **limits))


async def serve_until_signalled(cfg: BenchConfig, *, replicas: int, host: str, port: int,
                                concurrency: int | None = None, **limits: int) -> None:
    """`tts-bench serve`: start, log the URL, serve until SIGINT/SIGTERM, stop the backend.
    `limits`: max_input_chars, max_body_bytes (SpeechServer)."""
    server = SpeechServer(cfg, replicas=replicas, host=host, port=port, concurrency=concurrency, **limits)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        log.info("listening on %s (backend %s, %d replicas, model %r); Ctrl-C stops",
                 server.url, cfg.backend, replicas, server.model_name)
        await stop.wait()
        log.info("stopping: waiting up to %.0f s for requests in flight", _SHUTDOWN_TIMEOUT_S)
    finally:
        await server.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    log.info("stopped")


@contextlib.contextmanager
def running_server(cfg: BenchConfig, *, replicas: int = 1, host: str = "127.0.0.1", port: int = 0,
                   start_timeout_s: float = 120.0, **options: Any) -> Iterator[SpeechServer]:
    """A SpeechServer on its own event loop in a daemon thread, stopped on exit (tests, scripts).
    The default port 0 picks a free port; read it from `server.url`. `options` go to
    SpeechServer (backend=, max_input_chars=, max_body_bytes=, concurrency=)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tts-bench-serve", daemon=True)
    thread.start()
    server = SpeechServer(cfg, replicas=replicas, host=host, port=port, **options)
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=start_timeout_s)
        try:
            yield server
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=start_timeout_s)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
