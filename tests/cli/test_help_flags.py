"""`--help` shows boolean and counting options as flags, not as options taking a value."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tts_bench.cli import app


@pytest.mark.parametrize("argv", [["--help"], ["ab", "--help"], ["mem", "--help"], ["wer", "--help"]])
def test_flags_show_no_value_type_in_help(argv, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "160")
    out = CliRunner().invoke(app, argv).output
    flag_rows = [line for line in out.splitlines()
                 if re.match(r"\W*--(help|traceback|verbose|disable-shuffle|until-resolved)\b", line)]
    assert flag_rows, out
    assert not any("<bool>" in row or "<int>" in row for row in flag_rows), "\n".join(flag_rows)
    if argv == ["ab", "--help"]:
        assert re.search(r"--max-repeats\s+<int>", out)  # options with values keep their type
