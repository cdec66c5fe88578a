"""Each request's codec budget: how many codes the talker emits before it stops.

Random weights have no trained EOS, so the budget comes from the text (like `--ignore-eos` in
vLLM's benchmarks): `round(words * codes_per_word + cjk_chars * codes_per_cjk_char)`, clamped
to [min_tokens, max_tokens]; EOS is then masked at every step and forced at the budget. With
real weights (a weights dir) the model's EOS decides and the budget is only a cap (max_tokens,
further bounded by the cache room left after the condition rows).

Speech runs at ~2.5 words/s and the codec at 25 Hz, hence the default 10 codes per word; the
floor of min_tokens matches the EOS mask (a request never ends before step min_tokens).

    >>> codec_budget("Hello there, general Kenobi.", cfg)  # 4 words -> 50 (min_tokens floor)
    >>> cache_positions("Hello there, general Kenobi.", cfg)  # condition rows + codes: <= max_seq_len
"""

from __future__ import annotations

import re

from stages.talker.config import TalkerConfig
from stages.talker.tokenizer import WordHashTokenizer

# CJK ideographs (and kana) are counted one by one: such text has no spaces between words.
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_WORD = re.compile(r"[^\W\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def count_units(text: str) -> tuple[int, int]:
    """(words, CJK characters) in `text`; punctuation counts as neither."""
    return len(_WORD.findall(text)), len(_CJK.findall(text))


def codec_budget(text: str, cfg: TalkerConfig) -> int:
    """Codes the length model gives `text`; 0 for text with no words (finishes at once)."""
    words, cjk = count_units(text)
    if words + cjk == 0:
        return 0
    raw = round(words * cfg.length.codes_per_word + cjk * cfg.length.codes_per_cjk_char)
    return max(cfg.sampling.min_tokens, min(raw, cfg.sampling.max_tokens))


def cache_positions(text: str, cfg: TalkerConfig) -> int:
    """Talker cache positions a request needs with random weights (the stand-in tokenizer and
    the length model): its condition rows (text tokens + text_eos + audio_bos) and one per code,
    at least one. The engine refuses a request above `runner.max_seq_len`;
    `stages.admission.text_problem` asks the same before any stage sees the request."""
    tokens = len(WordHashTokenizer(cfg.standin_text_vocab).encode(text))
    return tokens + 2 + max(codec_budget(text, cfg), 1)

