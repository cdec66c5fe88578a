"""Requests aiohttp refuses before the app sees them, answered in the server's own words.

A malformed request (a header over 8,190 bytes, no Host, `Content-Length: -5`, a bad chunk
size, a garbage request line, TLS bytes on the HTTP port) fails in aiohttp's parser, before
routing and middlewares: aiohttp answers it from `RequestHandler.handle_error` with a plain-text
400 and logs it with `logger.exception`, a full traceback per request, so any client could
flood the server's log. aiohttp has no hook for this (aio-libs/aiohttp#3287 is open), so the
protocol class is ours: `handle_error` answers a client error (< 500) as OpenAI-style JSON
(`tts_bench.serve.request.error_response`, code `bad_http_request`) and logs one line, without a
traceback. A 500 there is a server bug and keeps aiohttp's answer and traceback.

Landmine: the handler class is fixed inside `web.Server.__call__`, so `JsonErrorRunner` swaps
the runner's server to a subclass whose `__call__` builds ours from the same arguments
(`_loop`, `_kwargs`: aiohttp internals, stable since 3.0). tests/cli/test_serve_errors.py sends
each malformed request as raw bytes and fails if a newer aiohttp stops going through here.

    runner = JsonErrorRunner(app, access_log=None)
    await runner.setup()
"""

from __future__ import annotations

import logging
import re
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from tts_bench.serve.request import error_response

log = logging.getLogger(__name__)

_MAX_REASON = 200  # characters of the parser's message kept in the log line and the answer


def bad_request_reason(exc: BaseException | None, message: str | None) -> str:
    """The parser's complaint on one line (aiohttp's messages span lines and quote bytes)."""
    text = getattr(exc, "message", None) or message or (str(exc) if exc is not None else "") or "malformed"
    text = re.sub(r"\s+", " ", str(text)).strip()
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


class _JsonErrorHandler(RequestHandler):
    __slots__ = ()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:  # not the client's fault: aiohttp's answer and its traceback
            return super().handle_error(request, status, exc, message)
        reason = bad_request_reason(exc, message)
        log.warning("refused a malformed HTTP request from %s: %s (%s)", request.remote, reason,
                    type(exc).__name__ if exc is not None else "parser")
        if request.writer.output_size > 0:  # as aiohttp: a response already began, none can follow
            raise ConnectionError("response already started; cannot send the error")
        resp = error_response(status, f"malformed HTTP request: {reason}", code="bad_http_request")
        resp.force_close()  # the stream cannot be trusted after a parse error
        return resp


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer parser errors as JSON (see the docstring)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same state, our protocol factory
        return server
