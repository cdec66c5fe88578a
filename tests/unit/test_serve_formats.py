"""Every OpenAI `response_format` from `tts-bench serve`, streamed and whole: through the
official OpenAI SDK, `curl` and the `http` backend, each answer decoded (soundfile for wav and
flac, PyAV for the rest) and checked for its length and rate; `speed` as a time-stretch that
keeps the pitch; OpenAI's model names as aliases."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest

from tts_bench.backends.http import HttpBackend
from tts_bench.config import BenchConfig, SyntheticConfig, load_config
from tts_bench.serve.app import running_server
from tts_bench.wire.decode import CompressedDecoder
from tts_bench.wire.encode import FORMATS, AudioEncoder, output_rate, tempo_steps

RATE = 22050  # piper's rate: pcm must come back at 24 kHz, opus at 48 kHz
TEXT = "one two three four five six seven"  # 7 words x 0.1 s = 0.7 s of synthetic audio
SECONDS = 0.7
SYNTH = BenchConfig(backend="synthetic", synthetic=SyntheticConfig(
    chunk_seconds=0.1, first_chunk_delay_s=0.002, chunk_delay_s=0.002, seconds_per_word=0.1,
    sample_rate=RATE))


def sine(seconds: float, rate: int = RATE, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def decode(fmt: str, data: bytes, rate: int | None = None, *, streamed: bool = False) -> tuple[np.ndarray, int]:
    """A whole answer -> (float32 mono, rate): soundfile for wav and whole flac, PyAV for the rest
    (a streamed flac has no sample count in its header, which soundfile needs)."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767, rate or 24000
    if fmt == "wav" or (fmt == "flac" and not streamed):
        import soundfile

        samples, sr = soundfile.read(io.BytesIO(data), dtype="float32")
        return samples, sr
    import av

    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().mean(axis=0) for f in container.decode(audio=0)]
        return np.concatenate(frames).astype(np.float32), container.streams.audio[0].sample_rate


def peak_hz(samples: np.ndarray, rate: int) -> float:
    return float(np.argmax(np.abs(np.fft.rfft(samples))) * rate / len(samples))


def check(fmt: str, data: bytes, seconds: float = SECONDS, *, streamed: bool) -> None:
    samples, sr = decode(fmt, data, streamed=streamed)
    assert sr == output_rate(fmt, RATE), (fmt, sr)
    # codec padding: up to a frame or two (mp3 1152, aac 1024 samples) at either end
    assert len(samples) / sr == pytest.approx(seconds, abs=0.12), (fmt, len(samples) / sr)


@pytest.fixture(scope="module")
def url():
    with running_server(SYNTH) as server:
        yield server.url


# ---------------------------------------------------------------- the codecs alone


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_streamed_chunk_by_chunk_decodes_incrementally_to_the_same_length_and_pitch(fmt):
    x = sine(2.0)
    enc = AudioEncoder(fmt, RATE)
    parts = [enc.feed(x[i:i + 2205]) for i in range(0, len(x), 2205)] + [enc.finish()]
    assert sum(1 for p in parts[:-1] if p) >= 5, "the encoder streams: bytes before the end"
    if fmt in ("mp3", "aac", "flac", "opus"):
        dec = CompressedDecoder(fmt)
        y = np.concatenate([dec.feed(p) for p in parts] + [dec.finish()])
        sr = dec.sample_rate
    else:
        y, sr = decode(fmt, b"".join(parts), streamed=True)
    assert sr == output_rate(fmt, RATE)
    assert len(y) / sr == pytest.approx(2.0, abs=0.1)
    assert peak_hz(y, sr) == pytest.approx(220, abs=2)


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 2.0, 4.0])
def test_speed_stretches_the_duration_and_keeps_the_pitch(speed):
    enc = AudioEncoder("wav", RATE, speed=speed, streaming=False)
    y, sr = decode("wav", enc.feed(sine(2.0)) + enc.finish())
    assert len(y) / sr == pytest.approx(2.0 / speed, rel=0.03)
    assert peak_hz(y, sr) == pytest.approx(220, abs=3)


def test_tempo_steps_stay_in_atempos_tuned_range():
    for speed in (0.25, 0.3, 1.0, 3.0, 4.0):
        steps = tempo_steps(speed)
        assert all(0.5 <= s <= 2.0 for s in steps) and np.prod(steps) == pytest.approx(speed)


# ---------------------------------------------------------------- through the server


def test_openai_model_names_are_listed_as_aliases_and_served(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
        ids = [m["id"] for m in json.load(resp)["data"]]
    assert ids[0] == SYNTH.http.model and {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)
    for model in ("tts-1", "gpt-4o-mini-tts"):
        req = urllib.request.Request(url + "/v1/audio/speech", data=json.dumps(
            {"model": model, "input": TEXT, "voice": "alloy"}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"] == "audio/mpeg"  # the OpenAI default format
            assert resp.headers.get("Transfer-Encoding") == "chunked"  # streamed by default
            check("mp3", resp.read(), streamed=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_openai_sdk_gets_every_format_streamed_and_whole(url, fmt):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format=fmt) as resp:
        pieces = list(resp.iter_bytes(1024))
        assert resp.headers.get("transfer-encoding") == "chunked"
    check(fmt, b"".join(pieces), streamed=True)
    whole = client.audio.speech.create(model="gpt-4o-mini-tts", voice="alloy", input=TEXT,
                                       response_format=fmt, speed=2.0, extra_body={"stream": False})
    assert whole.response.headers.get("content-length") == str(len(whole.content))
    check(fmt, whole.content, SECONDS / 2, streamed=False)


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this host")
@pytest.mark.parametrize("fmt", FORMATS)
def test_curl_gets_every_format_streamed_and_whole(url, fmt):
    for stream in (True, False):
        body = json.dumps({"model": "tts-1", "input": TEXT, "response_format": fmt, "stream": stream})
        out = subprocess.run(["curl", "-sS", "--fail", url + "/v1/audio/speech", "-H",
                              "Content-Type: application/json", "-d", body],
                             capture_output=True, timeout=30, check=True).stdout
        check(fmt, out, streamed=stream)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
@pytest.mark.parametrize("stream", [True, False])
def test_http_backend_decodes_compressed_answers_as_they_arrive(url, fmt, stream):
    cfg = load_config(None, ["backend=http", f"http.base_url={url}", f"http.response_format={fmt}"])
    cfg = dataclasses.replace(cfg, http=dataclasses.replace(cfg.http, stream=stream))
    from tts_bench.backends.base import SynthesisRequest

    async def main():
        backend = HttpBackend(cfg)
        await backend.start(replicas=1)
        try:
            return [c async for c in backend.synthesize(SynthesisRequest("r1", TEXT))]
        finally:
            await backend.stop()

    chunks = asyncio.run(main())
    assert {c.sample_rate for c in chunks} == {output_rate(fmt, RATE)}
    seconds = sum(len(c.samples) for c in chunks) / chunks[0].sample_rate
    assert seconds == pytest.approx(SECONDS, abs=0.12)
    if stream and fmt != "flac":  # FFmpeg's FLAC parser holds a few frames back
        assert len(chunks) >= 3
