"""Strict parsing of boolean stage flags (the `extra` mapping of a stage config).

Why strict: `bool("false")` is True, so a quoted YAML/JSON override used for accuracy triage
would silently keep a feature on. Every boolean a stage reads from its `extra` goes through
`read_bool_flag`, at construction, on every platform, so a typo fails at startup everywhere.

    >>> read_bool_flag({"token2wav_device_spk": " FALSE "}, "token2wav_device_spk", True)
    False
    >>> read_bool_flag({"token2wav_device_spk": None}, "token2wav_device_spk", True)  # null = unset
    True

Each stage's options are one table of `Option` rows (`stages.talker.options.OPTIONS`,
`stages.code2wav.options.OPTIONS`): the key, the options field it sets, its default, one line on
what it does and the standing decision behind the default; the options dataclasses take their
defaults from it, and tests hold the shipped stage YAMLs to it.

Dependency-free on purpose: both stages and the harness import it. Public for the harness
(tests/unit/test_layering.py): its own boolean settings (`TTS_BENCH_SKIP_MEMORY_CHECK`) are read
by the same rule as the stage flags, so true/false mean the same everywhere, and its config
loader tells an environment flag's error (`EnvFlagError`) from the config file's.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})


@dataclass(frozen=True)
class Option:
    """One row of a stage's option table."""

    key: str  # the stage `extra` key
    field: str | None  # the options dataclass field it sets; None for an alias of another key
    default: Any  # what a missing key or an explicit null means (with no environment flag set)
    doc: str  # one line: what it does
    decision: str | None = None  # the results/decisions.md id that settled the default, if one did


def defaults(table: Iterable[Option]) -> dict[str, Any]:
    """{field: default} of a table's rows that set a field: what the options dataclass's field
    defaults are made from (`stages.talker.options.TalkerOptions`)."""
    return {row.field: row.default for row in table if row.field is not None}


class FlagError(ValueError):
    """A stage flag holds a value that is not a boolean."""


class EnvFlagError(FlagError):
    """An environment variable a stage reads holds a value it does not accept.

    Its message is complete (it names the variable and says `(environment)`): a config loader
    must not attribute it to the config file it happened to be loading."""


def parse_bool_flag(value: Any, *, key: str) -> bool:
    """True/False/1/0 and their string forms (case- and space-insensitive); anything else raises."""
    # bool is a subclass of int: test it first so True is not read as the integer 1 by accident.
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        token = value.strip().lower()
        if token in _TRUE:
            return True
        if token in _FALSE:
            return False
    raise FlagError(
        f"error: stage flag {key!r} must be true/false/1/0, got {value!r} "
        f"(stage config extra); write true or false"
    )


def read_bool_flag(extra: Mapping[str, Any] | None, key: str, default: bool) -> bool:
    """Read `key` from a stage's `extra`; missing or explicit null means `default`."""
    if extra is None or extra.get(key) is None:
        return default
    return parse_bool_flag(extra[key], key=key)


def read_env_opt_out(name: str, env: Mapping[str, str] | None = None) -> bool:
    """True when environment variable `name` opts a feature out (`0`/`false`).

    Read once by the caller (at import or construction), never per call. Unset or empty means no
    opt-out; a value that is not a boolean raises EnvFlagError so a typo in CI's environment is
    not ignored. Stage configs call this at construction (`StageConfig`), so the harness reports
    a bad value before any stage process starts.
    """
    raw = (os.environ if env is None else env).get(name)
    if raw is None or raw.strip() == "":
        return False
    try:
        return not parse_bool_flag(raw, key=name)
    except FlagError:
        raise EnvFlagError(
            f"error: environment variable {name} must be true/false/1/0, got {raw!r} "
            f"(environment); set {name}=0 to opt out, or unset it"
        ) from None


def check_known_keys(extra: Mapping[str, Any] | None, known: Iterable[str], *, stage: str) -> None:
    """Reject `extra` keys a stage does not read, naming the nearest valid one (typo guard)."""
    valid = sorted(known)
    for key in extra or {}:
        if key not in valid:
            near = difflib.get_close_matches(key, valid, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(valid)}"
            raise FlagError(f"error: unknown {stage} stage extra key {key!r} (stage config extra); {hint}")
