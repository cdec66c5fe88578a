"""Table builders and renderers: golden markdown, csv/json shape, rich output without colour."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tts_bench.config import Tier
from tts_bench.report.tables import (
    AB_COLUMNS,
    ab_table,
    default_format,
    fmt_ci,
    fmt_pct,
    fmt_tier,
    print_table,
    render,
)

# The seed PR's sampling-kernel table, with CIs and verdicts added.
TIERS = [
    {
        "tier": "32x1",
        "arms": {
            "base": {"mean_audio_rtf": 0.3435, "median_audio_rtf": 0.3326, "failed": 0},
            "test": {"mean_audio_rtf": 0.3383, "median_audio_rtf": 0.3310, "failed": 0},
        },
        "delta_mean_pct": -1.514,
        "ci95_pct": [-3.12, 0.41],
        "verdict": "within noise",
    },
    {
        "tier": "64x4",
        "base_mean": 0.7486,
        "base_median": 0.7291,
        "test_mean": 0.7105,
        "test_median": 0.7069,
        "delta_mean_pct": -5.09,
        "ci95_pct": [-6.3, -3.9],
        "verdict": "faster",
    },
    {
        "tier": Tier(128, 8),
        "arms": {
            "main": {"mean_audio_rtf": 1.2724, "median_audio_rtf": 1.2421, "failed": 2},
            "branch": {"mean_audio_rtf": 1.2119, "median_audio_rtf": 1.1698, "failed": 0},
        },
        "delta_mean_pct": -4.755,
        "ci95_pct": [-5.9, -3.6],
        "verdict": "faster",
        "duration_mismatch": True,
        "duration_delta_pct": 1.42,
    },
]

GOLDEN_MD = """\
**A/B audio RTF**

| Tier (conc x repl) | base mean / median | test mean / median | delta (mean) | 95% CI         | verdict      | note                                       |
| ------------------ | ------------------ | ------------------ | ------------ | -------------- | ------------ | ------------------------------------------ |
| 32 x 1             | 0.3435 / 0.3326    | 0.3383 / 0.3310    | -1.5%        | [-3.1%, +0.4%] | within noise |                                            |
| 64 x 4             | 0.7486 / 0.7291    | 0.7105 / 0.7069    | -5.1%        | [-6.3%, -3.9%] | faster       |                                            |
| 128 x 8            | 1.2724 / 1.2421    | 1.2119 / 1.1698    | -4.8%        | [-5.9%, -3.6%] | faster       | audio length +1.4%; failed base 2 / test 0 |
"""


def test_ab_markdown_matches_golden(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert render(ab_table(TIERS), "md", title="A/B audio RTF") == GOLDEN_MD


def test_ab_columns_are_exact_without_notes():
    df = ab_table(TIERS[:2])
    assert tuple(df.columns) == AB_COLUMNS
    assert AB_COLUMNS == (
        "Tier (conc x repl)",
        "base mean / median",
        "test mean / median",
        "delta (mean)",
        "95% CI",
        "verdict",
    )
    assert df.iloc[1].tolist() == ["64 x 4", "0.7486 / 0.7291", "0.7105 / 0.7069", "-5.1%", "[-6.3%, -3.9%]", "faster"]


def test_arms_are_positional_unless_named_base_and_test():
    row = dict(TIERS[0], arms={"test": {"mean_audio_rtf": 1.0, "median_audio_rtf": 1.0},
                               "other": {"mean_audio_rtf": 2.0, "median_audio_rtf": 2.0}})
    df = ab_table([row])
    assert df.iloc[0, 1] == "1.0000 / 1.0000" and df.iloc[0, 2] == "2.0000 / 2.0000"


def test_arm_labels_can_name_the_commits():
    df = ab_table(TIERS[:1], base_label="main (21ef5b4)", test_label="this branch")
    assert list(df.columns[1:3]) == ["main (21ef5b4) mean / median", "this branch mean / median"]


def test_csv_and_json_carry_the_same_cells():
    df = ab_table(TIERS)
    lines = render(df, "csv").splitlines()
    assert lines[0] == ",".join(list(AB_COLUMNS) + ["note"])
    assert lines[2] == '64 x 4,0.7486 / 0.7291,0.7105 / 0.7069,-5.1%,"[-6.3%, -3.9%]",faster,'
    doc = json.loads(render(df, "json", title="t"))
    assert doc["title"] == "t" and doc["columns"][:6] == list(AB_COLUMNS)
    assert doc["rows"][2]["verdict"] == "faster" and doc["rows"][2]["95% CI"] == "[-5.9%, -3.6%]"


def test_rich_table_has_no_ansi_without_colour(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    text = render(ab_table(TIERS), "table", width=200, title="A/B")
    assert "\x1b[" not in text
    assert "within noise" in text and "[-3.1%, +0.4%]" in text and "128 x 8" in text


def test_print_table_respects_no_color_on_a_terminal_console(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    print_table(ab_table(TIERS), Console(file=buf, force_terminal=True, width=200))
    assert "faster" in buf.getvalue()
    assert "\x1b[32m" not in buf.getvalue() and "\x1b[1;32m" not in buf.getvalue()  # no green


def test_colour_is_used_when_asked_and_allowed(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    text = render(ab_table(TIERS), "table", width=200, color=True)
    assert "\x1b[" in text


def test_default_format_follows_the_stream():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert default_format(Tty()) == "table"
    assert default_format(io.StringIO()) == "md"
    closed = io.StringIO()
    closed.close()
    assert default_format(closed) == "md"


def test_unknown_format_lists_the_choices():
    with pytest.raises(ValueError, match="md, table, csv, json"):
        render(ab_table(TIERS), "html")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "text"),
    [(-1.514, "-1.5%"), (0.41, "+0.4%"), (-0.04, "+0.0%"), (0.0, "+0.0%"), (12.0, "+12.0%"), (None, "n/a")],
)
def test_percent_format_is_signed_with_ascii_minus(value, text):
    assert fmt_pct(value) == text


def test_ci_and_tier_formats():
    assert fmt_ci((-3.12, 0.41)) == "[-3.1%, +0.4%]"
    assert fmt_ci(None) == "n/a"
    assert fmt_tier("64x4") == "64 x 4" and fmt_tier(Tier(2, 1)) == "2 x 1"


def test_markdown_escapes_pipes_in_cells():
    rows = [dict(TIERS[1], note="a|b")]
    assert "a\\|b" in render(ab_table(rows), "md")


def test_table_width_follows_columns_env(monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    lines = render(ab_table(TIERS[:2]), "table").splitlines()
    assert max(len(line) for line in lines) <= 90


def test_missing_comparison_reads_n_a():
    row = {"tier": "2x1", "arms": {"base": {"mean_audio_rtf": None}, "test": {}},
           "delta_mean_pct": None, "ci95_pct": None, "verdict": None}
    assert ab_table([row]).iloc[0].tolist() == ["2 x 1", "n/a / n/a", "n/a / n/a", "n/a", "n/a", "n/a"]


def test_rows_with_an_mde_get_an_mde_column_and_the_verdict_detail(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    rows = [dict(TIERS[0], mde_pct=7.93, verdict_detail="within noise; could not resolve < 7.9%"),
            dict(TIERS[1], mde_pct=2.1),
            {"tier": "2x1", "base_mean": 1.0, "base_median": 1.0, "test_mean": 2.0, "test_median": 2.0,
             "delta_mean_pct": 100.0, "ci95_pct": None, "verdict": "unresolved (1 repeat)", "mde_pct": None}]
    df = ab_table(rows)
    assert tuple(df.columns) == (*AB_COLUMNS, "MDE")
    assert df.iloc[0, 5:].tolist() == ["within noise; could not resolve < 7.9%", "7.9%"]
    assert df.iloc[1, 5:].tolist() == ["faster", "2.1%"]
    assert df.iloc[2, 4:].tolist() == ["n/a", "unresolved (1 repeat)", "n/a"]
    text = render(df, "table", width=200, color=True)
    assert "\x1b[2mwithin noise; could not resolve < 7.9%" in text  # styled like plain `within noise`
