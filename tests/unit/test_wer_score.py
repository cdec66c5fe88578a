"""WER scoring on known strings: per utterance, per arm, paired across arms."""

from __future__ import annotations

import numpy as np
import pytest

from tts_bench.wer.generate import GenRecord
from tts_bench.wer.normalize import seed_tts_normalize
from tts_bench.wer.score import compare_utterances, score_arm, score_utterance, scored_wer, t_mean_ci
from tts_bench.wer.transcribe import UttTranscript


def test_punctuation_and_case_are_not_errors():
    s = score_utterance("Hello, World!", "hello world", seed_tts_normalize)
    assert (s.wer, s.errors, s.ref_words) == (0.0, 0, 2)


def test_one_substitution_in_four_words_is_a_quarter():
    s = score_utterance("the cat sat down", "the cat sat town", seed_tts_normalize)
    assert s.wer == 0.25 and s.substitutions == 1


def test_insertions_make_wer_exceed_one():
    s = score_utterance("stop", "stop stop stop stop", seed_tts_normalize)
    assert s.insertions == 3 and s.wer == 3.0


def test_empty_hypothesis_is_all_deletions():
    s = score_utterance("two words", "", seed_tts_normalize)
    assert (s.wer, s.deletions) == (1.0, 2)


def test_reference_empty_after_normalization_is_refused():
    with pytest.raises(ValueError, match="no words after normalization"):
        score_utterance("?!", "anything", seed_tts_normalize, "en_0009")


def _utt(rid, text, hyp, *, kind=None, sha="a"):
    gen = GenRecord("arm", rid, text, wav=f"{rid}.wav", audio_sha256=sha, audio_seconds=1.0)
    return UttTranscript(gen, transcript=hyp, failure_kind=kind)


def test_arm_mean_median_corpus_and_failures_counted():
    results = [
        _utt("u1", "one two three four", "one two three four"),  # 0/4
        _utt("u2", "one two", "one too"),  # 1/2
        _utt("u3", "a b c d e f g h", "a b c d e f g x"),  # 1/8
        _utt("u4", "lost words", None, kind="asr_failed"),
    ]
    arm = score_arm("base", results, seed_tts_normalize)
    assert arm.completed == 3 and arm.total == 4
    assert arm.failures == {"request_failed": 0, "no_audio": 0, "asr_failed": 1, "empty_transcript": 0}
    assert arm.mean_wer == pytest.approx((0 + 0.5 + 0.125) / 3)
    assert arm.median_wer == pytest.approx(0.125)
    assert arm.corpus_wer == pytest.approx(2 / 14)
    assert arm.above_50 == 0
    assert arm.utterances[3]["wer"] is None and arm.utterances[3]["failure_kind"] == "asr_failed"


def test_paired_delta_and_identity_lines():
    base = [{"request_id": f"u{i}", "wer": 0.0, "audio_sha256": f"h{i}", "transcript": "t"} for i in range(10)]
    test = [dict(u) for u in base]
    test[0] = {**test[0], "wer": 0.5, "audio_sha256": "other", "transcript": "x"}
    p = compare_utterances("base", base, "test", test)
    assert p.n_paired == 10 and p.identical_audio == 9 and p.identical_transcripts == 9
    assert p.delta_mean_wer == pytest.approx(0.05)
    # t interval, 9 df: 0.05 +- 2.262 * sd / sqrt(10), sd of nine 0s and one 0.5
    half = 2.2621571627 * np.std([0.5] + [0.0] * 9, ddof=1) / np.sqrt(10)
    assert p.delta_mean_wer_ci95 == pytest.approx((0.05 - half, 0.05 + half))
    assert p.differing == [{"request_id": "u0", "base": "t", "test": "x", "base_wer": 0.0, "test_wer": 0.5}]


def test_t_interval_of_constant_deltas_is_a_point_and_needs_two_values():
    assert t_mean_ci(np.zeros(20)) == (0.0, 0.0)
    lo, hi = t_mean_ci(np.array([0.0, 1.0] * 50))
    assert lo < 0.5 < hi
    assert t_mean_ci(np.array([0.3])) is None


def test_empty_transcripts_count_as_one_in_the_seed_tts_wer_and_in_the_pairing():
    results = [
        _utt("u1", "one two", "one two"),
        _utt("u2", "one two", "", kind="empty_transcript"),
        _utt("u3", "one two", None, kind="request_failed"),
    ]
    arm = score_arm("test", results, seed_tts_normalize)
    assert arm.mean_wer == 0.0 and arm.mean_wer_seedtts == pytest.approx(0.5)
    assert [scored_wer(u) for u in arm.utterances] == [0.0, 1.0, None]
    base = score_arm("base", [_utt("u1", "one two", "one two"), _utt("u2", "one two", "one two"),
                              _utt("u3", "one two", "one two")], seed_tts_normalize)
    p = compare_utterances("base", base.utterances, "test", arm.utterances)
    assert p.n_paired == 2 and p.delta_mean_wer == pytest.approx(0.5)


def test_reference_of_emoji_only_is_refused_like_punctuation_only():
    with pytest.raises(ValueError, match="en_0010 has no words after normalization"):
        score_utterance("😀 🎉", "anything", seed_tts_normalize, "en_0010")
