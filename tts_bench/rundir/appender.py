"""Durable append-only line writer whose fsyncs happen off the caller's thread.

Why: the load generator hands each finished request to the run record from inside its asyncio
event loop. An fsync there (milliseconds on a real disk, far more on a network filesystem)
would stall the loop while other requests' audio chunks wait to be timestamped, inflating the
very latencies being measured. Here `append` only queues the line; a background thread writes
everything queued so far in one `write` + `fsync` (group commit) and goes back to waiting.

Durability: a line is on disk one fsync after `append` returns, so SIGKILL loses at most the
requests in flight plus those finished within the last fsync. `flush()` blocks until every line
appended so far is durable; readers call it first. Writer errors (disk full) are re-raised on the
next `append`/`flush`. Open writers are flushed at interpreter exit.

    w = LineAppender(Path("requests.jsonl"))
    w.append('{"request_id": "en_0001"}')
    w.flush()
    w.close()
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from pathlib import Path

from tts_bench.errors import TtsBenchError

log = logging.getLogger(__name__)
_OPEN: weakref.WeakSet[LineAppender] = weakref.WeakSet()


class LineAppender:
    """Append whole lines to `path` from a background thread; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._pending: list[str] = []
        self._queued = 0  # lines appended so far
        self._durable = 0  # lines written and fsynced so far
        self._error: BaseException | None = None
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        return self._closing

    def append(self, line: str) -> None:
        """Queue one line (without its newline); returns without touching the disk."""
        assert "\n" not in line, "one record per line"
        with self._cond:
            self._check()
            if self._closing:
                raise RuntimeError(f"{self.path}: append after close")
            self._pending.append(line + "\n")
            self._queued += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"appender:{self.path.name}", daemon=True
                )
                self._thread.start()
                _OPEN.add(self)
            self._cond.notify_all()

    def flush(self) -> None:
        """Block until every line appended so far is written and fsynced."""
        with self._cond:
            target = self._queued
            while self._durable < target and self._error is None:
                self._cond.wait()
            self._check()

    def close(self) -> None:
        """Flush, then stop the writer thread. Idempotent; a write error is raised (once more)
        after the thread has stopped, so no later close (atexit's included) reports it again."""
        with self._cond:
            if self._thread is None or self._closing:
                self._closing = True
                return
        try:
            self.flush()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._thread.join()

    def _check(self) -> None:
        if self._error is not None:
            raise TtsBenchError(
                f"error: writing {self.path} failed: {self._error} (run record); "
                f"free disk space or pick another --result-dir, then --resume"
            )

    def _run(self) -> None:
        # A raw descriptor, not a buffered file: after a failed write (disk full, EFBIG) a
        # buffered file still holds the batch and writes it again when closed, raising in this
        # thread where nobody catches it (Python prints "Exception in thread ..." and a traceback).
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            self._fail(exc)
            return
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closing:
                        self._cond.wait()
                    if not self._pending:
                        return
                    batch, self._pending = self._pending, []
                try:
                    _write_all(fd, "".join(batch).encode("utf-8"))
                    os.fsync(fd)
                except Exception as exc:  # disk full, EFBIG: reported to the caller on its next call
                    self._fail(exc)  # (anything else too: a caller waiting in flush() must wake)
                    return
                with self._cond:
                    self._durable += len(batch)
                    self._cond.notify_all()
        finally:
            os.close(fd)

    def _fail(self, exc: Exception) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # os.write may write part (up to a file-size limit); the next call raises
        view = view[os.write(fd, view):]


def flush_path(path: Path) -> None:
    """Flush every open writer of `path` in this process (before reading or resuming it)."""
    target = os.path.abspath(path)
    for writer in list(_OPEN):
        if os.path.abspath(writer.path) == target:
            writer.flush()


@atexit.register
def _flush_all() -> None:
    # atexit runs before daemon threads are stopped, so queued lines still reach the disk.
    for writer in list(_OPEN):
        try:
            writer.close()
        except TtsBenchError as exc:  # exit path: nothing left to raise to
            log.error("%s", exc)
