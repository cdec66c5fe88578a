"""The tiny embedded runner's output depends on what it is given: voice, text and codes reach the
mel and the audio in `ab`, `wer` and `serve` (the CPU identity checks test code2wav, not only
the talker and the noise seed).

Each comparison pairs requests with the same text and seed, so only the named input differs,
and pairs a control that differs in nothing (identical mel and audio), so a difference cannot
come from nondeterminism. On random weights that erased the mel in HiFT (before D-INIT-1)
every "must differ" below failed: the audio depended on the noise seed and length alone.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from tests.cli.in_process import main_in_process
from tts_bench.config import load_config
from tts_bench.rundir.results import RunDir
from tts_bench.serve.app import running_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "tts_bench/data/seed-tts-en/prompts"
VOICE_A, VOICE_B = PROMPTS / "ref_0.wav", PROMPTS / "ref_1.wav"
TEXT = "the quiet river runs past the old mill"
OTHER_TEXT = "a bright lantern hung above the door"  # same word count: same codec length
TINY = ["--set", "runner.torch_threads=1", "--set", "runner.device=cpu"]


def _meta(tmp_path: Path, lines: list[tuple[str, Path, str]]) -> Path:
    meta = tmp_path / "meta.lst"
    meta.write_text("".join(f"{utt}|ref|{wav}|{text}\n" for utt, wav, text in lines))
    return meta


def _ab(tmp_path: Path, meta: Path, voices: str) -> dict[str, dict]:
    """One tiny `ab` run (1x1, two prompts in file order, no warmup): its base arm's records by
    prompt position."""
    proc = main_in_process(
        "ab", "--config", str(ROOT / "configs/ab/default.yaml"), "--tiers", "1x1", "--num-prompts", "2",
        "--repeats", "1", "--format", "json", "--result-dir", str(tmp_path / voices), *TINY,
        "--set", f"prompts.meta={meta}", "--set", "bench.disable_shuffle=true", "--set", "bench.warmup=0",
        "--set", f"prompts.voices={voices}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = RunDir.open(json.loads(proc.stdout)["run_dir"]).read_requests()
    return {r["request_id"].rsplit(":", 1)[1]: r for r in records if r["arm"] == "base"}


@pytest.fixture(scope="module")
def ab_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ab")
    # Position 1 speaks TEXT with voice B in `file` and voice A in `one`; position 0 speaks TEXT
    # with voice A in both (the control). Seeds follow the position, so they match across runs.
    meta = _meta(tmp, [("en_a", VOICE_A, TEXT), ("en_b", VOICE_B, TEXT)])
    return {mode: _ab(tmp, meta, mode) for mode in ("file", "one", "default")}


def _same(a: dict, b: dict, key: str) -> bool:
    assert a[key] and b[key], (key, a, b)
    return a[key] == b[key]


def test_ab_two_voices_give_different_mel_and_audio_for_the_same_text_and_seed(ab_runs):
    file, one = ab_runs["file"], ab_runs["one"]
    for key in ("codes_sha256", "mel_sha256", "audio_sha256"):  # the control: nothing differs
        assert _same(file["0000"], one["0000"], key), key
    assert _same(file["0001"], one["0001"], "codes_sha256")  # the talker does not see the voice
    assert not _same(file["0001"], one["0001"], "mel_sha256")
    assert not _same(file["0001"], one["0001"], "audio_sha256")


def test_ab_the_default_voice_differs_from_the_files_voice(ab_runs):
    file, default = ab_runs["file"], ab_runs["default"]
    for pos in ("0000", "0001"):
        assert _same(file[pos], default[pos], "codes_sha256")
        assert not _same(file[pos], default[pos], "mel_sha256")
        assert not _same(file[pos], default[pos], "audio_sha256")


def test_ab_voice_cache_counters_agree_with_the_voices_decoded(ab_runs):
    # One replica, a fresh runner per phase: each distinct voice is built once (a miss), every
    # later request of it is a hit; the default voice is registered at start (always a hit).
    misses = {mode: sum(r["prompt_cache_hit"] is False for r in recs.values()) for mode, recs in ab_runs.items()}
    assert misses == {"file": 2, "one": 1, "default": 0}
    hits = {mode: sum(r["prompt_cache_hit"] is True for r in recs.values()) for mode, recs in ab_runs.items()}
    assert hits == {"file": 0, "one": 1, "default": 2}
    # What was decoded agrees: two misses in `file` built two voices, and their audio differs.
    assert ab_runs["file"]["0000"]["audio_sha256"] != ab_runs["file"]["0001"]["audio_sha256"]


def test_wer_audio_follows_the_voice_and_the_text(tmp_path):
    # wer sends every prompt with one seed: lines 1 and 2 differ only in voice, 1 and 3 only in
    # text (same length), 1 and 4 in nothing.
    meta = _meta(tmp_path, [("en_1", VOICE_A, TEXT), ("en_2", VOICE_B, TEXT), ("en_3", VOICE_A, OTHER_TEXT),
                            ("en_4", VOICE_A, TEXT)])
    proc = main_in_process(
        "wer", "--config", str(ROOT / "configs/wer/embedded-tiny.yaml"), "--arms", "base", "--generate-only",
        "--disable-shuffle", "--num-prompts", "4", "--result-dir", str(tmp_path / "runs"),
        *TINY, "--set", f"prompts.meta={meta}", "--set", "wer.concurrency=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    wav = {utt: hashlib.sha256((run / "wavs/base" / f"{utt}.wav").read_bytes()).hexdigest()
           for utt in ("en_1", "en_2", "en_3", "en_4")}
    assert wav["en_1"] == wav["en_4"]  # the control
    assert wav["en_1"] != wav["en_2"]  # another voice
    assert wav["en_1"] != wav["en_3"]  # another text of the same length


def test_serve_ref_audio_changes_the_audio_and_none_is_the_default_voice():
    import urllib.request

    cfg = load_config(None, ["backend=embedded", f"stages={ROOT / 'configs/stages/minicpmo45-tiny.yaml'}",
                             "runner.device=cpu", "runner.torch_threads=1"])

    def pcm(url: str, **extra) -> bytes:
        body = json.dumps({"input": TEXT, "response_format": "pcm", "seed": 7, **extra}).encode()
        req = urllib.request.Request(url + "/v1/audio/speech", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.status == 200
            return resp.read()

    def voice(path: Path) -> str:
        return "data:audio/wav;base64," + base64.b64encode(path.read_bytes()).decode()

    with running_server(cfg) as server:
        plain, plain_again = pcm(server.url), pcm(server.url)
        with_a, with_b = pcm(server.url, ref_audio=voice(VOICE_A)), pcm(server.url, ref_audio=voice(VOICE_B))
    assert plain == plain_again and len(plain) > 0  # the control
    assert with_a != plain and with_b != plain and with_a != with_b
