"""Per-request reference voices in the harness: the request's prompt wav reaches the stages
(embedded), goes over the wire as vllm-omni's ref_audio/ref_text (http), is checked at the
server's edge (serve), and the records and aggregates show the voice cache."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import numpy as np
import pytest

from stages.runner.fakes import fake_factories
from tts_bench.backends.base import AudioChunk, RequestFailed, SynthesisRequest
from tts_bench.backends.embedded import EmbeddedBackend, _runner_request
from tts_bench.backends.http import HttpBackend
from tts_bench.config import BenchConfig, HttpConfig, load_config
from tts_bench.load.loadgen import run_phase
from tts_bench.load.metrics import aggregate
from tts_bench.rundir.records import Job, PhaseLabels
from tts_bench.serve.request import BadRequest, parse_ref_audio, parse_speech_body

ROOT = Path(__file__).resolve().parents[2]
VOICE = ROOT / "tts_bench/data/seed-tts-en/prompts/ref_0.wav"


def test_the_prompt_wav_reaches_the_stages_as_its_bytes():
    req = _runner_request(SynthesisRequest("r", "Hello.", prompt_wav=VOICE, seed=3))
    assert req.prompt_audio == VOICE.read_bytes() and req.seed == 3
    assert _runner_request(SynthesisRequest("r", "Hello.")).prompt_audio is None  # default voice
    inline = _runner_request(SynthesisRequest("r", "x", prompt_wav=VOICE, prompt_audio=b"RIFF..."))
    assert inline.prompt_audio == b"RIFF..."  # audio given with the request wins over a path


def test_an_unreadable_prompt_wav_is_a_bad_prompt_failure(tmp_path):
    with pytest.raises(RequestFailed) as info:
        SynthesisRequest("r", "x", prompt_wav=tmp_path / "missing.wav").voice()
    assert info.value.kind == "bad_prompt" and "missing.wav" in info.value.detail


def test_the_embedded_backend_records_voice_hits_and_bad_voices():
    backend = EmbeddedBackend(BenchConfig(), factories=fake_factories())

    async def main():
        await backend.start(1)
        try:
            jobs = [Job(SynthesisRequest(f"r{i}", "some words", prompt_wav=VOICE, seed=i), f"u{i}") for i in range(3)]
            jobs.append(Job(SynthesisRequest("bad", "words", prompt_audio=b"BAD voice"), "ub"))
            return await run_phase(backend, jobs, concurrency=1, labels=PhaseLabels("a", "1x1", 0), timeout_s=30)
        finally:
            await backend.stop()

    records = {r.request_id: r for r in asyncio.run(main()).records}
    assert records["bad"].failure_kind == "bad_prompt"
    assert [records[f"r{i}"].prompt_cache_hit for i in range(3)] == [False, True, True]
    agg = aggregate(records.values())
    assert (agg.prompt_cache_hits, agg.prompt_cache_misses, agg.failed_by_kind) == (2, 1, {"bad_prompt": 1})
    assert agg.mean_audio_ttfp_ms_hit is not None and agg.mean_prompt_setup_ms == 1.0


def test_the_http_backend_sends_the_voice_as_ref_audio_and_ref_text():
    backend = HttpBackend(BenchConfig(http=HttpConfig()))
    body = backend.request_body(SynthesisRequest("r", "Hello.", prompt_text="Its words.", prompt_wav=VOICE))
    assert body["ref_text"] == "Its words."
    assert body["ref_audio"].startswith("data:audio/wav;base64,")
    assert base64.b64decode(body["ref_audio"].split(",", 1)[1]) == VOICE.read_bytes()
    plain = HttpBackend(BenchConfig(http=HttpConfig(send_voice=False)))
    assert "ref_audio" not in plain.request_body(SynthesisRequest("r", "x", prompt_wav=VOICE))
    assert "ref_audio" not in backend.request_body(SynthesisRequest("r", "x"))  # no voice: none sent


def test_a_prompt_wav_is_read_and_encoded_once_not_per_request(tmp_path, monkeypatch):
    voice, other = tmp_path / "v.wav", tmp_path / "w.wav"
    for path in (voice, other):
        path.write_bytes(VOICE.read_bytes())
    reads = []
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or read_bytes(self))
    backend = HttpBackend(BenchConfig(http=HttpConfig()))
    bodies = [backend.request_body(SynthesisRequest(f"r{i}", "x", prompt_wav=voice)) for i in range(3)]
    assert reads == [voice] and bodies[0]["ref_audio"] is bodies[2]["ref_audio"]
    voices = [SynthesisRequest(f"e{i}", "x", prompt_wav=other).voice() for i in range(2)]  # embedded's
    assert reads == [voice, other] and voices[0] is voices[1]
    given = backend.request_body(SynthesisRequest("d", "x", prompt_wav=voice, prompt_audio=b"RIFF.."))
    assert base64.b64decode(given["ref_audio"].split(",", 1)[1]) == b"RIFF.."  # bytes win, uncached


def test_serve_takes_ref_audio_as_base64_or_a_data_url_and_refuses_what_is_not_audio():
    raw = VOICE.read_bytes()
    b64 = base64.b64encode(raw).decode()
    assert parse_ref_audio(b64) == raw == parse_ref_audio("data:audio/wav;base64," + b64)
    spec = parse_speech_body({"input": "Hi.", "ref_audio": b64, "ref_text": "t"}, "minicpmo45")
    assert spec.prompt_audio == raw and spec.prompt_text == "t"
    for bad, what in ((base64.b64encode(b"a text file named x.wav").decode(), "cannot decode reference audio (ref_audio)"),
                      ("%%%", "not valid base64"), (5, "must be a base64 string"),
                      ("data:audio/wav," + b64, "must be base64")):
        with pytest.raises(BadRequest) as info:
            parse_ref_audio(bad)
        assert info.value.status == 400 and info.value.param == "ref_audio" and what in str(info.value)


def test_serve_takes_a_flac_voice_and_refuses_an_empty_one_as_the_stages_would():
    import io

    import soundfile

    from stages.audio import decode_audio

    wav, rate = decode_audio(VOICE)
    buf = io.BytesIO()
    soundfile.write(buf, wav.T, rate, format="FLAC")
    assert parse_ref_audio(base64.b64encode(buf.getvalue()).decode()) == buf.getvalue()
    empty = io.BytesIO()
    soundfile.write(empty, wav[:, :0].T, rate, format="WAV", subtype="PCM_16")
    with pytest.raises(BadRequest, match=r"reference audio is empty \(ref_audio\)") as info:
        parse_ref_audio(base64.b64encode(empty.getvalue()).decode())
    assert info.value.status == 400


def test_metrics_exposition_carries_the_voices_a_stage_holds():
    from tts_bench.wire.exposition import memory_rows, parse, render

    rows = [{"process": "code2wav-0", "pid": 7, "source": "rss", "allocated_bytes": 5,
             "prompt_cache_entries": 3, "prompt_cache_bytes": 4096}]
    text = render(rows, rss_bytes=1, counters={})
    # prometheus_client writes labels in sorted order
    assert 'tts_bench_stage_prompt_cache_bytes{pid="7",process="code2wav-0",source="rss"} 4096.0' in text
    (_, stage) = memory_rows(parse(text))
    assert stage["prompt_cache_entries"] == 3 and stage["prompt_cache_bytes"] == 4096


def _prompts():
    from tts_bench.inputs.prompts import load_prompts

    return load_prompts("builtin:seed-tts-en")[:4]


def test_voice_modes_give_each_request_its_file_one_voice_a_unique_voice_or_none():
    from tts_bench.load.plan import plan_jobs

    prompts = _prompts()
    labels = PhaseLabels("a", "2x1", 0)

    def voices(mode, arm="a"):
        _, measured = plan_jobs(prompts, PhaseLabels(arm, "2x1", 0), seed=0, warmup=0, voices=mode)
        return [(j.request.prompt_wav, j.request.prompt_audio) for j in measured]

    assert voices("file") == [(p.prompt_wav, None) for p in prompts]
    assert voices("one") == [(prompts[0].prompt_wav, None)] * 4
    assert voices("default") == [(None, None)] * 4
    distinct = [audio for _, audio in voices("distinct")]
    assert len(set(distinct)) == 4 and voices("distinct", arm="b") == voices("distinct")  # arms agree
    from stages.audio import decode_audio

    nudged, rate = decode_audio(distinct[0])
    original, _ = decode_audio(prompts[0].prompt_wav)
    assert rate == 24000 and nudged.shape == original.shape
    diff = np.abs(nudged - original)
    assert 0 < diff.max() <= 15 / 32768 and (diff[..., 8:] == 0).all()  # a few LSBs of 8 samples
    assert labels.arm == "a"


def test_the_ab_view_over_voice_cache_misses_keeps_only_those_requests(tmp_path):
    from tts_bench.ab import voice_cache_view
    from tts_bench.config import parse_tiers
    from tts_bench.rundir.records import RequestRecord
    from tts_bench.rundir.results import RunDir

    arms = {"base": BenchConfig(), "test": BenchConfig()}
    run = RunDir.create(tmp_path, "ab", command_line=["x"], configs={a: {} for a in arms})
    for arm in arms:
        for rep in range(2):
            for i in range(4):
                run.append_request(RequestRecord(
                    arm, "2x1", rep, f"{arm}:2x1:r{rep}:{i:04d}", f"u{i}", False, "p", 0.0, 1.0,
                    audio_ttfp_ms=100.0 + i, audio_rtf=0.5 + 0.01 * i, audio_seconds=1.0,
                    prompt_cache_hit=i > 0, prompt_setup_ms=None if i else 30.0).to_dict())
    view, kept, measured = voice_cache_view(run, arms, parse_tiers("2x1"), "miss")
    assert (kept, measured) == (4, 16)
    assert all(a.completed == 2 for a in view.tiers[0].arms.values())
    assert view.tiers[0].arms["base"].prompt_cache_misses == 2


@pytest.mark.parametrize(
    "body, param, said",
    [({"input": "\x00\x00\x01"}, "input", "no visible characters"),
     ({"input": "Hi.", "voice": 123}, "voice", "'voice' must be a string, got int"),
     ({"input": "Hi.", "voice": ["alloy"]}, "voice", "got list")],
)
def test_bodies_with_nothing_to_speak_or_a_malformed_voice_are_400(body, param, said):
    with pytest.raises(BadRequest, match=said) as exc:
        parse_speech_body(body, "minicpmo45")
    assert exc.value.status == 400 and exc.value.param == param
    assert parse_speech_body({"input": "Hi.", "voice": "alloy"}, "minicpmo45").text == "Hi."  # named, unused
