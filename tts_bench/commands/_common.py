"""Option handling shared by the subcommands (kept free of heavy imports: `--help` stays fast)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer

from tts_bench.errors import ConfigError

FORMATS = ("md", "table", "csv", "json")


def check_format(fmt: str | None) -> str:
    """The `--format` value, validated; None -> `table` on a terminal, `md` when piped."""
    if fmt is None:
        from tts_bench.report.tables import default_format  # lazy: pandas and rich

        return default_format(sys.stdout)
    if fmt not in FORMATS:
        raise ConfigError(f"error: unknown format {fmt!r} (--format); valid: {', '.join(FORMATS)}")
    return fmt


def result_dir_option(value: str | None) -> Path | None:
    """`--result-dir` as typed (the parameter is declared `str` so that this sees it before
    click's Path type turns '' into '.', the working folder): an empty value is a usage error."""
    if value is None:
        return None
    if not value.strip():
        raise typer.BadParameter("is empty; pass a directory for the run directories, or leave it out "
                                 "for the default results/runs")
    return Path(value)


class Yaml(str):
    """A value already written as YAML (e.g. `null`): `flag_sets` passes it through as it is."""


def flag_sets(triples: Iterable[tuple[str, Any, str]]) -> list[str]:
    """Option flags as `--set key=value` overrides, from (key, value, option name): flags are
    sugar for --set, so the resolved config (and its hash) records them, and an error about one
    names its option (`FlagOverride`). A None value is a flag not given (left out); a string is
    written as a JSON string, a YAML double-quoted one whatever it holds (quotes, colons, `#`),
    so `--asr-model "a: b"` stays a string; a bool as true/false; Yaml as it is."""
    from tts_bench.config.files import FlagOverride

    return [FlagOverride(f"{key}={_yaml_value(value)}", flag) for key, value, flag in triples if value is not None]


def _yaml_value(value: Any) -> str:
    if isinstance(value, Yaml):
        return str(value)
    if isinstance(value, str | bool):
        return json.dumps(value)
    return str(value)
