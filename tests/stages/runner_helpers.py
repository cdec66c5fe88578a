"""What the runner tests share: a CPU stage config, a collector of each request's events, waits
on conditions (never a bare sleep deciding a result) and the fake decoder's log.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from stages.config import RunnerConfig, StageConfig
from stages.runner import RequestError, RunnerRequest, StageRunner
from stages.runner.fakes import fake_code

# A hang guard only: no test here decides a result by how long something took (a loaded 2-core
# box once took more than 30 s to start a replica host).
WAIT_S = 120.0


# Every execution model, as test ids: "hosts" is processes hosting two replica threads each.
EXECUTIONS = ["processes", "threads", "single", "hosts"]


def executions(*names: str) -> list:
    """Test parameters: the default execution ("processes") in the quick suite, the others in CI's
    slow step. Each variant starts its own stage processes (seconds apiece on 2 cores), and the
    whole matrix adds up to minutes; the shared runner still serves every execution quickly."""
    return [n if n == "processes" else pytest.param(n, marks=pytest.mark.slow) for n in names]


def cpu_config(**runner) -> StageConfig:
    if runner.get("execution") == "hosts":
        runner.update(execution="processes", replicas_per_process=2)
    return StageConfig(runner=RunnerConfig(device="cpu", torch_threads=1, **runner))


class Collector:
    """Events per request, with a wait for every submitted request to end."""

    def __init__(self) -> None:
        self.events: dict[str, list] = {}
        self.arrival: dict[str, list[float]] = {}
        self.ended: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def expect(self, request_id: str):
        self.ended[request_id] = threading.Event()
        self.events[request_id] = []
        self.arrival[request_id] = []

        def on_event(event) -> None:
            with self.lock:
                self.events[request_id].append(event)
                self.arrival[request_id].append(time.perf_counter())
            if isinstance(event, RequestError) or event.last_chunk:
                self.ended[request_id].set()

        return on_event

    def wait(self, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        for rid, ev in self.ended.items():
            assert ev.wait(max(0.0, deadline - time.monotonic())), f"{rid} never ended"


def wait_for(read, done, timeout: float = WAIT_S):
    """`read()` again until `done(value)` (the condition, not a sleep, decides); its last value."""
    deadline = time.monotonic() + timeout
    while not done(value := read()):
        assert time.monotonic() < deadline, f"not reached in {timeout:g} s: {value}"
        time.sleep(0.02)
    return value


def expected_codes(seed: int, n: int, eos: int) -> list[int]:
    return [fake_code(seed, i, eos) for i in range(n)]


def submit_all(runner: StageRunner, col: Collector, specs: list[tuple[str, int, int]]) -> list[int]:
    """specs: (request id, seed, number of codes) -> the replica each was pinned to."""
    return [
        runner.submit(RunnerRequest(rid, "some words", seed=seed, max_codes=n), col.expect(rid))
        for rid, seed, n in specs
    ]


def decode_log(log_dir: Path, prefix: str) -> list[dict]:
    """Decode calls (pid, request ids) whose rows belong to requests named `prefix`*."""
    rows = []
    for path in sorted(log_dir.glob("decode-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if any(rid.startswith(prefix) for rid in r["rows"])]

