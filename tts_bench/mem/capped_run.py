"""Run a small reporting tool (npu-smi) with a time limit and a cap on what it prints.

`subprocess.run(..., capture_output=True, timeout=...)` is not enough for a tool we do not
control: it keeps everything the tool prints (a broken `npu-smi` flooding 50 MB is 50 MB here,
every sample), and on a timeout it kills the tool but then waits for the pipe to close, which a
grandchild that inherited it (a wrapper script's `sleep`) can hold open indefinitely. Here the tool
runs in its own process group, output is read up to `max_bytes`, and on a timeout or a flood
the whole group is killed.

    out = run_capped(["npu-smi", "info"], timeout=5.0, max_bytes=1 << 20)   # .stdout, .returncode
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from types import SimpleNamespace

DEFAULT_MAX_BYTES = 1 << 20  # npu-smi's 16-card table with processes is ~10 KB


class OutputTooLarge(RuntimeError):
    """The tool printed more than the cap; it was stopped."""


def run_capped(cmd: list[str], *, timeout: float, max_bytes: int = DEFAULT_MAX_BYTES, check: bool = True,
               **_: object) -> SimpleNamespace:
    """Like `subprocess.run(cmd, capture_output=True, text=True, timeout=..., check=...)`:
    raises OSError (cannot start), subprocess.TimeoutExpired, subprocess.CalledProcessError,
    or OutputTooLarge. stderr is discarded; stdout is decoded as UTF-8 (bad bytes replaced)."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, ok = time.monotonic() + timeout, False
    try:
        out = _read(proc, cmd, deadline, timeout, max_bytes)
        try:
            rc = proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(cmd, timeout) from None
        if check and rc != 0:
            raise subprocess.CalledProcessError(rc, cmd)
        ok = True
        return SimpleNamespace(stdout=out.decode("utf-8", errors="replace"), returncode=rc)
    finally:
        if not ok:
            _kill_group(proc)
        proc.stdout.close()


def _read(proc: subprocess.Popen, cmd: list[str], deadline: float, timeout: float, max_bytes: int) -> bytes:
    chunks, size = [], 0
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(cmd, timeout)
            if not sel.select(left):
                continue
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                return b"".join(chunks)
            size += len(data)
            if size > max_bytes:
                raise OutputTooLarge(f"printed more than {max_bytes:,} bytes")
            chunks.append(data)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own group (start_new_session): the tool and its children
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
