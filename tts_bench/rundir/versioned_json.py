"""Versioned JSON files the harness keeps between runs (baselines, calibrations): one reader
that checks the format version and answers in our words (they are written with
`tts_bench.rundir.atomic_json.write_json_atomic`).

A file's format is described once, next to the code that builds it; readers get the document
only when it is there, parses, and carries the version this tts-bench reads. Every failure is
a ConfigError (exit 2) that names the file, the flag it came from and what to do:

    BASELINE = VersionedJson("baseline", "baseline_version", 1, flag="--baseline",
                             record_hint="record one with tts-bench baseline update ...",
                             stale_hint="re-record it")
    doc = BASELINE.load(path)
    write_json_atomic(path, {**BASELINE.stamp(), ...})
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tts_bench.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class VersionedJson:
    """One file format: what it is called, where its version lives, and the user's next step."""

    what: str  # "baseline": the noun in "no baseline at <path>"
    version_key: str  # the top-level key holding the format version
    version: int  # the version this tts-bench reads and writes
    flag: str  # the option the path came from, e.g. "--baseline"
    record_hint: str  # how to make one when there is none
    stale_hint: str  # what to do with a file of another version

    def stamp(self) -> dict[str, int]:
        """The version entry a new document of this format starts with."""
        return {self.version_key: self.version}

    def load(self, path: Path | str, *, flag: str | None = None) -> dict[str, Any]:
        """The document at `path`; `flag` names where the path came from when not `self.flag`
        (a calibration found next to a baseline)."""
        if flag is not None and flag != self.flag:
            return dataclasses.replace(self, flag=flag).load(path)
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"), parse_int=_int_or_long)
        except FileNotFoundError:
            raise ConfigError(f"error: no {self.what} at {path} ({self.flag}); {self.record_hint}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"error: {path} is not valid JSON: {exc} ({self.flag}); restore it from git") from None
        except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, binary junk
            raise ConfigError(f"error: cannot read {self.what} {path}: {exc} ({self.flag}); "
                              f"pass a {self.what} JSON file") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"error: {path} is not a {self.what} (a JSON {type(doc).__name__}, not an object) "
                              f"({self.flag}); {self.record_hint}")
        long = _long_int_key(doc)
        if long is not None:
            key, digits = long
            raise ConfigError(f"error: {path} holds an integer of {digits:,} digits at {key} ({self.flag}); no value "
                              f"of a {self.what} has more than {MAX_INT_DIGITS}: restore it from git or "
                              f"{self.stale_hint}")
        if doc.get(self.version_key) != self.version:
            raise ConfigError(f"error: {path} has {self.version_key} {doc.get(self.version_key)!r}, this "
                              f"tts-bench reads {self.version} ({self.flag}); {self.stale_hint}")
        return doc


MAX_INT_DIGITS = 20  # 2**64 has 20: counts, seeds and versions fit; Python refuses to parse 4,300+


class _LongInt(str):
    """An integer literal too long to be a value of ours, kept as its digits (parse_int hook):
    it is found by key and refused, where int() would raise without saying where."""


def _int_or_long(digits: str) -> int | _LongInt:
    return int(digits) if len(digits.lstrip("-")) <= MAX_INT_DIGITS else _LongInt(digits)


def _long_int_key(doc: Any, key: str = "") -> tuple[str, int] | None:
    """(dotted key, digit count) of the first _LongInt in `doc`, or None."""
    if isinstance(doc, _LongInt):
        return key or "the top level", len(doc.lstrip("-"))
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        found = _long_int_key(v, f"{key}[{k}]" if isinstance(k, int) else f"{key}.{k}" if key else str(k))
        if found is not None:
            return found
    return None
