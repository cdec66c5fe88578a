"""One writer per run directory: an advisory lock held while a process writes the run.

Two `tts-bench ab --resume RUN` at once used to both exit 0, each measuring the requests the
other had not recorded yet: 41 duplicate request keys and a result claiming 29-32 completed of
16 planned. Now the writer holds `run.lock` in the run directory:

- `fcntl.flock(LOCK_EX | LOCK_NB)` on the lock file, kept for the life of the writer. The kernel
  releases it when the process dies (SIGKILL included), so a lock left by a dead process is
  simply taken over by the next writer;
- the holder's pid, host and start time are written into the file, so a second writer's error
  (exit 2) names who holds the run;
- on a filesystem without flock (some network filesystems answer ENOLCK), the recorded holder
  decides: a lock file whose pid is dead on this host is stale and taken over; a live pid, or a
  holder on another host (whose pid cannot be checked), keeps the run.

Readers (`gate --current`, reading records) take no lock.

    lock = RunLock.acquire(Path("results/runs/20261129-194500-ab-3fa9c1"))   # RunLockedError
    ...
    lock.release()
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tts_bench.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: no flock; the recorded holder is the only guard
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "run.lock"


class RunLockedError(ConfigError):
    """Another live process is writing this run directory (exit 2)."""


def _holder_doc() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        doc = json.loads(data.decode("utf-8")) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _write_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(_holder_doc()) + "\n").encode("utf-8"))
    os.fsync(fd)


def _alive_here(holder: dict[str, Any]) -> bool:
    """Whether the recorded holder may still be running: a live pid on this host, or any holder
    on another host (its pid means nothing here)."""
    if holder.get("host") != socket.gethostname():
        return bool(holder)
    pid = holder.get("pid")
    return isinstance(pid, int) and pid != os.getpid() and psutil.pid_exists(pid)


def _locked(run_dir: Path, holder: dict[str, Any]) -> RunLockedError:
    who = (f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')}"
           if holder else "another process")
    return RunLockedError(
        f"error: run directory {run_dir} is being written by {who} ({run_dir / LOCK_NAME}); "
        f"wait for it to finish or stop it, then --resume again"
    )


@dataclass
class RunLock:
    path: Path
    _fd: int | None

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Take the run's lock or raise RunLockedError naming the holder."""
        path = Path(run_dir) / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif _alive_here(_read_holder(fd)):
                raise BlockingIOError(errno.EWOULDBLOCK, "locked")
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise _locked(Path(run_dir), holder) from None
        except OSError as exc:  # no flock here (ENOLCK, EOPNOTSUPP): the recorded pid decides
            holder = _read_holder(fd)
            if _alive_here(holder):
                os.close(fd)
                raise _locked(Path(run_dir), holder) from exc
        _write_holder(fd)  # the previous record, if any, was a dead holder's: ours now
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Clear the holder record and drop the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # closing the descriptor releases the flock


def holder_of(run_dir: Path) -> dict[str, Any] | None:
    """The recorded holder when the run is locked by another live process, else None (for
    readers that must not touch a run being written, e.g. to repair its last line). A lock this
    very process holds (through another handle) does not count: its writes are in-process."""
    holder = _locked_by(run_dir)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        return None
    return holder


def _locked_by(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_holder(fd) or {"pid": None}
            except OSError:
                pass
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
                return None
        holder = _read_holder(fd)
        return holder if _alive_here(holder) else None
    finally:
        os.close(fd)
