"""`tts-bench profile` through typer's CliRunner on the default (tiny) A/B config, B = 1 and 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tts_bench.commands.profile import parse_rows, profile
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.profile import STEPS

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--config", str(ROOT / "configs/ab/default.yaml"), "--rows", "1,2", "--chunks", "1"]


def _app() -> typer.Typer:
    # The command as cli.py registers it; a local app keeps this test independent of the others.
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)
    app.command("profile")(profile)
    return app


def invoke(*args: str):
    result = CliRunner().invoke(_app(), ["profile", *FAST, *args],
                                env={"NO_COLOR": "1", "COLUMNS": "120"}, standalone_mode=False)
    if result.exception is not None:
        raise result.exception
    return result


def test_md_and_json_render_the_same_counts():
    md = invoke("--format", "md")
    assert md.return_value == ExitStatus.OK
    lines = md.stdout.splitlines()
    assert lines[0].startswith("**launches per call on ")
    assert lines[0].endswith("(1 profiled calls each; cache split: base per-row, test batched)**")
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header == ["B", "step", "unit", "base", "test", "delta", "delta %"]
    splits = [[c.strip() for c in line.strip("|").split("|")] for line in lines if "| cache_split " in line]
    assert [cells[:1] + cells[3:6] for cells in splits] == [["1", "3", "3", "0"], ["2", "6", "3", "-3"]]

    doc = json.loads(invoke("--format", "json").stdout)  # one document, nothing else on stdout
    assert doc["arms"] == ["base", "test"] and doc["rows"] == [1, 2] and doc["chunks"] == 1
    assert doc["columns"][:3] == ["B", "step", "unit"]
    assert [(r["B"], r["step"]) for r in doc["table"]] == [(b, s) for b in ("1", "2") for s in STEPS]
    by_step = {(p["arm"], p["rows"]): p["counts"] for p in doc["profiles"]}
    split = [by_step[(arm, 2)]["cache_split"]["per_call"] for arm in ("base", "test")]
    assert split == [6.0, 3.0]
    talker = {arm: by_step[(arm, 1)]["talker_step"]["per_call"] for arm in ("base", "test")}
    assert talker["base"] == talker["test"] > 0


def test_bad_rows_and_format_are_usage_errors():
    assert parse_rows("1,4,8") == (1, 4, 8)
    for text in ("0", "a,b", "", "4,-1"):
        with pytest.raises(ConfigError, match=r"^error: bad batch sizes .*\(--rows\)"):
            parse_rows(text)
    with pytest.raises(ConfigError, match="--format"):
        invoke("--format", "xml")
