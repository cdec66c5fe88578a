"""Result tables: one pandas DataFrame per comparison, rendered as md / rich table / csv / json.

Builders (`ab_table`, ...) turn comparison records into a DataFrame of display strings; `render`
turns any DataFrame into text. The markdown is a plain pipe table meant to be pasted into a PR,
shaped like the tables engineers already write by hand:

    | Tier (conc x repl) | base mean / median | test mean / median | delta (mean) | 95% CI | verdict | MDE |
    | 64 x 4 | 0.7486 / 0.7291 | 0.7105 / 0.7069 | -5.1% | [-6.3%, -3.9%] | faster | 2.1% |

(the MDE column appears when the tiers carry `mde_pct`: the smallest |delta| the run could
resolve; a `within noise` cell then says so: "within noise; could not resolve < 7.9%").

    df = ab_table(tiers)                         # tiers: list of dicts, see `ab_table`
    sys.stdout.write(render(df, default_format(sys.stdout), title="A/B audio RTF"))
    print_table(df, Console(stderr=False))       # rich, honours NO_COLOR and non-TTY output

Results go to stdout; callers decide the stream. Deltas use an ASCII minus so the text
survives every terminal and grep.
"""

from __future__ import annotations

import io
import json
import math
import shutil
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TextIO

import pandas as pd
from rich.console import Console
from rich.table import Table

Format = Literal["md", "table", "csv", "json"]
FORMATS: tuple[Format, ...] = ("md", "table", "csv", "json")

AB_COLUMNS = (
    "Tier (conc x repl)",
    "base mean / median",
    "test mean / median",
    "delta (mean)",
    "95% CI",
    "verdict",
)
MDE_COLUMN = "MDE"
NOTE_COLUMN = "note"
_VERDICT_STYLE = {"faster": "bold green", "slower": "bold red", "within noise": "dim"}


def fmt_pct(value: float | None, digits: int = 1) -> str:
    """Signed percentage with an ASCII minus: -1.5%, +0.4%, +0.0%."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if round(value, digits) == 0:
        value = 0.0  # never print "-0.0%"
    return f"{value:+.{digits}f}%"


def fmt_ci(ci: Sequence[float] | None, digits: int = 1) -> str:
    """`[-3.1%, +0.4%]`."""
    if ci is None or len(ci) != 2:
        return "n/a"
    return f"[{fmt_pct(ci[0], digits)}, {fmt_pct(ci[1], digits)}]"


def fmt_value(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def fmt_tier(tier: Any) -> str:
    """`64x4` / Tier(64, 4) -> `64 x 4` (the seed's spelling)."""
    label = getattr(tier, "label", tier)
    conc, _, repl = str(label).partition("x")
    return f"{conc.strip()} x {repl.strip()}" if repl else str(label)


def _arm_stats(row: Mapping[str, Any], arm: str, index: int, metric: str) -> Mapping[str, Any]:
    """Stats of one arm: row["arms"] (by the names base/test when both exist, else by position:
    first = base), or flat row[f"{arm}_mean"] keys."""
    arms = row.get("arms")
    if isinstance(arms, Mapping) and arms:
        if "base" in arms and "test" in arms:
            return arms[arm]
        return list(arms.values())[index]
    return {
        f"mean_{metric}": row.get(f"{arm}_mean"),
        f"median_{metric}": row.get(f"{arm}_median"),
        "failed": row.get(f"{arm}_failed", 0),
        "mean_audio_seconds": row.get(f"{arm}_mean_audio_seconds"),
    }


def _note(row: Mapping[str, Any], base: Mapping[str, Any], test: Mapping[str, Any]) -> str:
    notes = []
    if row.get("duration_mismatch"):
        pct = row.get("duration_delta_pct")
        # RTF moves with output length, so a length change can masquerade as a speed change.
        notes.append("audio length " + (fmt_pct(pct) if pct is not None else "differs"))
    failed = (int(base.get("failed") or 0), int(test.get("failed") or 0))
    if any(failed):
        notes.append(f"failed base {failed[0]} / test {failed[1]}")
    if row.get("note"):
        notes.append(str(row["note"]))
    return "; ".join(notes)


def ab_table(
    tiers: Sequence[Mapping[str, Any]],
    *,
    metric: str = "audio_rtf",
    digits: int = 4,
    base_label: str = "base",
    test_label: str = "test",
) -> pd.DataFrame:
    """One row per tier. Each tier dict carries:

    - `tier`: "64x4" (or a Tier);
    - the arms, either `arms: {base: {mean_audio_rtf, median_audio_rtf, failed}, test: {...}}`
      (the first arm is the base when the names differ) or flat `base_mean`, `base_median`,
      `test_mean`, `test_median`;
    - `delta_mean_pct`, `ci95_pct` ([lo, hi]), `verdict` (the cell shows `verdict_detail` when
      given: "within noise; could not resolve < 7.9%");
    - optional `mde_pct` (an `MDE` column after the verdict when any tier has the key), shown
      as `~0.5%` when `mde_rough` (an MDE from fewer than 3 blocks is itself noise);
    - optional `duration_mismatch` (bool) with `duration_delta_pct`, and a free `note`.

    A `note` column is added only when some tier has a note (length mismatch, failures).
    """
    rows, notes = [], []
    with_mde = any("mde_pct" in row for row in tiers)
    for row in tiers:
        base = _arm_stats(row, "base", 0, metric)
        test = _arm_stats(row, "test", 1, metric)
        rows.append(
            {
                AB_COLUMNS[0]: fmt_tier(row["tier"]),
                AB_COLUMNS[1]: _mean_median(base, metric, digits),
                AB_COLUMNS[2]: _mean_median(test, metric, digits),
                AB_COLUMNS[3]: fmt_pct(row.get("delta_mean_pct")),
                AB_COLUMNS[4]: fmt_ci(row.get("ci95_pct")),
                AB_COLUMNS[5]: str(row.get("verdict_detail") or row.get("verdict") or "n/a"),
                MDE_COLUMN: ("~" if row.get("mde_rough") and row.get("mde_pct") is not None else "")
                + fmt_pct(row.get("mde_pct")).lstrip("+"),
            }
        )
        notes.append(_note(row, base, test))
    columns = [*AB_COLUMNS, MDE_COLUMN] if with_mde else list(AB_COLUMNS)
    df = pd.DataFrame(rows, columns=columns, dtype=object)
    if any(notes):
        df[NOTE_COLUMN] = notes
    if (base_label, test_label) != ("base", "test"):
        df = df.rename(
            columns={
                AB_COLUMNS[1]: f"{base_label} mean / median",
                AB_COLUMNS[2]: f"{test_label} mean / median",
            }
        )
    return df


def _mean_median(stats: Mapping[str, Any], metric: str, digits: int) -> str:
    return (
        f"{fmt_value(stats.get(f'mean_{metric}'), digits)} / "
        f"{fmt_value(stats.get(f'median_{metric}'), digits)}"
    )


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def to_markdown(df: pd.DataFrame, *, title: str | None = None) -> str:
    """Pipe table with padded columns (readable raw, renders on GitHub)."""
    header = [str(c) for c in df.columns]
    body = [
        [_cell(v).replace("|", "\\|").replace("\n", " ") for v in r]
        for r in df.itertuples(index=False)
    ]
    widths = [max([len(h), 3, *(len(r[i]) for r in body)]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(header), "| " + " | ".join("-" * w for w in widths) + " |"]
    out += [line(r) for r in body]
    text = "\n".join(out) + "\n"
    return f"**{title}**\n\n{text}" if title else text


def to_rich(df: pd.DataFrame, *, title: str | None = None) -> Table:
    """A rich Table; verdict cells are coloured (colour disappears under NO_COLOR)."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for col in df.columns:
        # Only the free-text note may wrap; numbers split over lines are unreadable.
        table.add_column(str(col), overflow="fold", no_wrap=col != NOTE_COLUMN)
    for r in df.itertuples(index=False):
        cells = []
        for col, value in zip(df.columns, r):
            text = _cell(value)
            style = _VERDICT_STYLE.get(text.split(";")[0]) if col == "verdict" else None
            cells.append(f"[{style}]{text}[/]" if style else text.replace("[", "\\["))
        table.add_row(*cells)
    return table


def print_table(df: pd.DataFrame, console: Console, *, title: str | None = None) -> None:
    """Print to the caller's Console (which decides TTY, width and NO_COLOR)."""
    console.print(to_rich(df, title=title))


def render(
    df: pd.DataFrame,
    fmt: Format,
    *,
    title: str | None = None,
    width: int | None = None,
    color: bool = False,
) -> str:
    """Render a DataFrame as text in one of FORMATS. `table` is rich's box drawing at `width`
    (default: the terminal's, honouring COLUMNS, else 120); ANSI colour only when `color` is
    True, and NO_COLOR always wins."""
    if fmt == "md":
        return to_markdown(df, title=title)
    if fmt == "csv":
        return df.to_csv(index=False, lineterminator="\n")
    if fmt == "json":
        doc = {
            "title": title,
            "columns": [str(c) for c in df.columns],
            "rows": [{str(k): _cell(v) for k, v in rec.items()} for rec in df.to_dict("records")],
        }
        return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if fmt == "table":
        buf = io.StringIO()
        width = width or shutil.get_terminal_size((120, 24)).columns
        # "standard" rather than "auto": the caller already decided this goes to a terminal, and
        # auto-detection on a StringIO would read TERM of whatever runs the tests.
        console = Console(
            file=buf, width=width, force_terminal=color, color_system="standard" if color else None
        )
        print_table(df, console, title=title)
        return buf.getvalue()
    raise ValueError(f"unknown table format {fmt!r}; valid: {', '.join(FORMATS)}")


def default_format(stream: TextIO) -> Format:
    """`table` on an interactive terminal, `md` when piped or redirected."""
    isatty = getattr(stream, "isatty", None)
    try:
        return "table" if isatty is not None and isatty() else "md"
    except (ValueError, OSError):  # closed or detached stream
        return "md"
