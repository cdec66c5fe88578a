"""The one way the harness and the scripts write a JSON file: whole or not at all.

A reader (another command, `git diff`, a crash) sees either the previous document or the new
one, never half: the text goes to a temporary file in the same folder (so the rename never
crosses a filesystem), is fsynced, renamed over the target with `os.replace`, and the folder is
fsynced so the rename itself survives a power cut. A document that cannot be serialised raises
before anything touches the disk; a failed write leaves the old file and no temporary behind.

    write_json_atomic(run.path / "run.json", doc, indent=2)
    write_json_atomic(Path(out, "bench_prelude.json"), doc)     # indent=1, the files' usual form

`json_default` is the serialiser's fallback, shared with the JSONL records: numpy scalars and
arrays, Paths, sets. Anything else is a TypeError worth seeing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any


def json_default(value: Any) -> Any:
    """What `json.dumps` cannot take itself: numpy scalars and arrays (via `tolist()`), Paths
    (as strings) and sets (sorted lists)."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def write_json_atomic(path: Path | str, doc: Any, *, indent: int | None = 1) -> Path:
    """Write `doc` as JSON (newline-terminated) to `path`, making its folder if missing; returns
    `path`. See the module docstring for what a reader can see meanwhile."""
    path = Path(path)
    text = json.dumps(doc, indent=indent, default=json_default) + "\n"  # raises before any write
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of our own (pid + random): two writers of one file, in threads or processes, never
    # share a temporary. Mode "x" refuses to reuse one, and keeps the umask's permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_folder(path.parent)
    return path


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX); a platform that cannot open a folder (Windows)
    has nothing to sync there."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
