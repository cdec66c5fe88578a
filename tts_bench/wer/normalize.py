"""Text normalizers applied to both the reference and the transcript before WER.

Two choices, recorded in every WER result because numbers are only comparable under one:

- `seed-tts` (default): exactly seed-tts-eval's `run_wer.py` for English — delete every character
  of `zhon.hanzi.punctuation + string.punctuation` except the ASCII apostrophe, replace double
  spaces with one space *once* (a single `str.replace`, so a triple space leaves a double one,
  and jiwer then splits on whitespace anyway), lowercase. Nothing else: no number expansion, no
  trimming. The punctuation set is inlined here (no dependency on `zhon`); note that it contains
  the curly apostrophe U+2019, so "don’t" becomes "dont" while "don't" keeps its apostrophe —
  landmine kept on purpose for parity.
- `seed-tts` on a Chinese set (`wer.language: zh`): seed-tts-eval's `lang == "zh"` path — the
  transcript is first converted traditional -> simplified (`zhconv.convert(text, "zh-cn")`, the
  library and call seed-tts-eval makes, on the transcript only), then both texts lose the same
  punctuation (apostrophe kept) and double spaces once, with no lowercasing (a Latin letter in a
  Chinese sentence keeps its case). Scoring is then by character (`tts_bench.wer.language`).
  zhconv is a pure-Python package (PyPI, in the `[speech]` extra) imported lazily; missing, it is
  a ConfigError naming the install command.
- `whisper`: openai-whisper's `EnglishTextNormalizer` (spelling standardisation, numbers to
  digits, "mr" -> "mister", ...). Needs the `openai-whisper` package (imported lazily: it pulls
  torch); a missing package is a ConfigError naming the install command.

    normalizer = get_normalizer("seed-tts")
    normalizer("Hello, World!  Don't.")   # -> "hello world don't"
"""

from __future__ import annotations

import string
from collections.abc import Callable

from tts_bench.errors import ConfigError

NORMALIZERS = ("seed-tts", "whisper")

# zhon.hanzi.punctuation (zhon 2.x) = non_stops + stops, inlined codepoint by codepoint.
_ZHON_NON_STOPS = (
    "\uff02\uff03\uff04\uff05\uff06\uff07\uff08\uff09\uff0a\uff0b\uff0c\uff0d"  # fullwidth ASCII
    "\uff0f\uff1a\uff1b\uff1c\uff1d\uff1e\uff20\uff3b\uff3c\uff3d\uff3e\uff3f"
    "\uff40\uff5b\uff5c\uff5d\uff5e\uff5f\uff60"
    "\uff62\uff63\uff64"  # halfwidth CJK punctuation
    "\u3000\u3001\u3003"  # CJK symbols and punctuation (U+3000 is the ideographic space)
    "\u3008\u3009\u300a\u300b\u300c\u300d\u300e\u300f\u3010\u3011"  # angle/corner brackets
    "\u3014\u3015\u3016\u3017\u3018\u3019\u301a\u301b\u301c\u301d\u301e\u301f"
    "\u3030"
    "\u303e\u303f"
    "\u2013\u2014"  # en and em dash
    "\u2018\u2019\u201b\u201c\u201d\u201e\u201f"  # curly quotes, including U+2019
    "\u2026\u2027"  # ellipsis, hyphenation point
    "\ufe4f"
    "\ufe51\ufe54"
    "\u00b7"  # middle dot
)
_ZHON_STOPS = "\uff0e\uff01\uff1f\uff61\u3002"
SEED_TTS_PUNCTUATION = _ZHON_NON_STOPS + _ZHON_STOPS + string.punctuation
_SEED_TTS_DELETE = str.maketrans("", "", SEED_TTS_PUNCTUATION.replace("'", ""))


def seed_tts_normalize(text: str) -> str:
    """seed-tts-eval's English normalization (run_wer.py `process_one`, lang == "en")."""
    # Deleting each character in turn (the reference loop) equals one translate(): deletions
    # commute. The apostrophe is skipped exactly as `if x == '\''`: continue`.
    text = text.translate(_SEED_TTS_DELETE)
    text = text.replace("  ", " ")
    return text.lower()


def seed_tts_zh_normalize(text: str) -> str:
    """seed-tts-eval's Chinese normalization of one text (run_wer.py `process_one`, lang "zh",
    before its character split): punctuation out (apostrophe kept), double spaces once, no case
    change. The transcript's traditional -> simplified step is `to_simplified`."""
    return text.translate(_SEED_TTS_DELETE).replace("  ", " ")


def to_simplified(text: str) -> str:
    """Traditional -> simplified Chinese exactly as seed-tts-eval converts a transcript
    (`zhconv.convert(text, "zh-cn")`); text without Chinese passes through unchanged."""
    return _zhconv_convert()(text, "zh-cn")


def _zhconv_convert() -> Callable[[str, str], str]:
    try:
        from zhconv import convert
    except ImportError:
        raise ConfigError(
            "error: scoring a Chinese set needs zhconv (wer.language: zh); pip install zhconv "
            "(or omni-tts-bench[speech])"
        ) from None
    return convert


def _whisper_normalizer() -> Callable[[str], str]:
    try:
        from whisper.normalizers import EnglishTextNormalizer
    except ImportError:
        raise ConfigError(
            "error: the `whisper` normalizer needs openai-whisper (--normalizer / wer.normalizer); "
            "pip install openai-whisper, or use --normalizer seed-tts"
        ) from None
    return EnglishTextNormalizer()


def get_normalizer(name: str) -> Callable[[str], str]:
    """The normalizer called `name`; a ConfigError lists the valid choices."""
    if name == "seed-tts":
        return seed_tts_normalize
    if name == "whisper":
        return _whisper_normalizer()
    raise ConfigError(
        f"error: unknown normalizer {name!r} (--normalizer / wer.normalizer); "
        f"valid: {', '.join(NORMALIZERS)}"
    )
