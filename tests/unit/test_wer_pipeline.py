"""The WER gate's two phases with test doubles: failure taxonomy, transcript cache, history, gate."""

from __future__ import annotations

import asyncio
import datetime
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tts_bench.asr.base import AsrOptions
from tts_bench.errors import ExitStatus, InvalidRunError
from tts_bench.inputs.prompts import Prompt
from tts_bench.rundir.results import RunDir
from tts_bench.wer import runner
from tts_bench.wer.gate import judge
from tts_bench.wer.generate import generate_arm
from tts_bench.config.wer import WerParams
from tts_bench.wer.testing import TextCodeBackend, TextCodeTranscriber, fake_provenance
from tts_bench.wer.transcribe import AsrSession, TranscriptCache, transcribe_records

TEXTS = ["the morning fog lifted", "please close the window", "she carried a basket",
         "good morning everybody", "the river runs slowly", "a small red boat", "we walked home"]

VOICE = Path(__file__).resolve().parents[2] / "tts_bench/data/seed-tts-en/prompts/ref_0.wav"


def _prompts(tmp_path: Path, n: int = 3, *, missing: set[int] = frozenset()) -> list[Prompt]:
    out = []
    for i in range(n):
        wav = tmp_path / f"ref_{i}.wav"
        if i not in missing:
            wav.write_bytes(VOICE.read_bytes())  # a real voice: every prompt wav is read first
        out.append(Prompt(f"en_{i + 1:04d}", "reference", wav, TEXTS[i]))
    return out


def _session(tmp_path: Path, counter: list) -> AsrSession:
    def factory(options):
        t = TextCodeTranscriber(options)
        counter.append(t)
        return t

    prov = fake_provenance()
    return AsrSession(AsrOptions(), prov, factory, TranscriptCache(tmp_path / "cache", "k"))


def test_every_bad_input_is_a_counted_failure_of_its_kind(tmp_path):
    prompts = _prompts(tmp_path, 7, missing={1})
    backend = TextCodeBackend(raise_for={"en_0003"}, empty_for={"en_0004"}, silence_for={"en_0005"})
    run_path = tmp_path / "run"
    gen = asyncio.run(generate_arm("base", backend, prompts, run_path, concurrency=3))
    assert [g.request_id for g in gen] == [p.request_id for p in prompts]  # prompt order, none dropped
    (run_path / gen[5].wav).write_bytes(np.random.default_rng(0).bytes(4000))  # corrupt wav
    with wave.open(str(run_path / gen[6].wav), "wb") as w:  # zero-length wav
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
    results = transcribe_records(gen, run_path, _session(tmp_path, []))
    kinds = [r.failure_kind for r in results]
    assert kinds == [None, "request_failed", "request_failed", "no_audio", "empty_transcript",
                     "asr_failed", "asr_failed"]
    assert results[0].transcript == TEXTS[0]
    assert results[1].failure_detail.startswith("missing_prompt_wav")
    assert results[2].failure_detail.startswith("backend_error")
    assert "zero samples" in results[6].failure_detail


def test_identical_audio_is_transcribed_once_and_cached_across_runs(tmp_path):
    prompts = _prompts(tmp_path)
    run_path = tmp_path / "run"
    gens = [asyncio.run(generate_arm(arm, TextCodeBackend(), prompts, run_path)) for arm in ("a", "b")]
    made: list = []
    session = _session(tmp_path, made)
    first = transcribe_records(gens[0], run_path, session)
    second = transcribe_records(gens[1], run_path, session)
    assert made[0].calls == 3 and not any(r.cached for r in first) and all(r.cached for r in second)
    later: list = []
    again = transcribe_records(gens[0], run_path, _session(tmp_path, later))
    assert later == [] and [r.transcript for r in again] == [r.transcript for r in first]


def _run(tmp_path: Path, params: WerParams, *, degrade: bool = False, prompts=None) -> RunDir:
    prompts = prompts or _prompts(tmp_path, 5)
    configs = {"base": {"backend": "text-code"}, "test": {"backend": "text-code", "degrade": degrade}}
    run = RunDir.create(tmp_path / "runs", "wer", command_line="test", configs=configs,
                        extra=runner.selection_doc(prompts, num_prompts=len(prompts), shuffle=False))
    arms = [runner.WerArm("base", False), runner.WerArm("test", degrade)]
    asyncio.run(runner.generate(arms, prompts, run, params,
                                backend_factory=lambda d: TextCodeBackend(drop_last_word=d)))
    return run


def _params(tmp_path: Path, **kw) -> WerParams:
    return WerParams(history_dir=str(tmp_path / "history"), cache_dir=str(tmp_path / "cache"), **kw)


def _evaluate(run, params, *, accept=False, sha="0" * 16):
    return runner.evaluate(run, params, accept=accept, factory=TextCodeTranscriber,
                           provenance=fake_provenance(runner.asr_options(params), model_sha256=sha))


def test_identical_arms_pass_and_a_degraded_arm_regresses(tmp_path):
    params = _params(tmp_path)
    ok = _evaluate(_run(tmp_path, params), params)
    assert ok.gate.verdict == "pass" and ok.arms[0].mean_wer == 0.0
    assert ok.paired[0].identical_audio == 5 and ok.paired[0].identical_transcripts == 5
    bad = _evaluate(_run(tmp_path, params, degrade=True), params)
    assert bad.gate.exit_status == ExitStatus.ACCURACY_REGRESSION
    assert bad.arms[1].mean_wer > 0.2 and bad.paired[0].identical_audio == 0


def test_history_is_recorded_compared_and_a_different_asr_is_refused(tmp_path):
    params = _params(tmp_path)
    first = _evaluate(_run(tmp_path, params), params, accept=True)
    assert first.history_written and Path(first.history_written).is_file()
    again = _evaluate(_run(tmp_path, params), params)
    assert [h.paired.identical_transcripts for h in again.history] == [5, 5]
    assert again.gate.verdict == "pass"
    with pytest.raises(InvalidRunError, match="not comparable"):
        _evaluate(_run(tmp_path, params), params, sha="f" * 16)
    other_normalizer = replace(params, normalizer="whisper")
    pytest.importorskip("whisper")
    with pytest.raises(InvalidRunError, match="normalizer"):
        _evaluate(_run(tmp_path, params), other_normalizer)


def test_failures_above_the_allowed_count_make_an_invalid_run(tmp_path):
    params = _params(tmp_path)
    prompts = _prompts(tmp_path, 4, missing={2})
    report = _evaluate(_run(tmp_path, params, prompts=prompts), params)
    assert report.gate.exit_status == ExitStatus.INVALID_RUN
    assert report.arms[0].failures["request_failed"] == 1
    lenient = _evaluate(_run(tmp_path, params, prompts=prompts), replace(params, max_failures=1))
    assert lenient.gate.verdict == "pass"


def test_single_arm_without_history_passes_with_a_no_reference_note():
    gate = judge([], [], [], WerParams())
    assert gate.verdict == "pass" and "no reference" in gate.reasons[0]


def _paired(**kw):
    from tts_bench.wer.score import Paired

    base = dict(base="base", test="test", n_paired=10, n_total=10, delta_mean_wer=0.0,
                delta_mean_wer_ci95=(0.0, 0.0), identical_audio=0, identical_transcripts=0)
    return Paired(**{**base, **kw})


@pytest.mark.parametrize(("mode", "paired", "verdict"), [
    ("auto", _paired(identical_audio=10, n_paired=0, delta_mean_wer=None, delta_mean_wer_ci95=None), "pass"),
    ("auto", _paired(identical_transcripts=10), "pass"),
    ("auto", _paired(delta_mean_wer=0.01, delta_mean_wer_ci95=(-0.01, 0.0299)), "pass"),  # < 3 points
    ("auto", _paired(delta_mean_wer=0.01, delta_mean_wer_ci95=(-0.01, 0.0301)), "regression"),
    ("auto", _paired(delta_mean_wer=-0.02, delta_mean_wer_ci95=(-0.05, 0.01)), "pass"),  # WER went down
    ("auto", _paired(n_paired=0, delta_mean_wer=None, delta_mean_wer_ci95=None), "regression"),
    ("exact", _paired(identical_audio=10, identical_transcripts=10), "pass"),
    ("exact", _paired(identical_transcripts=10), "regression"),  # same words, different audio
    ("noninferiority", _paired(identical_audio=10, delta_mean_wer_ci95=(0.0, 0.0)), "pass"),
])
def test_gate_rules(mode, paired, verdict):
    assert judge([], [paired], [], WerParams(mode=mode, margin_points=3.0)).verdict == verdict


def test_auto_is_exact_for_identical_audio_and_non_inferiority_otherwise():
    from tts_bench.wer.gate import pair_mode

    params = WerParams()
    assert pair_mode(_paired(identical_audio=10), params) == "exact"
    assert pair_mode(_paired(identical_audio=9), params) == "noninferiority"
    assert pair_mode(_paired(identical_audio=10), WerParams(mode="noninferiority")) == "noninferiority"


def test_exact_mode_lists_the_differing_utterances_with_both_transcripts(tmp_path):
    params = _params(tmp_path, mode="exact")
    report = _evaluate(_run(tmp_path, params, degrade=True), params)
    assert report.gate.verdict == "regression" and report.gate.modes == ["exact"]
    assert report.gate.reasons[-1] == "test vs base: exact: 5/5 transcripts and 5/5 audio hashes differ"
    first = report.gate.differences[0]
    assert first == 'test vs base en_0001: base "the morning fog lifted" | test "the morning fog"'
    assert len(report.gate.differences) == 5
    from tts_bench.wer.report import render_report

    text = render_report(report, "md")
    assert "  differs: test vs base en_0005: base \"the river runs slowly\" | test \"the river runs\"" in text


def test_non_inferiority_pass_and_fail_on_crafted_per_utterance_wers():
    from tts_bench.wer.score import compare_utterances

    def rows(wers, tag):
        return [{"request_id": f"u{i}", "wer": w, "audio_sha256": f"{tag}{i}", "transcript": f"{tag}{i}"}
                for i, w in enumerate(wers)]

    base = rows([0.0] * 30, "b")
    # A/A-like: a few word flips both ways -> mean 0, upper bound ~1.6 points < 3
    flips = [0.1, -0.1, 0.0, 0.0, 0.1, -0.1] + [0.0] * 24
    aa = compare_utterances("base", base, "test", rows(flips, "t"))
    assert aa.delta_mean_wer_ci95[1] < 0.03
    assert judge([], [aa], [], WerParams(margin_points=3.0)).verdict == "pass"
    # Degraded: one word in ten lost on a third of the utterances -> +3.3 points: fails
    worse = compare_utterances("base", base, "test", rows([0.1] * 10 + [0.0] * 20, "t"))
    assert judge([], [worse], [], WerParams(margin_points=3.0)).verdict == "regression"


def test_prompt_count_advice_from_the_history_spread(tmp_path):
    from tts_bench.wer.advice import mde_points, prompt_advice, prompts_needed

    assert mde_points(5.0, 40) == pytest.approx((2.0226909 + 0.8509350) * 5.0 / 40 ** 0.5, rel=1e-5)
    n = prompts_needed(5.0, 3.0)
    assert mde_points(5.0, n) <= 3.0 < mde_points(5.0, n - 1)
    params = _params(tmp_path, margin_points=3.0)
    empty = prompt_advice(params, 20, available=150)  # no history yet: the shipped measurement
    assert "shipped piper A/A" in empty.source and empty.needed == prompts_needed(empty.sd_points, 3.0)
    # Two accepted runs of the same config: the spread of their per-utterance differences.
    from tts_bench.wer.gate import write_history
    from tts_bench.wer.score import ArmScore

    first = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    for k, wers in enumerate(([0.0] * 20, [0.1, -0.0] * 10)):
        utts = [{"request_id": f"u{i}", "text": "t", "transcript": "t", "wer": w, "audio_sha256": "x",
                 "failure_kind": None} for i, w in enumerate(wers)]
        arm = ArmScore("base", 20, 20, {}, 0.0, 0.0, 0.0, 0.0, 0, 0, 1.0, 1.0, utts)
        # History files are named by the second: each record gets its own, without waiting one.
        write_history(Path(params.history_dir), arms=[arm], tts_hashes={"base": "h"}, asr={"m": 1},
                      normalizer="seed-tts", run_path="r", config_hashes={},
                      created=first + datetime.timedelta(seconds=k))
    advice = prompt_advice(params, 20, available=150)
    assert advice.source.startswith("history ") and advice.sd_points == pytest.approx(100 * np.std([0.1, 0] * 10, ddof=1))
    assert not advice.resolvable and "NOT resolvable; it needs >=" in advice.line()
    assert prompt_advice(params, 150, available=150).resolvable


def test_every_load_generator_failure_kind_has_a_wer_failure_kind():
    from tts_bench.backends.base import FAILURE_KINDS
    from tts_bench.wer.generate import _LOADGEN_TO_WER, GEN_FAILURES

    assert set(_LOADGEN_TO_WER) == set(FAILURE_KINDS)
    assert set(_LOADGEN_TO_WER.values()) <= set(GEN_FAILURES)


def test_parallel_transcription_keeps_record_order_and_loads_the_model_once(tmp_path):
    import threading
    import time as _time

    from tts_bench.asr.base import AsrOptions
    from tts_bench.wer.generate import GenRecord
    from tts_bench.wer.transcribe import AsrSession, TranscriptCache, transcribe_records
    from tts_bench.wer.testing import fake_provenance

    loads, active, peak = [], [0], [0]
    lock = threading.Lock()

    class SlowByLength:
        def __init__(self, options):
            loads.append(1)
            self.options = options

        def provenance(self):
            return fake_provenance(self.options)

        def transcribe(self, audio):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            _time.sleep(0.02 * (1 + len(audio) % 3))  # out-of-order finishing
            with lock:
                active[0] -= 1
            return f"len {len(audio)}"

    from stages.audio import write_wav16
    import numpy as np

    records = []
    for i in range(6):
        rel = f"wavs/u{i}.wav"
        (tmp_path / "wavs").mkdir(exist_ok=True)
        write_wav16(tmp_path / rel, np.zeros(1600 * (i + 1), np.float32), 16000)
        records.append(GenRecord(arm="base", request_id=f"u{i}", text="x", wav=rel))
    opts = AsrOptions(workers=2)
    session = AsrSession(opts, fake_provenance(opts), SlowByLength, TranscriptCache(None, "k"), parallel=2)
    out = transcribe_records(records, tmp_path, session)
    assert [r.gen.request_id for r in out] == [f"u{i}" for i in range(6)]
    assert [r.transcript for r in out] == [f"len {1600 * (i + 1)}" for i in range(6)]
    assert loads == [1] and peak[0] == 2
