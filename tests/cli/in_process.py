"""Running the command line inside the test process (fast; real processes are tested apart).

    proc = main_in_process("ab", "--tiers", "0x1")     # tts-bench's own entry point, exit code
    result, status = invoke_app(app, "calibrate", ...)   # a typer app: its result and ExitStatus
"""

from __future__ import annotations

import contextlib
import io
import sys
from types import SimpleNamespace

import typer
from typer.testing import CliRunner

from tts_bench.errors import TtsBenchError


def main_in_process(*args: str) -> SimpleNamespace:
    """`tts-bench <args>` through `tts_bench.cli.main`: returncode, stdout, stderr."""
    from tts_bench.cli import main

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["tts-bench", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def invoke_app(app: typer.Typer, *args: str, columns: int = 160):
    """(result, status): a command's returned ExitStatus, or the one its TtsBenchError carries;
    any other exception propagates (a crash is never an exit code here)."""
    result = CliRunner().invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": str(columns)},
                                standalone_mode=False)
    if isinstance(result.exception, TtsBenchError):
        return result, result.exception.exit_status
    if result.exception is not None:
        raise result.exception
    return result, result.return_value
