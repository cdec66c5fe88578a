"""Reading the user's text files (configs, prompt lists) as UTF-8, with errors a person can act on.

A decode error from Python names a byte offset into the file; people fix files by line. Every
reader of user-written text goes through `read_utf8`, so a Latin-1 config or meta.lst is an exit
2 naming the file and the line, and a UTF-8 byte-order mark (Windows editors write one) never
ends up inside the first key or utterance id.

    text = read_utf8(Path("my-set/meta.lst"), what="prompt list", option="prompts.meta")
"""

from __future__ import annotations

from pathlib import Path

from tts_bench.errors import ConfigError

_BOM = "\ufeff"


def decode_utf8(data: bytes, *, source: str, what: str) -> str:
    """`data` as text (a leading BOM dropped); a non-UTF-8 byte is a ConfigError naming its line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = data[exc.start : exc.start + 1].hex()
        raise ConfigError(
            f"error: {what} is not UTF-8: byte 0x{byte} at line {line}, column {column} "
            f"({source}:{line}); save the file as UTF-8"
        ) from None
    return text.removeprefix(_BOM)


def read_utf8(path: Path, *, what: str, option: str) -> str:
    """Read a user's text file; unreadable or not UTF-8 -> ConfigError naming file and line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"error: {what} not found ({path}); check the path ({option})") from None
    except IsADirectoryError:
        raise ConfigError(f"error: {what} {path} is a directory ({option}); pass a file") from None
    except OSError as exc:
        raise ConfigError(
            f"error: cannot read {what} ({path}): {exc.strerror or exc}; check the path ({option})"
        ) from None
    return decode_utf8(data, source=str(path), what=what)
