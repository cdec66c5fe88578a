"""The `tts-bench` command line: the one place where errors become exit codes.

    tts-bench ab  --config configs/ab/default.yaml --tiers 2x1,4x2
    tts-bench wer --disable-shuffle --num-prompts 20
    tts-bench mem --tier 128x8 --interval 2

Results go to stdout; logs, warnings and progress to stderr. `--traceback` re-raises.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys
import threading

import typer

from tts_bench.commands import ab, baseline, bisect, calibrate, gate, mem, plot, profile, serve, wer
from tts_bench.commands._flags import render_flags_as_flags
from tts_bench.errors import ExitStatus, TtsBenchError

render_flags_as_flags()

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="TTS serving benchmarks and accuracy gates.",
    pretty_exceptions_enable=False,
)

_state = {"traceback": False, "terminated": False}


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at emit time, not the stream seen at setup: the CLI
    can be invoked in-process (typer's CliRunner, `tts-bench serve` tests) where the stderr of
    an earlier invocation has been closed since."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


@app.callback()
def _root(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More logging on stderr."),
    traceback: bool = typer.Option(False, "--traceback", help="Re-raise errors with a traceback."),
) -> None:
    _state["traceback"] = traceback
    level = logging.WARNING - 10 * min(verbose, 2) if verbose else logging.INFO
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # faster-whisper logs two INFO lines per utterance; keep them for -vv only.
    logging.getLogger("faster_whisper").setLevel(level if verbose >= 2 else logging.WARNING)


def _register() -> None:
    # Each subcommand lives in its own module; registering here keeps this file the single
    # entry point and the exception boundary.
    app.command("ab")(ab.ab)
    app.command("mem")(mem.mem)
    app.command("wer")(wer.wer)
    app.command("serve")(serve.serve)
    app.command("profile")(profile.profile)
    app.command("gate")(gate.gate)
    app.command("calibrate")(calibrate.calibrate)
    app.command("plot")(plot.plot)
    app.command("bisect")(bisect.bisect)
    app.add_typer(baseline.app, name="baseline")


_register()


def _exception_classes(name: str) -> tuple[type, ...]:
    """Class `name` from click and from typer's vendored click (typer >= 0.2x raises its own
    copies, which are not click's: checking click's classes alone let `--num-prompts abc` fall
    through to exit 1)."""
    found = []
    for module in ("click.exceptions", "typer._click.exceptions", "typer.exceptions"):
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


def main() -> None:
    """Console-script entry: run the app and map typed errors to exit codes in one place.

    0 ok, 1 error, 2 usage/config (every click/typer usage error too), 3/4 regressions, 5 invalid
    run, 130 interrupted (Ctrl-C: one line, no traceback; stage processes ignore SIGINT and are
    stopped by this process), 143 terminated (SIGTERM, handled as Ctrl-C is)."""
    _sigterm_interrupts()
    try:
        result = app(standalone_mode=False)
    except TtsBenchError as exc:
        if _state["traceback"]:
            raise
        print(str(exc), file=sys.stderr)
        sys.exit(int(exc.exit_status))
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:
        if isinstance(exc, _exception_classes("Exit")):
            sys.exit(exc.exit_code)
        if isinstance(exc, _exception_classes("Abort")):  # click turns Ctrl-C into Abort
            _interrupted()
        if isinstance(exc, _exception_classes("ClickException")):  # usage: bad option, value
            exc.show()
            sys.exit(int(ExitStatus.USAGE))
        if _state["traceback"]:
            raise
        print(f"error: {type(exc).__name__}: {exc}; rerun with --traceback for details", file=sys.stderr)
        sys.exit(int(ExitStatus.ERROR))
    if result == ExitStatus.INTERRUPTED:  # typer turns KeyboardInterrupt into Exit(130) itself
        _interrupted()
    sys.exit(int(result) if isinstance(result, int) else 0)


def _sigterm_interrupts() -> None:
    """SIGTERM (`timeout`, a CI job's time limit) stops a command the way Ctrl-C does: the run
    record ends `interrupted` (an A/B can be finished with --resume) and the stage processes are
    stopped in order, instead of the process dying with run.json still `running`. A handler
    someone else installed (an embedding program) is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: object) -> None:
        _state["terminated"] = True
        # Delivered as Ctrl-C is. Inside asyncio.run the SIGINT handler is the runner's, which
        # cancels the main task so that every task unwinds through its finally blocks and
        # asyncio.run raises KeyboardInterrupt at the end. Raising here instead would land in
        # whichever task step is running, which then dies with it unretrieved ("Task exception
        # was never retrieved" and a traceback on stderr).
        on_sigint = signal.getsignal(signal.SIGINT)
        if callable(on_sigint) and on_sigint is not signal.default_int_handler:
            on_sigint(signal.SIGINT, frame)
            return
        # No such handler (no loop, or SIGINT ignored as in a script's background job, so
        # asyncio.run installed none): a running loop gets the interrupt from a callback of its
        # own, outside every task, then cancels the tasks as it leaves.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise KeyboardInterrupt from None
        loop.call_soon_threadsafe(_raise_interrupt)

    signal.signal(signal.SIGTERM, on_sigterm)


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def _interrupted() -> None:
    what, code = ("terminated (SIGTERM)", ExitStatus.TERMINATED) if _state["terminated"] else (
        "interrupted (Ctrl-C)", ExitStatus.INTERRUPTED)
    print(f"error: {what}; the run record says so, finish it with --resume where the command "
          "has one", file=sys.stderr)
    sys.exit(int(code))


if __name__ == "__main__":
    main()
