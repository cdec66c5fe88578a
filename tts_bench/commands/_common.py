"""Option handling shared by the subcommands (kept free of heavy imports: `--help` stays fast)."""

from __future__ import annotations

import sys

from tts_bench.errors import ConfigError

FORMATS = ("md", "table", "csv", "json")


def check_format(fmt: str | None) -> str:
    """The `--format` value, validated; None -> `table` on a terminal, `md` when piped."""
    if fmt is None:
        from tts_bench.tables import default_format

        return default_format(sys.stdout)
    if fmt not in FORMATS:
        raise ConfigError(f"error: unknown format {fmt!r} (--format); valid: {', '.join(FORMATS)}")
    return fmt
