"""Text -> talker text-token ids: the checkpoint's tokenizer, or a deterministic stand-in.

With a weights dir, `load_tokenizer` reads its `tokenizer.json` with the `tokenizers` package
(the Qwen vocabulary the thinker speaks; nothing is downloaded). Without one, `WordHashTokenizer`
stands in: lowercase words and punctuation marks, each mapped to
`blake2b(word) mod standin_text_vocab` -- stable across processes, runs and Python versions
(Python's own `hash()` is salted per process, so it is not used). One id per word keeps the
condition length close to a real tokenizer's for English.

    >>> WordHashTokenizer(151643).encode("Hello, world")  # three ids: hello , world
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)

# Words (letters/digits, incl. CJK runs) or single punctuation marks.
_PIECES = re.compile(r"\w+|[^\w\s]")


class TokenizerError(ValueError):
    """The tokenizer named by a weights dir cannot be read."""


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class WordHashTokenizer:
    """Deterministic word-level stand-in; ids in [0, vocab)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        return [_stable_id(piece, self.vocab) for piece in _PIECES.findall(text.lower())]


def _stable_id(piece: str, vocab: int) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab


class HFTokenizer:
    """The checkpoint's `tokenizer.json` (no special tokens added: the talker sees text only)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise TokenizerError(
                f"error: cannot read tokenizer ({path}): {exc}; check the weights dir"
            ) from exc

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def load_tokenizer(weights_dir: str | None, standin_vocab: int) -> TextTokenizer:
    """The weights dir's tokenizer.json if given (required there), else the stand-in."""
    if weights_dir is None:
        return WordHashTokenizer(standin_vocab)
    path = Path(weights_dir) / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(
            f"error: tokenizer.json not found ({path}); "
            "use the MiniCPM-o 4.5 checkpoint dir, which ships it"
        )
    logger.info("talker tokenizer: %s", path)
    return HFTokenizer(path)
