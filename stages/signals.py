"""Ctrl-C belongs to the parent: child processes (stage processes, piper workers) ignore SIGINT.

A terminal's Ctrl-C signals the whole foreground process group. Children that took it printed
their own KeyboardInterrupt tracebacks (two of them, after the parent's message) and died in
the middle of a step, while the parent was about to stop them in order anyway. So:

- the parent spawns children inside `sigint_blocked()`: a spawned child starts with the signal
  mask of the thread that started it, so a Ctrl-C during the child's start-up (imports take
  seconds) stays pending instead of raising there;
- the child calls `ignore_sigint()` first thing in its target: SIGINT is ignored for good and
  the pending one, if any, is discarded.

The parent stops its children (sentinel, join, terminate) on its way out; a child whose parent
died notices and exits on its own (`stages.runner.process.drain`). Dependency-free, like
`stages.flags`, so the harness's own worker pools can use it without importing torch.

    with sigint_blocked():
        process.start()
    ...
    def target(...):
        ignore_sigint()
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_HAS_MASK = hasattr(signal, "pthread_sigmask")


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """Block SIGINT in the calling thread (any thread) for the duration of the block."""
    if not _HAS_MASK:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_sigint() -> None:
    """In a child process: ignore SIGINT from now on (and drop one pending from start-up). Only
    a process's main thread owns signal handlers: called elsewhere (a stage run as a thread of
    the parent), it leaves SIGINT to that process and does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _HAS_MASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
