"""Interrupts belong to the parent: child processes (stage processes, piper workers) ignore SIGINT
and SIGTERM.

A terminal's Ctrl-C signals the whole foreground process group, and so does a time limit
(`timeout`, a CI job's) with SIGTERM. Children that took SIGINT printed their own
KeyboardInterrupt tracebacks (two of them, after the parent's message) and died in the middle
of a step, while the parent was about to stop them in order anyway; children killed by SIGTERM
looked to the parent like crashes. So:

- the parent spawns children inside `interrupts_blocked()`: a spawned child starts with the
  signal mask of the thread that started it, so an interrupt during the child's start-up
  (imports take seconds) stays pending instead of acting there;
- the child calls `ignore_interrupts()` first thing in its target: both signals are ignored for
  good and a pending one, if any, is discarded.

The parent stops its children on its way out (sentinel, join, then SIGKILL for one that outlives
the stop: SIGTERM would be ignored); a child whose parent died notices and exits on its own
(`stages.runner.process.drain`). Dependency-free, like `stages.flags`, and public for the
harness (tests/unit/test_layering.py): its own worker pools (the piper backend's processes) keep
the same contract without importing torch.

    with interrupts_blocked():
        process.start()
    ...
    def target(...):
        ignore_interrupts()
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM})
_HAS_MASK = hasattr(signal, "pthread_sigmask")


@contextlib.contextmanager
def interrupts_blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM in the calling thread (any thread) for the duration of the block."""
    if not _HAS_MASK:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_interrupts() -> None:
    """In a child process: ignore SIGINT and SIGTERM from now on (and drop any pending from
    start-up). Only a process's main thread owns signal handlers: called elsewhere (a stage run
    as a thread of the parent), it leaves both to that process and does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in INTERRUPTS:
        signal.signal(sig, signal.SIG_IGN)
    if _HAS_MASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)
