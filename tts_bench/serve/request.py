"""What `tts-bench serve` accepts, and how it says no: the edge checks and the JSON errors.

Every error the server answers is OpenAI-style JSON, `{"error": {"message", "type", "param",
"code"}}`, with the status that says whose fault it is:

| status | code | when |
|---|---|---|
| 400 | `invalid_request` | bad JSON (also nested too deeply), a field of the wrong type or range (`seed` outside [0, 2**63), `speed` outside [0.25, 4], a `voice` that is not a string, `input` empty or only control characters, longer than `--max-input-chars` or too long for the talker's `runner.max_seq_len`, a `ref_audio` that is not base64 audio, is empty or longer than `code2wav.ref_audio_limit_seconds`) |
| 400 | `bad_prompt` | a `ref_audio` with a valid header that the stages cannot decode or use (param `ref_audio`) |
| 404 | `model_not_found` / `not_found` | a model name other than the served one and OpenAI's (`MODEL_ALIASES`); an unknown path |
| 405 | `method_not_allowed` | e.g. GET /v1/audio/speech |
| 409 | `duplicate_request_id` | an `X-Request-Id` already in flight |
| 413 | `request_too_large` | a body over `--max-body-bytes` |
| 415 | `unsupported_media_type` | a body that is not `application/json` |
| 500 | the failure kind (`backend_error`, ...) or `internal_error` | the backend failed the request; a server bug |
| 503 | `backend_unavailable` | the backend stopped serving (a stage process died), or the server is stopping |

`error_middleware` turns whatever a handler raises (aiohttp's own 404/405/413 included) into
that JSON, so no answer is ever an HTML page or a traceback.

    spec = parse_speech_body(json_body, "minicpmo45", max_input_chars=4096)   # BadRequest
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from stages.admission import MAX_SEED
from stages.audio import PromptError, probe_audio
from tts_bench.config.limits import MAX_BODY_BYTES, MAX_INPUT_CHARS
from tts_bench.wire.encode import FORMATS, SPEED_RANGE

log = logging.getLogger(__name__)

MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # OpenAI's names: the SDK's defaults
STREAM_FORMATS = ("audio", "sse")
DEFAULT_MAX_INPUT_CHARS = MAX_INPUT_CHARS  # the OpenAI speech API's limit (--max-input-chars)
DEFAULT_MAX_BODY_BYTES = MAX_BODY_BYTES  # --max-body-bytes

_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed",
          409: "duplicate_request_id", 413: "request_too_large", 415: "unsupported_media_type",
          503: "backend_unavailable"}


class BadRequest(Exception):
    """A request the server refuses; becomes an error_response."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param
        self.code = code or _CODES.get(status, "invalid_request")


@dataclass(frozen=True)
class SpeechSpec:
    """A validated `/v1/audio/speech` body."""

    text: str
    response_format: str = "mp3"  # the OpenAI API's default
    stream: bool = True  # chunked audio, as the OpenAI API answers; `"stream": false` waits
    sse: bool = False
    seed: int = 42
    prompt_text: str = ""
    prompt_audio: bytes | None = None  # the decoded `ref_audio` (an encoded audio file)
    speed: float = 1.0


def parse_ref_audio(value: Any, *, limit_seconds: float | None = None) -> bytes | None:
    """`ref_audio` as vllm-omni takes it: base64, or a `data:<mime>;base64,<data>` URL, of an
    audio file. Only the cheap checks run here, on the event loop: decodable base64, an audio
    header with samples (`stages.audio.probe_audio`, the stages' own reader), and no longer than `limit_seconds` (the served
    `code2wav.ref_audio_limit_seconds`; None: no check). Decoding is the stages' work: a voice
    that only decoding finds bad comes back as their bad_prompt, which the server answers with
    a 400 too. Checking the header here still refuses a non-audio voice for backends that ignore
    voices (piper, synthetic), as they would otherwise answer 200."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadRequest(400, "'ref_audio' must be a base64 string or a data: URL", "ref_audio")
    data = value.split(",", 1)[1] if value.startswith("data:") else value
    if value.startswith("data:") and ";base64" not in value.split(",", 1)[0]:
        raise BadRequest(400, "'ref_audio' data: URL must be base64-encoded", "ref_audio")
    try:
        audio = base64.b64decode(data, validate=True)
    except (ValueError, binascii.Error):
        raise BadRequest(400, "'ref_audio' is not valid base64", "ref_audio") from None
    try:
        frames, rate = probe_audio(audio, where="ref_audio")  # empty audio is a PromptError too
    except PromptError as exc:
        raise BadRequest(400, str(exc).removeprefix("error: "), "ref_audio") from None
    if limit_seconds is not None and frames > limit_seconds * rate:
        raise BadRequest(400, f"'ref_audio' is {frames / rate:.1f} s long, more than "
                              f"{limit_seconds:g} s (code2wav.ref_audio_limit_seconds)", "ref_audio")
    return audio


def error_response(status: int, message: str, *, code: str, param: str | None = None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    doc = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(doc, status=status)


async def read_json_body(request: web.Request, *, max_body_bytes: int) -> Any:
    """The request's JSON body, or BadRequest: 415 not JSON, 413 too large, 400 unparsable."""
    if request.content_type != "application/json":
        raise BadRequest(415, f"the body must be application/json, got {request.content_type!r}")
    if request.content_length is not None and request.content_length > max_body_bytes:
        raise BadRequest(413, f"the body is {request.content_length} bytes, more than the "
                              f"{max_body_bytes} this server accepts (--max-body-bytes)")
    raw = await request.read()  # aiohttp raises 413 past client_max_size (chunked bodies)
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise BadRequest(400, "the JSON body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise BadRequest(400, f"the body is not valid JSON: {exc}") from None


def _check_text(body: dict, name: str, *, required: bool, max_chars: int) -> str:
    value = body.get(name, None if required else "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise BadRequest(400, f"'{name}' must be a {'non-empty ' if required else ''}string", name)
    if required and not any(ch.isprintable() and not ch.isspace() for ch in value):
        # NULs and other control characters strip() keeps: nothing a talker can speak.
        raise BadRequest(400, f"'{name}' holds no visible characters (only control characters or spaces)", name)
    if len(value) > max_chars:
        raise BadRequest(400, f"'{name}' has {len(value)} characters, more than the {max_chars} "
                              f"this server accepts (--max-input-chars)", name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(400, f"'{name}' is not valid Unicode (a lone surrogate)", name) from None
    return value


def parse_speech_body(body: Any, model_name: str, *, max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
                      ref_audio_limit_seconds: float | None = None) -> SpeechSpec:
    """Validate a request body; raises BadRequest (400, or 404 for an unknown model).
    `ref_audio_limit_seconds`: see parse_ref_audio."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    text = _check_text(body, "input", required=True, max_chars=max_input_chars)
    model = body.get("model", model_name)
    if model != model_name and model not in MODEL_ALIASES:
        raise BadRequest(404, f"model {model!r} does not exist; this server serves {model_name!r} "
                              f"(also as {', '.join(MODEL_ALIASES)})", "model", code="model_not_found")
    fmt = body.get("response_format", "mp3")
    if fmt not in FORMATS:
        raise BadRequest(400, f"unsupported response_format {fmt!r}; valid: {', '.join(FORMATS)}",
                         "response_format")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in STREAM_FORMATS:
        raise BadRequest(400, f"unsupported stream_format {stream_format!r}; valid: "
                         f"{', '.join(STREAM_FORMATS)}", "stream_format")
    stream, seed = body.get("stream", True), body.get("seed", 42)
    if not isinstance(stream, bool):
        raise BadRequest(400, "'stream' must be true or false", "stream")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < MAX_SEED:
        raise BadRequest(400, "'seed' must be an integer in [0, 2**63)", "seed")
    speed = body.get("speed", 1.0)
    low, high = SPEED_RANGE
    if not isinstance(speed, (int, float)) or isinstance(speed, bool) or not low <= speed <= high:
        # The stages synthesize at one speed; the answer is time-stretched (tts_bench.wire.encode).
        raise BadRequest(400, f"'speed' must be a number from {low:g} to {high:g}, got {speed!r}", "speed")
    voice = body.get("voice")
    if voice is not None and not isinstance(voice, str):
        # OpenAI clients always send one; the voice here is `ref_audio` (or the server's default),
        # so a name is accepted and unused, but a non-string is a malformed request.
        raise BadRequest(400, f"'voice' must be a string, got {type(voice).__name__}", "voice")
    ref = _check_text(body, "ref_text", required=False, max_chars=max_input_chars)
    sse = stream_format == "sse"
    audio = parse_ref_audio(body.get("ref_audio"), limit_seconds=ref_audio_limit_seconds)
    return SpeechSpec(text, fmt, stream or sse, sse, seed, ref, audio, float(speed))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as OpenAI-style JSON: BadRequest as given, aiohttp's HTTP errors (404, 405,
    413) with their status, anything else a 500 (a server bug: logged with its traceback)."""
    try:
        return await handler(request)
    except BadRequest as exc:
        return error_response(exc.status, str(exc), code=exc.code, param=exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like are answers, not errors
            raise
        message = exc.text if exc.text and not exc.text.startswith("<") else exc.reason
        return error_response(exc.status, message, code=_CODES.get(exc.status, "http_error"))
    except (asyncio.CancelledError, ConnectionResetError):
        raise  # the client went away: nobody to answer
    except Exception:
        log.exception("internal error serving %s %s", request.method, request.path)
        return error_response(500, "internal server error; see the server's log",
                              code="internal_error")
