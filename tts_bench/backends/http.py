"""The `http` backend: any OpenAI-compatible `/v1/audio/speech` server (vllm-omni, `tts-bench serve`).

Each request is one `POST {base_url}/v1/audio/speech` with the JSON body

    {"model": http.model, "input": <text>, "voice": http.voice,
     "response_format": http.response_format, "stream": http.stream, **http.extra_body}

A request with a reference voice (its prompt wav) also sends `ref_audio` (the file as a base64
`data:audio/wav` URL, encoded once per file) and `ref_text` (its transcript), as vllm-omni's
voice cloning takes them;
`http.send_voice: false` leaves them out for plain OpenAI servers.
(`extra_body` carries other server-specific fields such as `max_new_tokens`,
or `stream_format: sse`; it is applied last, so it can override the others; per-request seeds
are sent only where `http.send_seed` is set, since plain OpenAI servers reject unknown fields).
The response is decoded while it arrives (`tts_bench.wire.audio`: raw s16le PCM at the
`rate=` its Content-Type declares, else `http.sample_rate`; WAV, whose header rate wins;
mp3, aac, flac or Ogg opus through PyAV's decoders (`tts_bench.wire.decode`), so the TTFP is the
first decodable audio; or `text/event-stream` with base64 audio of the format asked for), and
every network read that completes at least one sample is yielded as an AudioChunk at once, so the load generator's TTFP is the arrival of the
first audio bytes. `base_url` may end in `/v1` (the OpenAI SDK habit) or not.

Failures, all counted per request by the load generator (never a crashed run):

| what happened | kind | detail starts with |
|---|---|---|
| server answered >= 400 | http_error | `HTTP 500: <body>` |
| the server's JSON error says the request was at fault (`error.code`) | invalid_request / bad_prompt | `HTTP 400: <body>` |
| 413 for a request that carries a voice (the voice is the body's size) | bad_prompt | `HTTP 413: <body>` |
| cannot connect (closed port, DNS) | connection_error | `cannot connect to <url>` |
| connection dropped mid-response | connection_error | `dropped after N bytes` |
| bytes do not match the declared format | backend_error | `protocol_error:` |
| no end of audio within bench.timeout_s | timeout | `no end of audio after` |

`start()` asks `GET /v1/models` and raises BackendError when the server cannot be reached, so a
down server is a broken run, not N failed requests. `replicas` is recorded only: a remote
deployment decides its own replica count. The API key, if any, is read from the environment
variable named by `http.api_key_env` and sent as a bearer token; it is never recorded.

Connection pool: unbounded on purpose. The load generator keeps exactly C requests in flight,
so the pool settles at C keep-alive connections, opened during the warmup requests, and measured
requests never pay a TCP connect; a fixed cap below C would queue requests inside the client and
show up as server latency.

Library: aiohttp (also the server side, `tts_bench.serve.app`): its client streams response
bodies read by read (`iter_any`) with low per-request overhead at 128+ concurrent streams, the
reason vLLM's serving benchmark uses it too.

    cfg = load_config("configs/ab/synthetic.yaml", ["backend=http", "http.base_url=http://127.0.0.1:8091"])
    backend = HttpBackend(cfg)
    await backend.start(replicas=1)
    async for chunk in backend.synthesize(SynthesisRequest("r1", "Hello there.")): ...
    backend.memory_snapshot()   # the server's /metrics memory, when it exposes tts-bench's metrics
    await backend.stop()
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from tts_bench.backends.base import AudioChunk, RequestFailed, SynthesisRequest
from tts_bench.errors import BackendError
from tts_bench.inputs.voices import VOICE_FILES_CACHED, voice_file
from tts_bench.wire import exposition
from tts_bench.wire.audio import PcmDecoder, SseDecoder, WavDecoder, WireError
from tts_bench.wire.decode import COMPRESSED, CONTENT_TYPE_FORMATS, CompressedDecoder

if TYPE_CHECKING:
    from tts_bench.config import BenchConfig, HttpConfig

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0  # for GET /v1/models at start
_CONNECT_TIMEOUT_S = 10.0  # per request; bench.timeout_s bounds the whole request
_METRICS_TIMEOUT_S = 2.0
_ERROR_BODY_CHARS = 300
_WAV_TYPES = ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave")


def api_root(base_url: str) -> str:
    """`http://h:8000` and `http://h:8000/v1/` both -> `http://h:8000/v1` (a query is dropped)."""
    parts = urllib.parse.urlsplit(base_url)
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path if path.endswith('/v1') else path + '/v1'}"


class _AudioStream:
    """Response bytes -> float32 samples, for one response's content type and the config."""

    def __init__(self, content_type: str, params: HttpConfig, rate_param: str | None) -> None:
        self.sse = SseDecoder() if content_type == "text/event-stream" else None
        compressed = CONTENT_TYPE_FORMATS.get(content_type)
        if compressed is None and params.response_format in COMPRESSED and content_type not in (
                "audio/pcm", *_WAV_TYPES):
            compressed = params.response_format  # SSE, octet-stream: the format asked for
        wav = content_type in _WAV_TYPES or (
            params.response_format == "wav" and content_type != "audio/pcm"
        )
        rate = int(rate_param) if rate_param and rate_param.isdigit() else params.sample_rate
        self.audio: WavDecoder | PcmDecoder | CompressedDecoder = (
            CompressedDecoder(compressed) if compressed else WavDecoder() if wav else PcmDecoder(rate))

    @property
    def sample_rate(self) -> int:
        rate = self.audio.sample_rate
        assert rate is not None, "samples decoded before the WAV header"
        return rate

    def feed(self, data: bytes) -> np.ndarray:
        if self.sse is None:
            return self.audio.feed(data)
        return self._concat([self.audio.feed(b) for b in self.sse.feed(data)])

    def finish(self) -> np.ndarray:
        tail = self._concat([self.audio.feed(b) for b in self.sse.finish()]) if self.sse else (
            np.zeros(0, dtype=np.float32))
        tail = self._concat([tail, self.audio.finish()])  # a codec's last frame; nothing for PCM/WAV
        if self.audio.pending_bytes:
            log.warning("dropped %d trailing bytes that do not make a whole sample",
                        self.audio.pending_bytes)
        return tail

    @staticmethod
    def _concat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


class HttpBackend:
    """Client of one OpenAI-compatible speech server (`cfg.http`)."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.params = cfg.http
        self.timeout_s = cfg.bench.timeout_s
        self.replicas = 0
        self.root = api_root(self.params.base_url)
        self._session: aiohttp.ClientSession | None = None
        self._server_models: list[dict[str, Any]] = []

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, replicas: int) -> None:
        if self._session is not None:
            raise BackendError("error: http backend started twice (start); call stop() first")
        self.replicas = replicas
        connector = aiohttp.TCPConnector(limit=0)  # unbounded: see the module docstring
        session = aiohttp.ClientSession(connector=connector, headers=self._headers())
        try:
            self._server_models = await self._check_server(session)
        except BaseException:
            await session.close()
            raise
        self._session = session

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.params.api_key_env, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _check_server(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        url = f"{self.root}/models"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=_START_TIMEOUT_S)) as resp:
                status = resp.status
                text = await resp.text(errors="replace") if status < 400 else ""
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(
                f"error: cannot reach the speech server at {url} ({type(exc).__name__}: {exc}) "
                f"(http.base_url); start it (tts-bench serve --config <yaml>) or point "
                f"--set http.base_url=http://host:port at a running one"
            ) from None
        if status in (401, 403):
            raise BackendError(
                f"error: the speech server at {url} refused the credentials (HTTP {status}) "
                f"(http.api_key_env={self.params.api_key_env}); export that variable with a valid key"
            )
        if status == 404:
            log.warning("%s answered 404; the server does not list models, continuing", url)
            return []
        if status >= 400:
            raise BackendError(f"error: the speech server at {url} answered HTTP {status} "
                               f"(http.base_url); check the server's log")
        try:
            doc = json.loads(text)
        except ValueError:
            raise BackendError(f"error: {url} did not answer JSON (starts with {text[:40]!r}) "
                               f"(http.base_url); point it at an OpenAI-compatible server") from None
        data = doc.get("data", []) if isinstance(doc, dict) else []
        models = [m for m in data if isinstance(m, dict)]
        ids = [m.get("id") for m in models]
        if ids and self.params.model not in ids:
            log.warning("model %r is not among the server's models %s (http.model)", self.params.model, ids)
        return models

    def describe(self) -> dict:
        p = self.params
        return {
            "backend": "http",
            "base_url": p.base_url,
            "model": p.model,
            "voice": p.voice,
            "response_format": p.response_format,
            "stream": p.stream,
            "sample_rate": p.sample_rate,
            "extra_body_keys": sorted(p.extra_body),
            "replicas_requested": self.replicas,  # the server decides its own replicas
            "server_models": self._server_models,
        }

    # -- requests ------------------------------------------------------------------------------

    def request_body(self, request: SynthesisRequest) -> dict[str, Any]:
        p = self.params
        body: dict[str, Any] = {"model": p.model, "input": request.text, "voice": p.voice,
                                "response_format": p.response_format}
        body["stream"] = p.stream  # servers that stream by default (OpenAI's, serve) need false said
        # `http.send_seed` (proposed config field; off = plain OpenAI bodies): servers that take a
        # per-request seed (tts-bench serve does) then sample exactly like the in-process arm.
        if getattr(p, "send_seed", False):
            body["seed"] = request.seed
        ref_audio = _ref_audio(request) if p.send_voice else None
        if ref_audio is not None:  # vllm-omni's voice-cloning fields
            body["ref_audio"] = ref_audio
            body["ref_text"] = request.prompt_text
        return {**body, **p.extra_body}

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioChunk]:
        if self._session is None:
            raise RuntimeError("HttpBackend.synthesize called before start()")
        url = f"{self.root}/audio/speech"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=_CONNECT_TIMEOUT_S)
        received = 0
        try:
            # X-Request-Id: servers that honour it (tts-bench serve does) then run the request
            # under the client's id, so id-seeded randomness (code2wav noise) matches in-process.
            headers = {"X-Request-Id": request.request_id}
            async with self._session.post(url, json=self.request_body(request), headers=headers,
                                          timeout=timeout) as resp:
                if resp.status >= 400:
                    raw = await _error_body(resp)
                    raise RequestFailed(_failure_kind(resp.status, raw, request),
                                        f"HTTP {resp.status}: {_shown(raw) or resp.reason or ''}")
                stream = _AudioStream(resp.content_type.lower(), self.params, _rate_param(resp))
                async for data in resp.content.iter_any():
                    received += len(data)
                    samples = stream.feed(data)
                    if len(samples):
                        yield AudioChunk(samples, stream.sample_rate)
                tail = stream.finish()
                if len(tail):
                    yield AudioChunk(tail, stream.sample_rate)
        except TimeoutError:  # before the connection errors: aiohttp's timeouts subclass both
            raise RequestFailed("timeout", f"no end of audio after {self.timeout_s:g} s (http)") from None
        except aiohttp.ClientConnectorError as exc:
            raise RequestFailed("connection_error", f"cannot connect to {url}: {exc}") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise RequestFailed(
                "connection_error",
                f"dropped after {received} bytes: {type(exc).__name__}: {exc}",
            ) from None
        except (aiohttp.ClientError, WireError) as exc:
            raise RequestFailed("backend_error", f"protocol_error: {type(exc).__name__}: {exc}") from None

    # -- memory (ReportsMemory) ----------------------------------------------------------------

    def memory_snapshot(self) -> list[dict]:
        """The server's memory from `GET {base}/metrics` (tts-bench serve's metric names), as
        memory_snapshot() rows; [] when the server has no such endpoint or does not answer."""
        url = self.root.removesuffix("/v1") + "/metrics"
        try:
            with urllib.request.urlopen(url, timeout=_METRICS_TIMEOUT_S) as resp:  # noqa: S310
                text = resp.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.debug("no metrics from %s: %s", url, exc)
            return []
        return exposition.memory_rows(exposition.parse(text))


def _rate_param(resp: aiohttp.ClientResponse) -> str | None:
    """The `rate=` parameter of e.g. `audio/pcm; rate=24000` (raw PCM servers may declare it)."""
    for part in resp.headers.get("Content-Type", "").split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "rate":
            return value.strip()
    return None


def _ref_audio(request: SynthesisRequest) -> str | None:
    """The request's voice as a `data:audio/wav` URL, or None for the default voice; raises
    RequestFailed("bad_prompt") for an unreadable prompt wav. This runs inside the timed window,
    so a prompt wav's URL is encoded once per file; voices given as bytes (`distinct` mode: new
    bytes every request) are encoded each time, since caching them would never hit."""
    voice = request.voice()
    if voice is None:
        return None
    if request.prompt_audio is None:
        return _file_data_url(Path(request.prompt_wav))
    return _data_url(voice)


@functools.lru_cache(maxsize=VOICE_FILES_CACHED)
def _file_data_url(path: Path) -> str:
    return _data_url(voice_file(path))  # voice() has just read it: a hit in voice_file's cache


def _data_url(voice: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(voice).decode("ascii")


async def _error_body(resp: aiohttp.ClientResponse) -> str:
    try:
        return (await resp.text(errors="replace")).strip()
    except (aiohttp.ClientError, TimeoutError):
        return ""


def _shown(raw: str) -> str:
    return " ".join(raw.split())[:_ERROR_BODY_CHARS]


# OpenAI-style `error.code`s that say the request itself was at fault (tts-bench serve sends them;
# the embedded backend counts the same requests under the same kinds).
_REQUEST_FAULTS = ("invalid_request", "bad_prompt")


def _failure_kind(status: int, raw: str, request: SynthesisRequest) -> str:
    """The failure kind of an error response: the server's own `invalid_request` / `bad_prompt`
    when its JSON says so; a 413 for a request that carries a voice is that voice (the text is
    bounded far below any body limit), so `bad_prompt`; anything else `http_error`."""
    try:
        code = json.loads(raw)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if code in _REQUEST_FAULTS:
        return code
    if status == 413 and (request.prompt_wav is not None or request.prompt_audio is not None):
        return "bad_prompt"
    return "http_error"
