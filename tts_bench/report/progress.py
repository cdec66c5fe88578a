"""Progress of the long commands (`ab`, `wer`, `mem`, `calibrate`, `gate`, `profile`), on stderr.

On a terminal a rich bar per task; otherwise (a log file, CI, a pipe) one line every
`interval_s` seconds (`TTS_BENCH_PROGRESS_S`, default 30) saying what is done, what remains and
the ETA of the current task, so a run's log shows how far along it is:

    progress: ab 4x2 test r1: 17/24 done, 7 left, ETA 12 s (elapsed 3 min 10 s)

The command opens one reporter (`reporting`); library code that runs the work (the A/B's
phases, the WER's generation and transcription, mem's arms, profile's rows) names its tasks and
advances them through the module functions, which do nothing when no reporter is open (a library
call, a test). Tasks advance between requests or utterances, never inside a decode loop: a
request's record is the unit.

    with reporting("wer"):
        task("generate base", total=80)
        for ...: advance()
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)

DEFAULT_INTERVAL_S = 30.0
_ENV = "TTS_BENCH_PROGRESS_S"

_current: _Reporter | None = None


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


class _Reporter:
    """A line every `interval_s` on `stream` (off a terminal)."""

    def __init__(self, command: str, *, stream: TextIO, interval_s: float,
                 clock=time.monotonic) -> None:
        self.command, self.stream, self.interval_s, self.clock = command, stream, interval_s, clock
        self.t0 = self.last = clock()
        self.description, self.total, self.done = "", 0, 0
        self.first: tuple[float, int] | None = None  # (clock, done) at the task's first advance
        self._lock = threading.Lock()  # transcription advances from worker threads

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def task(self, description: str, total: int | None) -> None:
        with self._lock:
            self.description, self.total, self.done = description, total, 0
            self.first = None

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = self.clock()
            if self.first is None:
                self.first = (now, self.done)
            if now - self.last >= self.interval_s:
                self.last = now
                self.stream.write(self.line(now) + "\n")
                self.stream.flush()

    def line(self, now: float) -> str:
        if self.total is None:  # a duration-mode phase: it ends with its window, not at a count
            return (f"progress: {self.command} {self.description}: {self.done} done, until the window ends "
                    f"(elapsed {_duration(now - self.t0)})")
        left = max(0, self.total - self.done)
        # The rate since the first request finished, not since the task began: a phase's start
        # (a backend's processes, graph captures) and, in a closed loop, the first wave's whole
        # latency come before any request ends, and counted in they made a 10 s phase read
        # "ETA 16 min" after its first request. Unknown until two have finished.
        rate = 0.0
        if self.first is not None and self.done > self.first[1] and now > self.first[0]:
            rate = (self.done - self.first[1]) / (now - self.first[0])
        eta = _duration(left / rate) if rate else "unknown"
        return (f"progress: {self.command} {self.description}: {self.done}/{self.total} done, {left} left, "
                f"ETA {eta} (elapsed {_duration(now - self.t0)})")


class _RichReporter(_Reporter):
    """A rich bar per task on a terminal's stderr."""

    def __init__(self, command: str, *, stream: TextIO, interval_s: float) -> None:
        super().__init__(command, stream=stream, interval_s=interval_s)
        self._bars = Progress(TextColumn(f"{command} {{task.description}}"), BarColumn(), MofNCompleteColumn(),
                              TextColumn("ETA"), TimeRemainingColumn(), TimeElapsedColumn(),
                              console=Console(file=stream), transient=False)
        self._task = None

    def __enter__(self):
        self._bars.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bars.__exit__(*exc)

    def task(self, description: str, total: int | None) -> None:
        super().task(description, total)
        self._task = self._bars.add_task(description, total=total)

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
        if self._task is not None:
            self._bars.advance(self._task, n)


def interval_s() -> float:
    """`TTS_BENCH_PROGRESS_S` seconds between lines off a terminal (default 30)."""
    try:
        value = float(os.environ.get(_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value >= 0 else DEFAULT_INTERVAL_S


@contextlib.contextmanager
def reporting(command: str, *, stream: TextIO | None = None, tty: bool | None = None) -> Iterator[_Reporter]:
    """The command's reporter for the block: a rich bar on a terminal, else periodic lines."""
    global _current
    stream = stream if stream is not None else sys.stderr
    tty = stream.isatty() if tty is None else tty
    kind = _RichReporter if tty else _Reporter
    reporter = kind(command, stream=stream, interval_s=interval_s())
    previous, _current = _current, reporter
    try:
        with reporter:
            yield reporter
    finally:
        _current = previous


def task(description: str, total: int | None) -> None:
    """Start a task of the open reporter (none open: nothing)."""
    if _current is not None:
        _current.task(description, total)


def advance(n: int = 1) -> None:
    """Advance the open reporter's task (none open: nothing)."""
    if _current is not None:
        _current.advance(n)


class Tasks:
    """The A/B runner's progress protocol (`start`, `advance`) over the open reporter."""

    def start(self, description: str, total: int | None) -> None:
        task(description, total)

    def advance(self) -> None:
        advance()


def current() -> Tasks | None:
    """The open reporter as the A/B runner's progress, or None."""
    return Tasks() if _current is not None else None
