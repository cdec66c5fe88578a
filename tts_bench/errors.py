"""Exit codes and the typed errors that map onto them (mapped in exactly one place: the CLI).

CI reads the exit code to tell a broken run from a slow one:
0 ok, 1 error, 2 usage/config, 3 perf regression, 4 accuracy regression, 5 invalid run,
130 interrupted (Ctrl-C, as shells report SIGINT), 143 terminated (SIGTERM: `timeout`, a CI
job's time limit; as shells report it).
"""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    PERF_REGRESSION = 3
    ACCURACY_REGRESSION = 4
    INVALID_RUN = 5
    INTERRUPTED = 130
    TERMINATED = 143


class TtsBenchError(Exception):
    """Base of every user-facing error; the message reads `error: <what> (<where>); <how to fix>`."""

    exit_status = ExitStatus.ERROR


class ConfigError(TtsBenchError):
    """A config file, override or flag is wrong (unknown key, wrong type, bad value)."""

    exit_status = ExitStatus.USAGE


class InvalidRunError(TtsBenchError):
    """The run cannot be trusted: too many failures, missing samples, mismatched provenance."""

    exit_status = ExitStatus.INVALID_RUN


class BackendError(TtsBenchError):
    """A backend could not start or serve; per-request failures are recorded, not raised."""
