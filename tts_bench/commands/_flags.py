"""Boolean and counting options render as flags in `--help`.

typer 0.29's rich help prints a value type beside every option, `<bool>` for a flag (`--help`
included) and `<int>` for a counter (`-v`), as if `--traceback true` or `--verbose 2` were the
syntax. `render_flags_as_flags()` (called once by `tts_bench.cli`) makes typer's options show no
type for flags and counters, as click's own help does. Older typers have no such column; there
it changes nothing.

    tts-bench --help      # --traceback    Re-raise errors with a traceback.
"""

from __future__ import annotations

try:
    from typer.core import TyperOption
except ImportError:  # pragma: no cover - typer without its own option class
    TyperOption = None


def render_flags_as_flags() -> None:
    if TyperOption is None:  # pragma: no cover
        return
    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "flags_as_flags", False):
        return

    def display_type_rich(self, ctx):  # noqa: ANN001 - typer's signature
        if getattr(self, "is_flag", False) or getattr(self, "count", False):
            return None
        return original(self, ctx)

    display_type_rich.flags_as_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich
