"""Target texts the WER gate can score (`tts_bench.wer.references`)."""

from __future__ import annotations

import pytest

from tts_bench.errors import ConfigError
from tts_bench.wer.references import check_reference_texts, foreign_letter


@pytest.mark.parametrize("text", ["Crème brûlée, naïve café.", "It's 5 µm wide, the 1ª try.", "O'Brien — well!"])
def test_latin_text_with_accents_and_symbols_is_scored(text):
    assert foreign_letter(text) is None
    check_reference_texts([("u1", text, "meta.lst:1")], "seed-tts")


@pytest.mark.parametrize(
    "text, script",
    [("今日は良い天気です。", "CJK"), ("こんにちは", "Hiragana"), ("안녕하세요", "Hangul"),
     ("Καλημέρα", "Greek"), ("a mixed line, then 你好", "CJK")],
)
def test_other_scripts_are_refused_naming_the_script(text, script):
    with pytest.raises(ConfigError, match=f"'u1' has {script} letters"):
        check_reference_texts([("u1", text, "meta.lst:7")], "seed-tts")


def test_every_problem_is_listed_with_where_it_comes_from():
    items = [("ok", "fine words", "m:1"), ("zh", "你好", "m:2"), ("sym", "… — !", "m:3")]
    with pytest.raises(ConfigError) as exc:
        check_reference_texts(items, "seed-tts")
    text = str(exc.value)
    assert "cannot score 2 target text(s)" in text and "m:2: 'zh'" in text and "m:3: 'sym' has no words" in text
    assert "'ok'" not in text


@pytest.mark.parametrize("text", ["😀 🎉 👍", "🙂!", "★ ♥ → ✓", "\u200b\u2063"])
def test_emoji_or_symbol_only_texts_are_refused_like_punctuation_only(text):
    with pytest.raises(ConfigError, match="'u1' has no words after the seed-tts normalizer"):
        check_reference_texts([("u1", text, "meta.lst:3")], "seed-tts")


def test_a_text_with_words_and_emoji_is_scored():
    check_reference_texts([("u1", "good morning 😀", "meta.lst:1")], "seed-tts")


def test_a_cjk_text_on_an_english_set_names_the_chinese_language_setting():
    with pytest.raises(ConfigError, match="wer.language: zh"):
        check_reference_texts([("u1", "你好，世界。", "meta.lst:1")], "seed-tts")


def test_a_chinese_set_scores_cjk_and_still_refuses_punctuation_only_texts():
    pytest.importorskip("zhconv")
    check_reference_texts([("u1", "你好，世界。", "m:1"), ("u2", "AI 模型", "m:2")], "seed-tts", language="zh")
    with pytest.raises(ConfigError, match="'u3' has no words"):
        check_reference_texts([("u3", "……！？", "m:3")], "seed-tts", language="zh")
