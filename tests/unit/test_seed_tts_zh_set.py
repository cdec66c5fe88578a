"""The packaged Chinese set `builtin:seed-tts-zh` and its shipped config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stages.talker.length import codec_budget, count_units
from stages.talker.tokenizer import WordHashTokenizer
from tts_bench.config import load_config
from tts_bench.inputs.prompts import builtin_sets, check_prompt_wavs, check_text_lengths, load_prompts

ROOT = Path(__file__).resolve().parents[2]
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def zh():
    return load_prompts("builtin:seed-tts-zh")


def test_the_chinese_set_is_listed_with_forty_plus_unique_chinese_texts(zh):
    assert "seed-tts-zh" in builtin_sets()
    assert len(zh) >= 40
    assert len({p.text for p in zh}) == len(zh)
    assert all(re.fullmatch(r"zh_\d{4}|zh_hard_\d{2}", p.utt) for p in zh)
    assert all(CJK.search(p.text) for p in zh)
    assert not any(re.search(r"[0-9０-９]", p.text) for p in zh)  # Whisper's digits would be errors


def test_test_hard_style_lines_load_the_same_way(zh):
    hard = [p for p in zh if p.utt.startswith("zh_hard_")]
    assert len(hard) == 8 and any("葡萄" in p.text for p in hard)


def test_prompt_wavs_are_the_english_sets_reference_voices(zh):
    en = {p.prompt_wav.resolve(): p.prompt_text for p in load_prompts("builtin:seed-tts-en")}
    for p in zh:
        assert en[p.prompt_wav.resolve()] == p.prompt_text
    check_prompt_wavs(zh, source="builtin:seed-tts-zh")


def test_the_readme_says_where_every_text_comes_from(zh):
    readme = (ROOT / "tts_bench/data/seed-tts-zh/README.md").read_text(encoding="utf-8")
    assert "written for this project" in readme and "tongue twisters" in readme
    assert "zh_0001`–`zh_0042" in readme and "zh_hard_01`–`zh_hard_05" in readme and "zh_hard_06`–`zh_hard_08" in readme
    assert sum(p.utt.startswith("zh_0") for p in zh) == 42


def test_chinese_text_flows_through_the_tiny_talkers_tokenizer_and_length_model(zh):
    cfg = load_config(ROOT / "configs/wer/seed-tts-zh.yaml")
    assert (cfg.backend, cfg.wer.language, cfg.wer.asr_model, cfg.prompts.meta) == (
        "embedded", "zh", "base", "builtin:seed-tts-zh")
    talker = cfg.stages.talker
    tok = WordHashTokenizer(talker.standin_text_vocab)
    for p in zh:
        words, cjk = count_units(p.text)
        assert cjk == len(CJK.findall(p.text)) and tok.encode(p.text)
        assert codec_budget(p.text, talker) >= talker.sampling.min_tokens
    check_text_lengths([cfg], zh, source="builtin:seed-tts-zh")  # every text fits the tiny talker


def test_the_reference_texts_score_as_chinese_and_are_refused_as_english(zh):
    pytest.importorskip("zhconv")
    from tts_bench.errors import ConfigError
    from tts_bench.wer.references import check_reference_texts

    items = [(p.utt, p.text, f"meta.lst:{p.line}") for p in zh]
    check_reference_texts(items, "seed-tts", language="zh")
    with pytest.raises(ConfigError, match="wer.language: zh"):
        check_reference_texts(items, "seed-tts", language="en")
