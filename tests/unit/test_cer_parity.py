"""CER on a Chinese set equals seed-tts-eval's on a few hundred pairs.

The oracle below re-states seed-tts-eval's run_wer.py for `lang == "zh"` line by line: the
transcript is converted with `zhconv.convert(text, "zh-cn")` right after ASR, then `process_one`
deletes every character of `zhon.hanzi.punctuation + string.punctuation` except the apostrophe
from both texts, replaces double spaces once, joins the characters with spaces and hands both to
jiwer's `compute_measures` (jiwer >= 4 spells it `process_words`, same default transform). The
punctuation string is the inlined copy (equal to zhon 2.1.1's; checked below when zhon is
installed). The pairs are golden cases plus 400 seeded random edits of Chinese sentences in
both scripts, with punctuation, spaces of several kinds, Latin letters in both cases and digits.
"""

from __future__ import annotations

import importlib.util
import random
import string

import jiwer
import pytest

from tts_bench.errors import ConfigError
from tts_bench.wer.normalize import SEED_TTS_PUNCTUATION

zhconv = pytest.importorskip("zhconv")

from tts_bench.wer.language import get_scorer  # noqa: E402  (after the skip: needs zhconv)
from tts_bench.wer.score import score_utterance  # noqa: E402


def seed_tts_eval_zh(hypo: str, truth: str) -> tuple[float, int, int, int]:
    """run_wer.py, lang "zh": zhconv on the transcript, then process_one; (wer, S, D, I)."""
    hypo = zhconv.convert(hypo, "zh-cn")
    punctuation_all = SEED_TTS_PUNCTUATION
    for x in punctuation_all:
        if x == "'":
            continue
        truth = truth.replace(x, "")
        hypo = hypo.replace(x, "")
    truth = truth.replace("  ", " ")
    hypo = hypo.replace("  ", " ")
    truth = " ".join([x for x in truth])
    hypo = " ".join([x for x in hypo])
    measures = jiwer.process_words(truth, hypo)
    return measures.wer, measures.substitutions, measures.deletions, measures.insertions


SENTENCES = [
    "今天天气很好，我们去公园散步吧。",
    "這是一個測試：語音合成的質量如何？",
    "他说：“明天见！”然后就走了……",
    "请把窗户关上，外面开始下雨了。",
    "我們在「圖書館」裡讀書，讀了三個小時。",
    "AI 模型的 CER 是多少？",
    "小明买了 3 斤苹果、两瓶牛奶和一袋面包。",
    "吃葡萄不吐葡萄皮，不吃葡萄倒吐葡萄皮。",
    "四是四，十是十，十四是十四，四十是四十。",
    "红鲤鱼与绿鲤鱼与驴。",
    "She said “你好” to me — okay?",
    "火車站離這裡不遠，走路十分鐘就到。",
    "《红楼梦》是中国古典小说的巅峰之作。",
    "电话号码是 010-12345678，请记下来。",
    "嗯……让我想想，应该是周三吧？",
]
_EXTRA = list("的了是在我有他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后作里")
_SPACES = [" ", "  ", "   ", "\u3000", "\t", "\u00a0"]
_PUNCT = list("，。！？、；：“”‘’「」『』（）《》…—-.,!?;:'\"()[]") + ["·"]


def _mutate(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(0, 6)):
        op = rng.choice(["sub", "del", "ins", "space", "punct", "latin", "trad"])
        i = rng.randrange(len(chars) + 1)
        if op == "sub" and chars:
            chars[min(i, len(chars) - 1)] = rng.choice(_EXTRA)
        elif op == "del" and chars:
            del chars[min(i, len(chars) - 1)]
        elif op == "ins":
            chars.insert(i, rng.choice(_EXTRA))
        elif op == "space":
            chars.insert(i, rng.choice(_SPACES))
        elif op == "punct":
            chars.insert(i, rng.choice(_PUNCT))
        elif op == "latin":
            chars.insert(i, rng.choice(string.ascii_letters + string.digits))
        elif op == "trad":  # a traditional spelling the transcript-side zhconv must undo
            chars.insert(i, rng.choice("這個們說時會對過發後裡麼還當"))
    return "".join(chars)


def _pairs(n: int = 400) -> list[tuple[str, str]]:
    rng = random.Random(51)
    out = []
    for _ in range(n):
        truth = rng.choice(SENTENCES)
        hypo = _mutate(rng.choice([truth, zhconv.convert(truth, "zh-tw"), rng.choice(SENTENCES)]), rng)
        out.append((truth, hypo))
    return out


GOLDEN = [
    # (reference, transcript, CER): traditional in the transcript is not an error
    ("这是一个测试。", "這是一個測試", 0.0),
    ("你好，世界！", "你好世界", 0.0),
    ("你好，世界！", "你好 世 界 。", 0.0),  # spaces are no characters
    ("今天天气很好", "今天天汽很好", 1 / 6),
    ("AI模型", "ai模型", 2 / 4),  # no lowercasing in the zh path
    ("红鲤鱼与绿鲤鱼", "红鲤鱼绿鲤鱼与驴", 3 / 7),  # one deletion, two insertions
]


@pytest.mark.parametrize(("ref", "hyp", "cer"), GOLDEN)
def test_cer_golden_pairs(ref, hyp, cer):
    s = score_utterance(ref, hyp, get_scorer("zh", "seed-tts"))
    assert s.wer == pytest.approx(cer)
    assert seed_tts_eval_zh(hyp, ref)[0] == pytest.approx(cer)


def test_cer_equals_seed_tts_eval_on_400_pairs():
    scorer = get_scorer("zh", "seed-tts")
    pairs = _pairs()
    nonzero = 0
    for truth, hypo in pairs:
        wer, sub, dele, ins = seed_tts_eval_zh(hypo, truth)
        s = score_utterance(truth, hypo, scorer)
        assert (s.wer, s.substitutions, s.deletions, s.insertions) == (wer, sub, dele, ins), (truth, hypo)
        nonzero += wer > 0
    assert len(pairs) == 400 and 200 < nonzero < 400  # the pairs exercise both errors and matches


def test_cer_counts_characters_not_words():
    s = score_utterance("我们去公园", "我们去公圆", get_scorer("zh", "seed-tts"))
    assert (s.ref_words, s.substitutions, s.wer) == (5, 1, 0.2)
    # The same pair scored as English words is one word, all wrong.
    assert score_utterance("我们去公园", "我们去公圆", get_scorer("en", "seed-tts")).wer == 1.0


def test_whisper_normalizer_is_refused_for_chinese():
    with pytest.raises(ConfigError, match="English-only"):
        get_scorer("zh", "whisper")


@pytest.mark.skipif(importlib.util.find_spec("zhon") is None, reason="zhon not installed")
def test_inlined_punctuation_is_zhons():
    from zhon.hanzi import punctuation

    assert SEED_TTS_PUNCTUATION == punctuation + string.punctuation
