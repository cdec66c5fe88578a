"""Run records: one directory per run, written so that a killed run keeps what it measured.

    results/runs/20261129-194500-ab-3fa9c1/
        run.json        versioned header: kind, command line, each arm's resolved config + hash,
                        environment (git sha + dirty, host, platform, library versions, device, the
                        runtime variables that were set),
                        and whatever the command adds later (aggregates, verdicts) via update()
        requests.jsonl  one JSON object per finished request, appended + fsynced as it finishes
        run.lock        the writer's advisory lock (pid, host) while a process writes the run

Durability: `append_request` queues the line for a background writer that fsyncs each batch
(so the caller's event loop never waits on the disk); SIGKILL loses at most the requests in
flight and those finished within the last fsync (milliseconds). A torn last line (killed
mid-write) is skipped on read and dropped by `open`; any other damage (a line that is not a
request record, a run.json without its header, a directory where a file belongs) is a
ConfigError (exit 2) naming the file, for every command that reads runs. `update` rewrites
run.json with `tts_bench.rundir.atomic_json.write_json_atomic`, so readers see either the old or
the new document, never half. The header itself is built and checked in
`tts_bench.rundir.run_json`, its environment in `tts_bench.rundir.provenance`.

One writer at a time (`tts_bench.rundir.lock`): `create` and `open(lock=True)` (`--resume`) take
the run's lock; a second writer gets exit 2 naming the holder; a dead holder's lock is taken
over. Reading never counts a request twice: `iter_requests` keeps the first record of each
request key (arm, tier, repeat, request_id), so even a record written by two processes at once
(before the lock existed) summarizes right.

Status: `running` while the command works, then exactly one of `complete`, `invalid`, `done`
(wer), `generated` (wer --generate-only), `failed` (with `error`) or `interrupted`: commands
wrap their work in `with run.finishing():`, which records the last two on any exception.

    run = RunDir.create(Path("results/runs"), "ab", command_line=sys.argv, configs={"base": d})
    with run.finishing():
        run.append_request({"arm": "base", "tier": "2x1", "repeat": 0, "request_id": "en_0001", ...})
        run.update(status="complete", aggregates={...})
    done = RunDir.open(run.path).completed_keys()   # for --resume
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tts_bench.errors import ConfigError, TtsBenchError
from tts_bench.rundir.appender import LineAppender, flush_path
from tts_bench.rundir.atomic_json import json_default, write_json_atomic
from tts_bench.rundir.lock import LOCK_NAME, RunLock, holder_of
from tts_bench.rundir.records import RequestKey, request_key
from tts_bench.rundir.run_json import RUN_JSON, new_header, read_header

log = logging.getLogger(__name__)

REQUESTS_JSONL = "requests.jsonl"
DEFAULT_RESULT_ROOT = Path("results/runs")

# Statuses a run ends with; `running` (and wer's intermediate `generated`) are not final.
FINAL_STATUSES = frozenset({"complete", "invalid", "done", "failed", "interrupted"})


def _now_utc() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


@dataclass
class RunDir:
    """Handle on one run directory; `doc` mirrors run.json as last written."""

    path: Path
    doc: dict[str, Any]
    _appender: LineAppender | None = field(default=None, repr=False, compare=False)
    _lock: RunLock | None = field(default=None, repr=False, compare=False)

    @classmethod
    def create(
        cls,
        root: Path | str,
        kind: str,
        *,
        command_line: Sequence[str] | str,
        configs: dict[str, dict[str, Any]],
        config_hashes: dict[str, str] | None = None,
        device: str | dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        lock: bool = True,
    ) -> RunDir:
        """Make `<root>/<YYYYmmdd-HHMMSS>-<kind>-<6 hex>/` with its run.json, holding its lock
        (`release()`, or the end of `finishing()`, lets it go)."""
        if not re.fullmatch(r"[a-z][a-z0-9-]*", kind):
            raise ValueError(f"run kind must be a lowercase word like 'ab', got {kind!r}")
        root = _result_root(root)
        created = _now_utc()
        while True:
            name = f"{created:%Y%m%d-%H%M%S}-{kind}-{secrets.token_hex(3)}"
            try:
                (root / name).mkdir()
                break
            except FileExistsError:  # 1 in 16M within the same second; just draw again
                continue
            except OSError as exc:  # no permission, read-only filesystem, disk full
                raise _not_writable(root, exc) from None
        doc = new_header(kind, created, command_line=command_line, configs=configs,
                         config_hashes=config_hashes, device=device, extra=extra)
        run = cls(root / name, doc, _lock=RunLock.acquire(root / name) if lock else None)
        write_json_atomic(run.run_json, doc, indent=2)
        (run.path / REQUESTS_JSONL).touch()
        log.info("run record: %s", run.path)
        return run

    @classmethod
    def open(cls, path: Path | str, *, lock: bool = False, flag: str = "--resume / run directory") -> RunDir:
        """Open an existing run; a missing or foreign directory is a ConfigError naming `flag`
        (the option the caller took the directory from).

        `lock=True` (a writer: --resume) takes the run's lock first, RunLockedError (exit 2)
        when another live process holds it. A torn last line in requests.jsonl is dropped here,
        so appends after a resume never glue onto half a record; a reader leaves the file alone
        while another process writes it."""
        path = Path(path)
        if not path.is_dir():
            what = "does not exist" if not path.exists() else "is a file"
            raise ConfigError(
                f"error: {path} {what}, not a run directory ({flag}); pass "
                f"the directory tts-bench made (it holds {RUN_JSON} and {REQUESTS_JSONL})"
            )
        doc = read_header(path, flag)
        run = cls(path, doc, _lock=_take_lock(path, flag) if lock else None)
        try:
            flush_path(run.requests_path)  # another RunDir of this process may still be writing
            if lock or holder_of(path) is None:
                run._repair_tail()
        except BaseException:
            run.release()
            raise
        return run

    @property
    def run_json(self) -> Path:
        return self.path / RUN_JSON

    @property
    def requests_path(self) -> Path:
        return self.path / REQUESTS_JSONL

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    def update(self, **fields: Any) -> None:
        """Merge top-level fields into run.json and rewrite it atomically. Queued requests are
        flushed first, so a run.json that says `complete` never precedes its requests."""
        self.flush()
        self.doc = {**self.doc, **fields}
        write_json_atomic(self.run_json, self.doc, indent=2)

    def append_request(self, record: dict[str, Any]) -> None:
        """Append one finished request as a JSON line. Cheap and non-blocking (safe inside an
        event loop): a background thread writes and fsyncs, see tts_bench.rundir.appender."""
        line = json.dumps(record, separators=(",", ":"), default=json_default)
        if self._appender is None or self._appender.closed:
            self._appender = LineAppender(self.requests_path)
        self._appender.append(line)

    def flush(self) -> None:
        """Block until every appended request is on disk (fsynced)."""
        if self._appender is not None:
            self._appender.flush()

    def close(self) -> None:
        """Flush and stop the background writer; appending later starts a new one."""
        if self._appender is not None:
            self._appender.close()

    def release(self) -> None:
        """Drop the run's lock (if this handle holds it). Idempotent."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def finishing(self) -> Iterator[RunDir]:
        """The command's work on this run; whatever way it ends, run.json's status is final.

        The body records its own outcome (`update(status="complete" | "invalid" | ...)`). An
        exception leaves `failed` with its message under `error` (KeyboardInterrupt:
        `interrupted`), unless the body already recorded a final status; returning while still
        `running` is recorded as `failed` too. Queued requests are flushed and the lock is
        released on the way out."""
        try:
            yield self
        except KeyboardInterrupt:
            self._finish("interrupted", "interrupted (Ctrl-C / SIGINT or SIGTERM); --resume finishes an A/B")
            raise
        except BaseException as exc:
            self._finish("failed", _error_text(exc))
            raise
        else:
            if self.doc.get("status") == "running":
                self._finish("failed", "the command ended without recording a result")
        finally:
            try:
                self.close()
            finally:
                self.release()

    def _finish(self, status: str, error: str) -> None:
        if self.doc.get("status") in FINAL_STATUSES:
            return
        try:
            self.flush()
        except TtsBenchError as exc:  # requests.jsonl cannot be written (disk full): run.json still can
            error = error if str(exc) in error else f"{error}; {exc}"
        try:
            self.doc = {**self.doc, "status": status, "error": error}
            write_json_atomic(self.run_json, self.doc, indent=2)
        except Exception as exc:  # an exit path must not hide the error that led here
            log.error("could not record status %s in %s: %s", status, self.run_json, exc)

    def iter_requests(self) -> Iterator[dict[str, Any]]:
        """Recorded requests in write order, each request key once (the first record wins: a
        later one is a duplicate written by a concurrent writer). An unterminated last line
        that does not parse (the process died mid-write) is skipped; any other line that is not
        a request record (a JSON object with the request key) is a ConfigError naming file:line."""
        seen: set[RequestKey] = set()
        duplicates = 0
        for record in self._iter_lines():
            key = request_key(record)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            yield record
        if duplicates:
            log.warning("%s: %d duplicate request record(s) ignored (the first of each key counts)",
                        self.requests_path, duplicates)

    def _iter_lines(self) -> Iterator[dict[str, Any]]:
        self.flush()
        data = self._requests_bytes()
        if data is None:
            return
        lines = data.split(b"\n")
        # After a final "\n" the last element is b""; anything else there is an unterminated tail.
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except ValueError:  # not JSON, or not even UTF-8 text
                # Only the unterminated tail may be torn (SIGKILL mid-write; `open` drops it and
                # --resume runs its request again); a bad line anywhere else is damage.
                if i == len(lines) - 1:
                    log.warning("%s: skipping torn last line %d", self.requests_path, i + 1)
                    continue
                raise self._corrupt(i + 1, "is not valid JSON") from None
            if _key_or_none(record) is None:  # parsed, but every reader needs the request key
                raise self._corrupt(i + 1, "is not a request record (a JSON object with arm, tier, "
                                           "repeat and request_id)")
            yield record

    def _corrupt(self, line: int, what: str) -> ConfigError:
        return ConfigError(
            f"error: {self.requests_path}:{line} {what} (run directory); the record is corrupt: "
            f"rerun from scratch, or delete that line and --resume an A/B to run its request again"
        )

    def _requests_bytes(self) -> bytes | None:
        """requests.jsonl as bytes, None when there is none; a path that cannot be read (a
        directory in its place, no permission) is a ConfigError naming it."""
        try:
            return self.requests_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(
                f"error: cannot read {self.requests_path}: {exc.strerror or exc} (run directory); "
                f"pass a run directory made by tts-bench"
            ) from None

    def _repair_tail(self) -> None:
        """Make the JSONL end on a line boundary so the next append starts a fresh line: keep an
        unterminated tail that parses (terminate it), drop one that does not (a torn write)."""
        data = self._requests_bytes()
        if data is None:
            self.requests_path.touch()
            return
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
        except ValueError:
            log.warning(
                "%s: dropping a torn last line (%d bytes)", self.requests_path, len(data) - cut
            )
            with open(self.requests_path, "r+b") as fh:
                fh.truncate(cut)
                os.fsync(fh.fileno())
            return
        with open(self.requests_path, "ab") as fh:
            fh.write(b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read_requests(self) -> list[dict[str, Any]]:
        return list(self.iter_requests())

    def completed_keys(self) -> set[RequestKey]:
        """(arm, tier, repeat, request_id) of every recorded request, for --resume."""
        return {request_key(r) for r in self.iter_requests()}


def _key_or_none(record: Any) -> RequestKey | None:
    try:
        return request_key(record)
    except (KeyError, TypeError, ValueError):  # {}, [1, 2], "repeat": "x"
        return None


def _result_root(root: Path | str) -> Path:
    """The directory run directories are made in (`--result-dir`), made with its parents when
    missing; anything that cannot hold them is a ConfigError naming --result-dir (every command
    that makes runs comes through `create`)."""
    # The commands refuse `--result-dir ''` as typed (`commands._common.result_dir_option`);
    # a library caller's empty string is refused here.
    if str(root).strip() == "":
        raise ConfigError("error: --result-dir is empty; pass a directory for the run directories, or "
                          "leave it out for the default results/runs")
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # /dev/null, a path under a regular file, a missing mount
        raise _not_writable(root, exc) from None
    return root


def _not_writable(root: Path, exc: OSError) -> ConfigError:
    why = "it exists and is not a directory" if root.exists() and not root.is_dir() else \
        (exc.strerror or str(exc)).lower()
    return ConfigError(
        f"error: --result-dir {root} is not a writable directory: {why}; pass a directory you can "
        f"write, or a path where one can be made (default results/runs)"
    )


def _take_lock(path: Path, flag: str) -> RunLock:
    """The run's lock for a writer; a lock file that cannot be opened (a directory in its place,
    no permission) is a ConfigError naming it. RunLockedError (another writer) passes through."""
    try:
        return RunLock.acquire(path)
    except OSError as exc:
        raise ConfigError(
            f"error: cannot take the lock {path / LOCK_NAME}: {exc.strerror or exc} ({flag}); remove or fix that path, then rerun"
        ) from None


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text.startswith("error:") else f"{type(exc).__name__}: {text}".rstrip(": ")
