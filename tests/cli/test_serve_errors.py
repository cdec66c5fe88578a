"""`tts-bench serve` answers every error as OpenAI-style JSON with the status that says whose
fault it is, and one bad request, or a dead stage process, never turns into a server that
answers 500 forever while /health says ok."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from stages.runner.fakes import fake_factories
from tts_bench.backends.base import RequestFailed
from tts_bench.backends.embedded import EmbeddedBackend
from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.config import load_config
from tts_bench.serve.app import running_server

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 60.0  # hang guards only
VOICE = ROOT / "tts_bench/data/seed-tts-en/prompts/ref_0.wav"
SYNTH = load_config(ROOT / "configs/ab/synthetic.yaml", [
    "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
    "synthetic.first_chunk_delay_s=0.01", "synthetic.chunk_delay_s=0.01"])


def call(url: str, body: bytes | None = None, *, content_type: str = "application/json",
         method: str | None = None, headers: dict | None = None) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


def speech(url: str, doc, **kw) -> tuple[int, bytes, str]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return call(url + "/v1/audio/speech", body, **kw)


def error_of(status_body_type) -> dict:
    status, body, content_type = status_body_type
    assert content_type.startswith("application/json"), (status, content_type, body[:200])
    doc = json.loads(body)
    assert set(doc["error"]) == {"message", "type", "param", "code"}, doc
    assert doc["error"]["type"] == ("invalid_request_error" if status < 500 else "server_error")
    return {"status": status, **doc["error"]}


@pytest.fixture(scope="module")
def url():
    with running_server(SYNTH, max_input_chars=200, max_body_bytes=4096) as server:
        yield server.url


@pytest.mark.parametrize(
    ("body", "kw", "status", "code", "param"),
    [
        (b"hello", {"content_type": "text/plain"}, 415, "unsupported_media_type", None),
        (b"{\"input\": \"" + b"a" * 8000 + b"\"}", {}, 413, "request_too_large", None),
        (b"[" * 2000 + b"]" * 2000, {}, 400, "invalid_request", None),  # RecursionError in json
        (b"{\"input\": ", {}, 400, "invalid_request", None),
        (b"\xff\xfe{}", {}, 400, "invalid_request", None),
        ({"input": "hi", "seed": 1180591620717411303424}, {}, 400, "invalid_request", "seed"),
        ({"input": "hi", "seed": -1}, {}, 400, "invalid_request", "seed"),
        ({"input": "hi", "seed": True}, {}, 400, "invalid_request", "seed"),
        ({"input": "x" * 201}, {}, 400, "invalid_request", "input"),
        ({"input": "\ud800 lone surrogate"}, {}, 400, "invalid_request", "input"),
        ({"input": ""}, {}, 400, "invalid_request", "input"),
        ({"input": "hi", "model": "gpt-5-tts"}, {}, 404, "model_not_found", "model"),
        (["not", "an", "object"], {}, 400, "invalid_request", None),
        ({"input": "hi", "ref_audio": "bm90IGF1ZGlv"}, {}, 400, "invalid_request", "ref_audio"),
        ({"input": "hi", "ref_audio": "%%%"}, {}, 400, "invalid_request", "ref_audio"),
        ({"input": "hi", "speed": 4.5}, {}, 400, "invalid_request", "speed"),
        ({"input": "hi", "speed": 0.2}, {}, 400, "invalid_request", "speed"),
        ({"input": "hi", "speed": "fast"}, {}, 400, "invalid_request", "speed"),
        ({"input": "hi", "speed": -1}, {}, 400, "invalid_request", "speed"),
    ],
)
def test_client_mistakes_are_4xx_json(url, body, kw, status, code, param):
    err = error_of(speech(url, body, **kw))
    assert (err["status"], err["code"], err["param"]) == (status, code, param), err


def test_speeds_in_openais_range_are_accepted(url):
    for speed in (1, 1.0, 0.25, 4.0):
        status, body, content_type = speech(url, {"input": "hi there", "speed": speed,
                                                  "response_format": "wav"})
        assert status == 200 and content_type.startswith("audio/wav") and len(body) > 44


class _RefusesEveryVoice:
    """A backend whose stages refuse the voice (bad_prompt), as the embedded one does for a
    `ref_audio` whose header is fine but whose samples cannot be decoded."""

    async def start(self, replicas: int) -> None: ...
    async def stop(self) -> None: ...
    def describe(self) -> dict:
        return {}

    async def synthesize(self, request):
        raise RequestFailed("bad_prompt", "cannot decode reference audio (ref_audio): truncated")
        yield  # an async generator, as backends are


def test_a_voice_the_stages_refuse_is_a_400_not_a_500():
    voice = base64.b64encode(VOICE.read_bytes()).decode()
    with running_server(SYNTH, backend=_RefusesEveryVoice()) as server:
        err = error_of(speech(server.url, {"input": "hi", "ref_audio": voice}))
    assert (err["status"], err["code"], err["param"]) == (400, "bad_prompt", "ref_audio"), err
    assert "truncated" in err["message"]


def test_a_voice_over_the_served_configs_limit_is_refused_at_the_edge():
    cfg = replace(SYNTH, stages=replace(SYNTH.stages, code2wav=replace(
        SYNTH.stages.code2wav, ref_audio_max_seconds=1.0, ref_audio_limit_seconds=2.0)))
    voice = base64.b64encode(VOICE.read_bytes()).decode()  # 6 s
    with running_server(cfg) as server:
        err = error_of(speech(server.url, {"input": "hi", "ref_audio": voice}))
    assert (err["status"], err["param"]) == (400, "ref_audio") and "more than 2 s" in err["message"], err


def test_a_chunked_body_over_the_limit_is_a_json_413(url):
    def chunks():
        yield b"{\"input\": \""
        for _ in range(10):
            yield b"a" * 1000
        yield b"\"}"

    req = urllib.request.Request(url + "/v1/audio/speech", data=chunks(), method="POST",
                                 headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    try:
        urllib.request.urlopen(req, timeout=30)
        raise AssertionError("accepted")
    except urllib.error.HTTPError as e:
        err = error_of((e.code, e.read(), e.headers.get("Content-Type", "")))
    assert err["status"] == 413 and err["code"] == "request_too_large"


def test_unknown_paths_and_methods_are_json_too(url):
    assert error_of(call(url + "/v1/nope"))["status"] == 404
    assert error_of(call(url + "/v1/audio/speech", method="GET"))["status"] == 405


class _Held(SyntheticBackend):
    """Holds a request whose text starts with "hold" before its first chunk until `release`."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.holding, self.release = threading.Event(), threading.Event()

    async def synthesize(self, request):
        if request.text.startswith("hold"):
            self.holding.set()
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, HANG_S)
        async for chunk in super().synthesize(request):
            yield chunk


def test_a_duplicate_request_id_in_flight_is_a_409():
    # Events, not a 0.15 s sleep: the second request is sent while the first is held in flight.
    backend, dup = _Held(SYNTH), {"X-Request-Id": "dup"}
    with running_server(SYNTH, backend=backend) as server:
        first: dict = {}
        held = {"input": "hold these words", "stream": True}
        thread = threading.Thread(target=lambda: first.update(r=speech(server.url, held, headers=dup)))
        thread.start()
        try:
            assert backend.holding.wait(HANG_S)
            err = error_of(speech(server.url, {"input": "hi"}, headers=dup))
        finally:
            backend.release.set()
            thread.join(HANG_S)
        assert err["status"] == 409 and err["code"] == "duplicate_request_id"
        assert first["r"][0] == 200
        deadline = time.monotonic() + HANG_S  # until the server has let the first go (a condition)
        while server.counters["requests_in_flight"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert speech(server.url, {"input": "hi"}, headers=dup)[0] == 200  # free again


def test_health_is_json_ok(url):
    status, body, _ = call(url + "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}


def embedded(**runner) -> tuple:
    cfg = load_config(None, ["backend=embedded", "runner.device=cpu", "runner.torch_threads=1",
                             *(f"runner.{k}={v}" for k, v in runner.items())])
    return cfg, EmbeddedBackend(cfg, factories=fake_factories(fail_text="REFUSE"))


def test_one_bad_request_fails_alone_and_the_next_succeeds():
    cfg, backend = embedded(max_seq_len=256)
    with running_server(cfg, backend=backend) as server:
        ok = {"input": "good morning everybody", "response_format": "pcm"}
        assert speech(server.url, ok)[0] == 200
        refused = error_of(speech(server.url, {"input": "please REFUSE this"}))
        assert refused["status"] == 500 and refused["code"] == "backend_error" and "REFUSE" in refused["message"]
        too_long = error_of(speech(server.url, {"input": " ".join(["word"] * 30)}))  # 300 codes > 256
        assert too_long["status"] == 400 and "runner.max_seq_len is 256" in too_long["message"]
        assert speech(server.url, ok)[0] == 200
        assert json.loads(call(server.url + "/health")[1]) == {"status": "ok"}


def test_a_dead_stage_process_makes_health_and_new_requests_503():
    cfg, backend = embedded()
    with running_server(cfg, backend=backend) as server:
        assert speech(server.url, {"input": "good morning"})[0] == 200
        os.kill(backend._runner.pids()["talker"], signal.SIGKILL)
        deadline = time.monotonic() + HANG_S  # until /health notices (a condition)
        while call(server.url + "/health")[0] != 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        health = error_of(call(server.url + "/health"))
        assert health["status"] == 503 and "talker exited with code -9" in health["message"]
        refused = error_of(speech(server.url, {"input": "good morning"}))
        assert refused["status"] == 503 and refused["code"] == "backend_unavailable"


def test_the_default_body_limit_fits_the_longest_voice_the_stages_take():
    # 60 s (code2wav.ref_audio_limit_seconds) of 48 kHz 16-bit stereo WAV, base64 in a JSON body.
    from stages.code2wav.config import Code2WavConfig
    from tts_bench.config.limits import MAX_BODY_BYTES

    wav_bytes = 44 + int(Code2WavConfig().ref_audio_limit_seconds * 48000) * 2 * 2
    body = 4 * -(-wav_bytes // 3) + len('{"input": "", "ref_audio": "data:audio/wav;base64,"}') + 4096
    assert body < MAX_BODY_BYTES


def test_a_taken_port_or_foreign_host_is_refused_before_the_backend_starts():
    import asyncio
    import socket

    from tts_bench.config import BenchConfig
    from tts_bench.errors import ConfigError
    from tts_bench.serve.app import SpeechServer

    class Backend:
        started = False

        async def start(self, replicas):
            Backend.started = True

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = SpeechServer(BenchConfig(), host="127.0.0.1", port=port, backend=Backend())
        with pytest.raises(ConfigError, match=rf"cannot listen on 127.0.0.1:{port} .*pick another --port"):
            asyncio.run(server.start())
    bad_host = SpeechServer(BenchConfig(), host="999.1.1.1", port=8091, backend=Backend())
    with pytest.raises(ConfigError, match="cannot listen on 999.1.1.1:8091"):
        asyncio.run(bad_host.start())
    assert Backend.started is False


# Requests aiohttp's parser refuses before the app (tts_bench.serve.protocol), as raw bytes.
MALFORMED = {
    "header over 8190 bytes": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    "missing host": b"GET /health HTTP/1.1\r\n\r\n",
    "negative content-length": b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    "bad chunk size": (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"zz\r\nabc\r\n0\r\n\r\n"),
    "garbage request line": b"\x01\x02garbage\r\n\r\n",
    "tls client hello": bytes.fromhex("16030100c4010000c00303") + b"\x00" * 40,
    "unknown http version": b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
}


def raw_exchange(url: str, data: bytes) -> bytes:
    import socket

    host, port = url.removeprefix("http://").rsplit(":", 1)
    assert host == "127.0.0.1"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_http_gets_openai_json_and_one_log_line_without_a_traceback(url, name, caplog):
    caplog.clear()
    def served() -> list:
        return [r for r in caplog.records if r.name.startswith(("aiohttp", "tts_bench.serve"))]

    with caplog.at_level(logging.DEBUG):
        answer = raw_exchange(url, MALFORMED[name])
        # The server thread logs as it answers: until its line is there (a condition; a fixed
        # 0.2 s could end first on a loaded box), then a moment for any second line to show.
        deadline = time.monotonic() + HANG_S
        while not served() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer[:300]
    assert b"content-type: application/json" in head.lower(), head
    doc = json.loads(body)
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    assert doc["error"]["code"] == "bad_http_request" and doc["error"]["message"].startswith("malformed HTTP request: ")
    records = served()
    assert len(records) == 1 and records[0].exc_info is None, [(r.name, r.getMessage()) for r in records]
    assert "refused a malformed HTTP request from 127.0.0.1: " in records[0].getMessage()
    assert "\n" not in records[0].getMessage()


def test_the_server_still_serves_after_malformed_requests(url):
    for data in MALFORMED.values():
        raw_exchange(url, data)
    assert call(url + "/health")[0] == 200
