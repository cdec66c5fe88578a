"""What a set's error rate counts: words for English (WER), characters for Chinese (CER).

seed-tts-eval reports WER on `test-en` and CER on `test-zh` / `test-hard`; both come out of one
function (its run_wer.py `process_one`) that differs only in the normalization and in how the
text is cut into units before jiwer:

| `wer.language` | metric | transcript first | both texts | units jiwer aligns |
|---|---|---|---|---|
| `en` | WER | — | punctuation out (apostrophe kept), double spaces once, lowercase | words |
| `zh` | CER | traditional -> simplified (zhconv, `zh-cn`) | punctuation out (apostrophe kept), double spaces once | characters, whitespace dropped |

seed-tts-eval makes its characters with `" ".join(text)` and lets jiwer's default transform
squeeze and strip the spaces; `units` below keeps every non-whitespace character, which is the
same list (tests/unit/test_cer_parity.py checks it against a re-statement of their function).
A Latin letter in a Chinese sentence is one unit and keeps its case, as there.

    scorer = get_scorer("zh", "seed-tts")
    scorer.metric                      # "cer"
    scorer.units(scorer.reference("你好，世界！"))   # "你 好 世 界"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tts_bench.errors import ConfigError
from tts_bench.wer import normalize as _normalize
from tts_bench.wer.normalize import seed_tts_zh_normalize, to_simplified

LANGUAGES = ("en", "zh")
METRIC = {"en": "wer", "zh": "cer"}


def _same(text: str) -> str:
    return text


@dataclass(frozen=True)
class Scorer:
    """How one set's texts become the unit sequences jiwer aligns."""

    language: str
    normalizer: str
    normalize: Callable[[str], str]  # applied to reference and transcript alike
    prepare_transcript: Callable[[str], str] = _same  # before normalize, transcript only

    @property
    def metric(self) -> str:
        """`wer` (words) or `cer` (characters): the name tables, JSON and history carry."""
        return METRIC[self.language]

    @property
    def by_character(self) -> bool:
        return self.language == "zh"

    def reference(self, text: str) -> str:
        return self.normalize(text)

    def transcript(self, text: str) -> str:
        return self.normalize(self.prepare_transcript(text))

    def units(self, normalized: str) -> str:
        """The space-separated units jiwer splits: words as they are, or one per character."""
        if self.by_character:
            return " ".join(ch for ch in normalized if not ch.isspace())
        return normalized


def get_scorer(language: str, normalizer: str) -> Scorer:
    """The scorer of a set in `language` under `normalizer`; a ConfigError for a pair that
    seed-tts-eval does not define (Whisper's normalizer is English-only)."""
    if language == "en":
        return Scorer("en", normalizer, _normalize.get_normalizer(normalizer))
    if language == "zh":
        if normalizer != "seed-tts":
            raise ConfigError(
                f"error: normalizer {normalizer!r} is English-only (wer.normalizer with wer.language: zh); "
                "use --normalizer seed-tts, seed-tts-eval's Chinese normalization"
            )
        to_simplified("")  # a missing zhconv is exit 2 now, not after the audio is made
        return Scorer("zh", normalizer, seed_tts_zh_normalize, to_simplified)
    raise ConfigError(f"error: unknown language {language!r} (wer.language); valid: {', '.join(LANGUAGES)}")


def as_scorer(normalize: Callable[[str], str] | Scorer) -> Scorer:
    """A Scorer as is; a bare normalizer function scores English words (the older call form)."""
    if isinstance(normalize, Scorer):
        return normalize
    return Scorer("en", getattr(normalize, "__name__", "custom"), normalize)
