"""Target texts the WER gate can score, checked before any audio is made or transcribed (exit 2).

The gate scores English the way seed-tts-eval's `en` path does (an English normalizer, then word
error rate over space-separated words) and Chinese (`wer.language: zh`) the way its `zh` path
does (character error rate). Two kinds of text cannot be scored, and finding out after minutes
of synthesis and transcription (or, worse, getting a number) helps nobody:

- on an English set, letters of a non-Latin script (Chinese, Japanese, Cyrillic, ...): a
  sentence without spaces counts as one "word"; a Chinese set says `wer.language: zh`;
- a text the normalizer leaves without words (only punctuation, symbols or emoji, or only
  fillers under the `whisper` normalizer): a word error rate has no words to divide by.

    check_reference_texts([(p.utt, p.text, f"meta.lst:{p.line}") for p in prompts], "seed-tts", language="en")
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from tts_bench.errors import ConfigError
from tts_bench.wer.language import get_scorer

_MAX_REPORTED = 10
# Letters of Latin-1 that carry no script name of their own.
_LATIN_EXTRAS = frozenset("\u00aa\u00b5\u00ba")  # ª µ º


def foreign_letter(text: str) -> str | None:
    """The first letter of `text` outside the Latin script, or None."""
    for ch in text:
        if ch.isalpha() and ch not in _LATIN_EXTRAS and not unicodedata.name(ch, "").startswith("LATIN"):
            return ch
    return None


def has_words(normalized: str) -> bool:
    """Whether a normalized text holds a word: a letter or a digit. Emoji and other symbols
    survive the normalizers (they strip punctuation only) but are no words a listener or an ASR
    model could get right or wrong."""
    return any(ch.isalnum() for ch in normalized)


def _script(ch: str) -> str:
    return unicodedata.name(ch, "UNKNOWN").split()[0].title()  # "CJK UNIFIED IDEOGRAPH-5728" -> "Cjk"


def check_reference_texts(items: Iterable[tuple[str, str, str]], normalizer: str, *, language: str = "en") -> None:
    """`items`: (utterance id, target text, where it comes from). A ConfigError (exit 2) lists
    the texts the gate cannot score in `language`, with why; nothing happens when all can be
    scored. Resolves the normalizer (and its language pairing) too: a bad one is exit 2 here."""
    normalize = get_scorer(language, normalizer).reference
    problems: list[str] = []
    for utt, text, where in items:
        letter = foreign_letter(text) if language == "en" else None
        if letter is not None:
            script = "CJK" if _script(letter) == "Cjk" else _script(letter)
            hint = ("; a Chinese set is scored by character with wer.language: zh" if script == "CJK"
                    else "")
            problems.append(f"{where}: {utt!r} has {script} letters ({letter!r}): an English set is scored "
                            f"in words{hint}")
        elif not has_words(normalize(text)):
            problems.append(f"{where}: {utt!r} has no words after the {normalizer} normalizer ({text!r}): "
                            "only punctuation, symbols or emoji leave no words to count errors against")
    if problems:
        shown = "\n  ".join(problems[:_MAX_REPORTED])
        more = len(problems) - _MAX_REPORTED
        tail = f"\n  ... and {more} more" if more > 0 else ""
        raise ConfigError(f"error: the WER gate cannot score {len(problems)} target text(s):\n  {shown}{tail}\n"
                          "use a prompt set in wer.language, or remove those lines (prompts.meta)")
