"""Output paths checked before the work that ends by writing them (`--out`, `--result-dir`,
`wer.history_dir`): hours of runs must not be lost to a typo found at the end."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tts_bench.errors import ConfigError

# Words that become one file or folder name (an arm's wavs/<arm>/, a profile's
# `<case>.<profile>.json`): no separators, no leading dot, so `a/b` cannot write into a
# folder and `..` cannot climb out.
FILE_NAME_WORD_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
_FILE_NAME_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def is_file_name_word(text: object) -> bool:
    """Whether `text` is a string that may name a file or folder on its own (FILE_NAME_WORD_RULE)."""
    return isinstance(text, str) and _FILE_NAME_WORD.fullmatch(text) is not None


def check_writable(path: Path, *, flag: str, directory: bool) -> None:
    """Before any run: `path` (a directory with `directory`, else a file) can be made or
    replaced there, so hours of runs are not lost to a typo in `--out`."""
    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        want = "a directory" if directory else "a file to write"
        raise ConfigError(f"error: {path} is {'a file' if directory else 'a directory'} ({flag}); "
                          f"{flag} names {want}")
    parent = path if directory else path.parent
    while not parent.exists() and parent != parent.parent:  # the folders mkdir would make
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"error: cannot write under {path}: {parent} is a file ({flag}); pass a path in a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"error: {parent} is not writable ({flag}); pass a path you can write to")


def default_profile() -> str:
    """`cpu-<N>core` from the CPU count; GPU hosts name theirs (`--profile h200`)."""
    return f"cpu-{os.cpu_count() or 1}core"


def resolve_profile(profile: str | None) -> str:
    """`--profile` checked as a file-name-safe word, or the default when not given."""
    if profile is None:
        return default_profile()
    if not is_file_name_word(profile):  # it names `<case>.<profile>.json` in results/baselines
        raise ConfigError(f"error: bad profile {profile!r} (--profile); it names baseline and calibration files: "
                          f"write {FILE_NAME_WORD_RULE}, e.g. cpu-2core or h200")
    return profile
