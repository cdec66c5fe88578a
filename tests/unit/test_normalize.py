"""Golden input -> output pairs for the WER normalizers (seed-tts-eval parity, Whisper's English)."""

from __future__ import annotations

import importlib.util
import string

import pytest

from tts_bench.errors import ConfigError
from tts_bench.wer.normalize import SEED_TTS_PUNCTUATION, get_normalizer, seed_tts_normalize

SEED_TTS_GOLDEN = [
    ("Hello, World!  Don't.", "hello world don't"),  # ASCII apostrophe kept
    ("She said: “don’t go” — now…", "she said dont go now"),  # curly apostrophe U+2019 removed
    ("A  B   C", "a b  c"),  # double space replaced once: a triple leaves a double
    ("Mr. Smith's colour-coded plan (v2)!", "mr smith's colourcoded plan v2"),  # hyphen joins
    ("It's 7:15 p.m., isn't it?", "it's 715 pm isn't it"),  # no number handling
    ("The café’s «menu»", "the cafés «menu»"),  # guillemets are in neither punctuation set
    ("「你好」，世界！", "你好世界"),  # zhon.hanzi punctuation
    ("  Leading and trailing.  ", " leading and trailing "),  # no strip (jiwer splits anyway)
    ("I'm gonna e-mail you", "i'm gonna email you"),
]

WHISPER_GOLDEN = [
    ("Hello, World!  Don't.", "hello world do not"),
    ("Mr. Smith's colour-coded plan (v2)!", "mister smith is color coded plan"),
    ("It's 7:15 p.m., isn't it?", "it is 7 15 p m is not it"),
    ("Twenty-five percent", "25%"),
    ("I'm gonna e-mail you", "i am going to e mail you"),
    ("  Leading and trailing.  ", "leading and trailing"),
]


@pytest.mark.parametrize(("text", "expected"), SEED_TTS_GOLDEN)
def test_seed_tts_normalizer_matches_seed_tts_eval(text, expected):
    assert seed_tts_normalize(text) == expected
    assert get_normalizer("seed-tts")(text) == expected


def _reference_loop(text: str) -> str:
    # seed-tts-eval run_wer.py process_one, lang "en", written out literally.
    for x in SEED_TTS_PUNCTUATION:
        if x == "'":
            continue
        text = text.replace(x, "")
    text = text.replace("  ", " ")
    return text.lower()


def test_seed_tts_translate_equals_the_reference_replace_loop():
    for text, _ in SEED_TTS_GOLDEN:
        assert seed_tts_normalize(text) == _reference_loop(text)
    every = "".join(SEED_TTS_PUNCTUATION) + " x  y " + string.ascii_letters
    assert seed_tts_normalize(every) == _reference_loop(every)


def test_seed_tts_set_is_zhon_plus_ascii_punctuation():
    assert set(string.punctuation) <= set(SEED_TTS_PUNCTUATION)
    assert len(SEED_TTS_PUNCTUATION) == 82 + len(string.punctuation)  # zhon 2.x: 77 non-stops + 5 stops
    assert "\u2019" in SEED_TTS_PUNCTUATION and "\u3002" in SEED_TTS_PUNCTUATION


@pytest.mark.skipif(importlib.util.find_spec("whisper") is None, reason="openai-whisper not installed")
@pytest.mark.parametrize(("text", "expected"), WHISPER_GOLDEN)
def test_whisper_normalizer_golden(text, expected):
    assert get_normalizer("whisper")(text) == expected


def test_unknown_normalizer_lists_the_choices():
    with pytest.raises(ConfigError, match="seed-tts, whisper"):
        get_normalizer("lowercase")
