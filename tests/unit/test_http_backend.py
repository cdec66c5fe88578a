"""The `http` backend against `tts-bench serve` (synthetic backend) and against broken servers.

Everything runs on 127.0.0.1 with ephemeral ports inside one `asyncio.run` per test; the fault
servers are a few lines of raw asyncio so their misbehaviour is exact (a dropped connection, a
stall), and every loop ends by itself (bounded request counts, timeouts under a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import urllib.request

import numpy as np
import pytest

from tts_bench.backends import make_backend
from tts_bench.backends.base import AudioChunk, RequestFailed, SynthesisRequest
from tts_bench.backends.http import HttpBackend, api_root
from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.config import BenchConfig, HttpConfig, SyntheticConfig, load_config
from tts_bench.errors import BackendError, ConfigError
from tts_bench.load.loadgen import run_phase
from tts_bench.rundir.records import Job, PhaseLabels
from tts_bench.serve.app import SpeechServer, running_server

TEXT = "one two three four five six seven"
SYNTH = SyntheticConfig(chunk_seconds=0.1, first_chunk_delay_s=0.002, chunk_delay_s=0.002,
                        seconds_per_word=0.1, sample_rate=24000)  # pcm's rate: no resampling


def server_cfg(**synthetic) -> BenchConfig:
    return BenchConfig(backend="synthetic", synthetic=dataclasses.replace(SYNTH, **synthetic))


def client_cfg(url: str, timeout_s: float = 5.0, **http) -> BenchConfig:
    cfg = load_config(None, ["backend=http", f"http.base_url={url}", f"bench.timeout_s={timeout_s}"])
    return dataclasses.replace(cfg, http=dataclasses.replace(cfg.http, **http))


def jobs(n: int) -> list[Job]:
    return [Job(SynthesisRequest(f"r{i}", TEXT, seed=i), f"u{i}") for i in range(n)]


async def phase(backend, n: int = 6, concurrency: int = 3, timeout_s: float = 5.0):
    labels = PhaseLabels("a", f"{concurrency}x1", 0)
    return (await run_phase(backend, jobs(n), concurrency=concurrency, labels=labels,
                            timeout_s=timeout_s)).records


@contextlib.asynccontextmanager
async def serving(cfg: BenchConfig, backend=None):
    server = SpeechServer(cfg, port=0)
    if backend is not None:
        server.backend = backend
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def client(url: str, **kw):
    backend = HttpBackend(client_cfg(url, **kw))
    await backend.start(replicas=1)
    try:
        yield backend
    finally:
        await backend.stop()


# ---------------------------------------------------------------- against tts-bench serve


@pytest.mark.parametrize("fmt,stream,http", [
    # The server's pcm is 24 kHz, the synthetic backend's rate here, so no resampling: the
    # bytes are exactly the in-process samples. SSE carries bare PCM at http.sample_rate.
    ("pcm", True, {}), ("wav", True, {}), ("wav", False, {}), ("pcm", False, {}),
    ("pcm", True, {"extra_body": {"stream_format": "sse"}}),
])
def test_audio_over_http_is_bit_identical_to_in_process(fmt, stream, http):
    async def main():
        local = SyntheticBackend(server_cfg())
        await local.start(1)
        expected = await phase(local, n=2)
        async with serving(server_cfg()) as server, client(
                server.url, response_format=fmt, stream=stream, **http) as backend:
            return expected, await phase(backend, n=2)

    expected, got = asyncio.run(main())
    assert [r.failure_kind for r in got] == [None, None]
    assert {r.audio_sha256 for r in got} == {r.audio_sha256 for r in expected}
    assert got[0].audio_seconds == pytest.approx(0.7)
    # Streamed: about one chunk per backend chunk (TCP may merge or split reads); else one.
    assert all(r.num_chunks >= 3 if stream else r.num_chunks == 1 for r in got)


def test_registry_builds_the_http_backend_and_base_url_may_end_in_v1():
    assert isinstance(make_backend(client_cfg("http://127.0.0.1:9")), HttpBackend)
    assert api_root("http://h:1/v1/") == api_root("http://h:1") == "http://h:1/v1"
    assert api_root("https://h/proxy/v1?a=b") == api_root("https://h/proxy/") == "https://h/proxy/v1"


def test_request_body_carries_extra_fields_last():
    backend = HttpBackend(client_cfg("http://127.0.0.1:9", extra_body={"ref_text": "hi", "voice": "b"}))
    body = backend.request_body(SynthesisRequest("r", "Hello."))
    assert body == {"model": HttpConfig().model, "input": "Hello.", "voice": "b",
                    "response_format": "pcm", "stream": True, "ref_text": "hi"}


def test_server_500s_are_counted_with_their_status_and_the_run_completes():
    async def main():
        async with serving(server_cfg(fail_every=2)) as server, client(server.url) as backend:
            return await phase(backend, n=6)

    records = asyncio.run(main())
    failed = [r for r in records if not r.ok]
    assert len(records) == 6 and len(failed) == 3
    assert {r.failure_kind for r in failed} == {"http_error"}
    assert all(r.failure_detail.startswith("HTTP 500: ") and "fail_every=2" in r.failure_detail
               for r in failed)


def test_unknown_model_is_an_http_404_failure():
    async def main():
        async with serving(server_cfg()) as server, client(server.url, model="nope") as backend:
            return await phase(backend, n=1)

    (rec,) = asyncio.run(main())
    assert rec.failure_kind == "http_error" and rec.failure_detail.startswith("HTTP 404: ")


class _FailsAfterOneChunk(SyntheticBackend):
    async def synthesize(self, request):
        yield AudioChunk(np.zeros(160, np.float32), 24000)
        raise RequestFailed("backend_error", "stage died")


def test_server_drops_the_connection_when_a_request_fails_after_audio_was_sent():
    async def main():
        async with serving(server_cfg(), _FailsAfterOneChunk(server_cfg())) as server, \
                client(server.url) as backend:
            return await phase(backend, n=2), server.counters

    records, counters = asyncio.run(main())
    assert all(r.failure_kind == "connection_error" for r in records)
    assert all(r.failure_detail.startswith("dropped after 320 bytes")
               for r in records)
    assert counters["request_failures_total"] == 2 and counters["requests_in_flight"] == 0


def test_a_slow_server_times_out_and_the_abandoned_request_stops_in_the_backend():
    async def main():
        async with serving(server_cfg(chunk_delay_s=0.2)) as server, \
                client(server.url, timeout_s=0.15) as backend:
            records = await phase(backend, n=2, concurrency=2, timeout_s=0.15)
            for _ in range(50):  # the server notices the disconnect within a few loop turns
                if server.backend.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            return records, server.backend.in_flight, server.counters

    records, in_flight, counters = asyncio.run(main())
    assert all(r.failure_kind == "timeout" and r.failure_detail.startswith("no end of audio after 0.15 s")
               for r in records)
    assert in_flight == 0 and counters["request_failures_total"] == 0  # the client left, no fault


class _RecordsIds(SyntheticBackend):
    def __init__(self, cfg: BenchConfig) -> None:
        super().__init__(cfg)
        self.ids: list[str] = []

    async def synthesize(self, request):
        self.ids.append(request.request_id)
        yield AudioChunk(np.zeros(16, np.float32), 16000)


def test_the_server_runs_each_request_under_the_clients_request_id():
    # The embedded runner seeds code2wav noise from the request id: same id, same audio.
    async def main():
        backend = _RecordsIds(server_cfg())
        async with serving(server_cfg(), backend) as server, client(server.url) as http:
            await phase(http, n=3)
        return backend.ids

    assert sorted(asyncio.run(main())) == ["r0", "r1", "r2"]


def test_models_and_metrics_endpoints_feed_describe_and_memory_snapshot():
    with running_server(server_cfg(), replicas=2) as server:
        backend = HttpBackend(client_cfg(server.url))

        async def main():
            await backend.start(replicas=2)
            await phase(backend, n=2)
            described = backend.describe()
            await backend.stop()
            return described

        described = asyncio.run(main())
        rows = backend.memory_snapshot()  # blocking scrape of /metrics, outside any loop
        with urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics", timeout=5) as resp:
            content_type = resp.headers["Content-Type"]
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"  # what Prometheus asks for
    model = described["server_models"][0]  # then OpenAI's names, aliases of it
    assert model["id"] == HttpConfig().model and model["tts_bench"]["backend"] == "synthetic"
    assert model["tts_bench"]["replicas"] == 2
    assert rows[0]["process"] == "serve" and rows[0]["rss_bytes"] > 10 * 2**20


# ---------------------------------------------------------------- against broken servers


def test_serving_on_a_taken_port_is_a_clear_error_and_stops_the_backend():
    async def main():
        async with serving(server_cfg()) as first:
            second = SpeechServer(server_cfg(), port=first.port)
            # Checked before the backend starts (the embedded one takes minutes on a GPU): exit 2.
            with pytest.raises(ConfigError, match=r"^error: cannot listen on 127\.0\.0\.1:\d+ .*--port"):
                await second.start()
            return second.backend.started

    assert asyncio.run(main()) is False


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_start_against_a_closed_port_raises_a_clear_backend_error():
    backend = HttpBackend(client_cfg(f"http://127.0.0.1:{_closed_port()}"))
    with pytest.raises(BackendError, match=r"^error: cannot reach the speech server .*http.base_url"):
        asyncio.run(backend.start(replicas=1))


async def _raw_server(on_speech):
    """A bare HTTP/1.1 server: /v1/models answers an empty list; speech requests go to
    `on_speech(reader, writer)` after the request has been read."""

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if b"/v1/models" in head.split(b"\r\n")[0]:
                    body = json.dumps({"data": []}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                await on_speech(reader, writer)
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _one_chunk_then_close(reader, writer):
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/pcm\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + b"65\r\n" + b"\x00" * 0x65 + b"\r\n")  # 101 bytes: 50 samples + a carried byte
    await writer.drain()


async def _stall(reader, writer):
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/pcm\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"4\r\n\x00\x00\x00\x00\r\n")
    await writer.drain()
    await reader.read()  # until the client gives up and closes the connection


@pytest.mark.parametrize("behaviour,kind,detail", [
    (_one_chunk_then_close, "connection_error", "dropped after 101 bytes"),
    (_stall, "timeout", "no end of audio after 0.3 s"),
])
def test_broken_responses_become_counted_failures_of_their_kind(behaviour, kind, detail):
    async def main():
        server, url = await _raw_server(behaviour)
        async with server, client(url, timeout_s=0.3) as backend:
            records = await phase(backend, n=4, concurrency=2, timeout_s=0.3)
        return records

    records = asyncio.run(main())
    assert len(records) == 4
    assert all(r.failure_kind == kind and r.failure_detail.startswith(detail) for r in records), \
        [(r.failure_kind, r.failure_detail) for r in records]


def test_a_server_that_goes_away_mid_run_makes_connection_errors():
    async def main():
        async with serving(server_cfg()) as server:
            backend = HttpBackend(client_cfg(server.url))
            await backend.start(replicas=1)
        try:  # the server is gone now: every request fails to connect, the phase still ends
            return await phase(backend, n=3)
        finally:
            await backend.stop()

    records = asyncio.run(main())
    assert [r.failure_kind for r in records] == ["connection_error"] * 3
    assert all(r.failure_detail.startswith("cannot connect") for r in records)


class _SizesForConcurrency(SyntheticBackend):
    def __init__(self, cfg: BenchConfig) -> None:
        super().__init__(cfg)
        self.calls: list[tuple[str, int]] = []

    def expect_concurrency(self, concurrency: int) -> None:
        self.calls.append(("expect", concurrency))

    async def start(self, replicas: int) -> None:
        self.calls.append(("start", replicas))
        await super().start(replicas)


@pytest.mark.parametrize("concurrency, calls", [(24, [("expect", 24), ("start", 1)]), (None, [("start", 1)])])
def test_serve_tells_the_backend_the_expected_concurrency_before_it_starts(concurrency, calls):
    backend = _SizesForConcurrency(server_cfg())
    with running_server(server_cfg(), backend=backend, concurrency=concurrency):
        pass
    assert backend.calls == calls


def test_serve_config_checks_memory_at_the_expected_concurrency_or_the_talkers_limit(tmp_path, monkeypatch):
    from tts_bench import preflight
    from tts_bench.serve import app

    checked, served = [], []
    monkeypatch.setattr(preflight, "check_memory", lambda cfg, **kw: checked.append(kw["concurrency"]))

    async def serve_until_signalled(cfg, **kw):
        served.append(kw["concurrency"])

    monkeypatch.setattr(app, "serve_until_signalled", serve_until_signalled)
    config = tmp_path / "synthetic.yaml"
    config.write_text("backend: synthetic\n")
    app.serve_config(config, concurrency=12)
    app.serve_config(config)
    limit = BenchConfig().stages.runner.talker_max_batch
    assert checked == [12, limit] and served == [12, None]


def test_a_request_the_server_calls_its_own_fault_keeps_the_servers_kind():
    # tts-bench serve answers OpenAI-style JSON with error.code; a 400 `invalid_request` (too
    # long an input) and a 413 for a voice too large are the request's fault, counted as the
    # embedded backend counts them, not as a server's http_error.
    async def main():
        server = SpeechServer(server_cfg(), port=0, max_input_chars=8, max_body_bytes=2048)
        await server.start()
        try:
            async with client(server.url) as backend:
                async def one(request):
                    try:
                        async for _ in backend.synthesize(request):
                            pass
                    except RequestFailed as exc:
                        return exc.kind, str(exc)
                    return None, ""
                long_text = await one(SynthesisRequest("r1", "far too long for eight characters"))
                big_voice = await one(SynthesisRequest("r2", "Hi.", prompt_audio=b"RIFF" + bytes(4096)))
        finally:
            await server.stop()
        return long_text, big_voice

    (kind1, detail1), (kind2, detail2) = asyncio.run(main())
    assert kind1 == "invalid_request" and "HTTP 400: " in detail1 and "--max-input-chars" in detail1
    assert kind2 == "bad_prompt" and "HTTP 413: " in detail2
