"""Stage runner plumbing with fake engines (fast; independent of model speed).

The fakes (`stages.runner.fakes`) have the real engines' shapes and deterministic outputs, so
chunk order, codes, audio, pinning and batching are asserted exactly. Each StageRunner spawns
1 + R processes (~2 s on a 2-core CPU), so tests share runners where they can.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import signal
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import psutil
import pytest

from stages.config import RunnerConfig, StageConfig
from stages.profiling.ranges import TALKER_RANGE
from stages.runner import ChunkReady, RequestError, RunnerError, RunnerRequest, StageRunner
from stages.runner.fakes import FakePayload, fake_code, fake_factories
from stages.runner.process import threads_per_process
from stages.runner.replica_proc import take_batch
from stages.runner.work import work_delta
from tests.stages.runner_fakes import meeting_factories, meetings

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


@pytest.fixture(scope="module", params=EXECUTIONS)
def shared(request, tmp_path_factory):
    """One talker + 2 replicas (max_num_seqs 3) with a slow-ish fake decoder, for several tests;
    once with the replicas as processes, once as threads of one process, once with the talker
    and the replicas as threads of one process, once as threads of a replica host process."""
    from stages.runner.allocator import ALLOC_CONF, GENERIC_ALLOC_CONF

    log_dir, meet_dir = tmp_path_factory.mktemp("decode-log"), tmp_path_factory.mktemp("meet")
    runner = StageRunner(cpu_config(max_num_seqs=3, execution=request.param), replicas=2,
                         factories=meeting_factories(meet_dir, decode_s=0.15, log_dir=str(log_dir)))
    with pytest.MonkeyPatch.context() as env:  # no allocator setting of the user's: the runner sets it
        env.delenv(ALLOC_CONF, raising=False)
        env.delenv(GENERIC_ALLOC_CONF, raising=False)
        runner.start()
        runner.alloc_conf_after_start = os.environ.get(ALLOC_CONF)
    runner.meet_dir = meet_dir  # requests named meet-* rendezvous there (tests/stages/runner_fakes.py)
    yield runner, log_dir
    runner.stop()


def test_chunks_arrive_in_order_with_the_codes_and_audio_behind_them(shared):
    runner, _ = shared
    cfg = runner.cfg
    col = Collector()
    specs = [("order-a", 1, 60), ("order-b", 2, 25), ("order-c", 3, 7), ("order-d", 4, 0)]
    submit_all(runner, col, specs)
    col.wait()
    eos = cfg.talker.eos_token_id
    per_code = cfg.code2wav.sample_rate // cfg.code2wav.token_rate_hz
    for rid, seed, n in specs:
        events = col.events[rid]
        assert all(isinstance(e, ChunkReady) for e in events), events
        assert [e.chunk_seq for e in events] == list(range(len(events)))
        assert [e.last_chunk for e in events] == [False] * (len(events) - 1) + [True]
        # 25 new codes per payload, the remainder in the final flush.
        assert len(events) == n // cfg.code2wav.codec_chunk_frames + 1
        codes = [c for e in events for c in e.codes]
        assert codes == expected_codes(seed, n, eos)
        audio = np.concatenate([e.audio for e in events])
        want = np.repeat(np.asarray(codes, np.float32) / cfg.code2wav.flow.vocab_size, per_code)
        assert np.array_equal(audio, want.astype(np.float32))
    assert runner.in_flight() == {}


def test_requests_pin_to_the_least_loaded_replica_and_stay_there(shared):
    runner, log_dir = shared
    col = Collector()
    specs = [(f"pin-{i}", 10 + i, 60) for i in range(5)]
    replicas = submit_all(runner, col, specs)
    assert replicas == [0, 1, 0, 1, 0]
    col.wait()
    rows = decode_log(log_dir, "pin-")
    pid_of: dict[str, set[int]] = {}
    for row in rows:
        for rid in row["rows"]:
            pid_of.setdefault(rid, set()).add(row["pid"])
    assert all(len(pids) == 1 for pids in pid_of.values()), pid_of
    assert pid_of["pin-0"] == pid_of["pin-2"] == pid_of["pin-4"] != pid_of["pin-1"]


def test_a_replica_batches_at_most_max_num_seqs_rows_one_per_request(shared):
    runner, log_dir = shared
    col = Collector()
    # 7 requests: 4 land on replica 0 (max_num_seqs 3), so some of its decodes must be full.
    submit_all(runner, col, [(f"batch-{i}", 20 + i, 50) for i in range(7)])
    col.wait()
    rows = [r["rows"] for r in decode_log(log_dir, "batch-")]
    assert max(len(r) for r in rows) == 3
    assert all(len(r) == len(set(r)) for r in rows)


def test_replicas_decode_concurrently(shared):
    runner, log_dir = shared
    col = Collector()
    # Two requests, one per replica. The first decode of each waits inside until the other
    # replica's decode is inside too: replicas that decode one at a time never meet (an event,
    # where a bound on the elapsed time was flipped by machine load).
    assert submit_all(runner, col, [("meet-a", 31, 75), ("meet-b", 32, 75)]) == [0, 1]
    col.wait()
    assert meetings(runner.meet_dir) == {"meet-a": "met", "meet-b": "met"}
    first = {rid: col.arrival[rid][0] for rid in ("meet-a", "meet-b")}
    last = {rid: col.arrival[rid][-1] for rid in ("meet-a", "meet-b")}
    # Both streams were producing at the same time: each started before the other ended.
    assert first["meet-a"] < last["meet-b"] and first["meet-b"] < last["meet-a"]


def test_memory_snapshot_reports_every_stage_process(shared):
    runner, _ = shared
    snap = runner.memory_snapshot()
    names = {"threads": ["talker", "code2wav"], "single": ["stages"]}.get(
        runner.execution, ["talker", "code2wav-0", "code2wav-1"])
    if runner.cfg.runner.replicas_per_process == 2:
        names = ["talker", "code2wav-host-0"]
    assert [s["process"] for s in snap] == names
    assert {s["pid"] for s in snap} == set(runner.pids().values())
    for s in snap:
        assert s["source"] == "rss"
        assert s["rss_bytes"] > 10 * 2**20 and s["peak_bytes"] >= s["rss_bytes"]


def test_work_snapshots_count_every_step_row_and_decode_second_of_an_interval(shared):
    runner, _ = shared
    col = Collector()
    specs = [("work-a", 41, 60), ("work-b", 42, 30), ("work-c", 43, 10)]
    before = runner.work_snapshot()
    assert [w["stage"] for w in before] == ["talker", "code2wav-0", "code2wav-1"]
    submit_all(runner, col, specs)
    col.wait()
    # The replicas count a decode after sending its audio: until every payload is counted.
    payloads = sum(n // 25 + 1 for _, _, n in specs)
    delta = wait_for(lambda: {d["stage"]: d for d in work_delta(before, runner.work_snapshot())},
                     lambda d: d["code2wav-0"]["rows"] + d["code2wav-1"]["rows"] >= payloads
                     and d["talker"]["rows"] >= sum(n + 1 for _, _, n in specs))
    # The fake talker gives one output a request a step: each code, then the finishing one.
    assert delta["talker"]["rows"] == sum(n + 1 for _, _, n in specs)
    assert delta["talker"]["steps"] >= max(n + 1 for _, _, n in specs)
    # Every payload (25 codes each, then the final flush) is one row of one decode.
    replicas = [delta["code2wav-0"], delta["code2wav-1"]]
    assert sum(r["rows"] for r in replicas) == sum(n // 25 + 1 for _, _, n in specs)
    for r in replicas:  # each fake decode sleeps 0.15 s, inside the counted step
        assert r["busy_s"] >= 0.15 * r["steps"] > 0
        assert 0 < r["busy"] < 1 and r["ms_per_step"] >= 150
        assert r["wall_s"] >= r["busy_s"]
        # A step takes one chunk of each request with one waiting, up to max_num_seqs (8 here,
        # more than the 3 requests): what was ready is what was taken, step for step.
        assert r["ready"] == r["rows"] and r["ready_per_step"] == r["rows_per_step"]
    assert "ready" not in delta["talker"] and delta["talker"]["ready_per_step"] is None


@pytest.mark.parametrize("execution", executions("processes", "threads", "single"))
def test_a_trace_window_profiles_the_talkers_steps_while_it_serves(execution, tmp_path):
    # 10 ms talker steps and 100 codes a request: the window opens while they run
    runner = StageRunner(cpu_config(execution=execution), replicas=2, factories=fake_factories(step_s=0.01))
    runner.start()
    col = Collector()
    try:
        submit_all(runner, col, [("trace-a", 51, 100), ("trace-b", 52, 100)])
        summary = runner.trace(0.3, tmp_path / "t.json.gz")
        col.wait()
    finally:
        runner.stop()
    assert summary["steps"] > 0 and summary["host_ms_per_step"] > 0
    assert summary["streams"] == [] and 0.3 <= summary["seconds"] < 10  # CPU: host only
    events = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))["traceEvents"]
    assert sum(e.get("name") == TALKER_RANGE for e in events) == summary["steps"]
    with pytest.raises(ValueError, match="seconds > 0"):
        runner.trace(0, tmp_path / "never.json")


def test_one_trace_window_at_a_time_an_idle_one_closes_and_a_bad_path_is_reported(tmp_path):
    runner = StageRunner(cpu_config(), replicas=1, factories=fake_factories())
    runner.start()
    answers = {}
    try:
        # The second window is asked for once the first is in the talker's inbox (an event, not
        # a 0.3 s sleep): the talker opens the first, then reads the second while it is open.
        talker = runner._children[0]
        talker.inbox = _Announcing(talker.inbox, "TraceQuery")
        first = threading.Thread(target=lambda: answers.update(a=runner.trace(1.0, tmp_path / "a.json")))
        first.start()
        assert talker.inbox.put_done.wait(WAIT_S)
        answers["b"] = runner.trace(0.2, tmp_path / "b.json")
        first.join(WAIT_S)
        (tmp_path / "file").write_text("")
        unwritable = runner.trace(0.2, tmp_path / "file" / "c.json")
        still_serving = Collector()
        submit_all(runner, still_serving, [("after-trace", 7, 5)])
        still_serving.wait()
    finally:
        runner.stop()
    refused = [a for a in answers.values() if "error" in a]
    taken = [a for a in answers.values() if "error" not in a]
    assert len(refused) == len(taken) == 1 and "already open" in refused[0]["error"]
    assert taken[0]["steps"] == 0 and taken[0]["seconds"] >= 0.2  # idle: closed on time anyway
    assert "error" in unwritable and "c.json" not in {p.name for p in tmp_path.rglob("*")}
    assert isinstance(still_serving.events["after-trace"][-1], ChunkReady)


class _Announcing:
    """A stage inbox (the parent's end) that sets `put_done` once a message of type `kind` is in it."""

    def __init__(self, inbox, kind: str) -> None:
        self.inbox, self.kind = inbox, kind
        self.put_done = threading.Event()

    def put(self, item, *args, **kwargs) -> None:
        self.inbox.put(item, *args, **kwargs)
        if type(item).__name__ == self.kind:
            self.put_done.set()

    def __getattr__(self, name: str):
        return getattr(self.inbox, name)


def test_cancel_stops_a_request_and_frees_its_id(shared):
    runner, _ = shared
    col = Collector()
    on_event, first_chunk = col.expect("cancel-me"), threading.Event()
    runner.submit(RunnerRequest("cancel-me", "x", seed=5, max_codes=400),
                  lambda e: (on_event(e), first_chunk.set()))
    assert first_chunk.wait(WAIT_S)
    runner.cancel("cancel-me")
    seen = len(col.events["cancel-me"])
    assert 1 <= seen < 17
    assert runner.in_flight() == {}
    # Requests on both replicas, sent after the cancel, end after anything the cancelled one
    # still had in the talker's or a replica's queue (an event, where a 0.5 s sleep could end
    # before a late chunk came on a loaded machine).
    after = Collector()
    submit_all(runner, after, [("after-cancel-0", 6, 30), ("after-cancel-1", 7, 30)])
    after.wait()
    assert len(col.events["cancel-me"]) == seen  # nothing delivered after cancel
    col2 = Collector()
    submit_all(runner, col2, [("cancel-me", 5, 30)])
    col2.wait()
    assert [e.chunk_seq for e in col2.events["cancel-me"]] == [0, 1]


def test_failures_of_one_request_leave_the_others_running():
    # The talker refuses texts with REFUSE; every decode of a chunk_seq-1 row raises.
    runner = StageRunner(cpu_config(), replicas=1,
                         factories=fake_factories(fail_text="REFUSE", fail_decode_seq=1))
    runner.start()
    try:
        col = Collector()
        runner.submit(RunnerRequest("bad", "please REFUSE this", max_codes=30), col.expect("bad"))
        submit_all(runner, col, [("two-chunks", 1, 40)])
        col.wait()
        (err,) = col.events["bad"]
        assert isinstance(err, RequestError) and "REFUSE" in err.message
        events = col.events["two-chunks"]
        assert isinstance(events[-1], RequestError) and "code2wav-0" in events[-1].message
        assert [e.chunk_seq for e in events[:-1]] == [0]
        after = Collector()
        submit_all(runner, after, [("after", 3, 20)])
        after.wait()
        assert after.events["after"][-1].last_chunk
        assert runner.in_flight() == {}
    finally:
        runner.stop()


@pytest.mark.parametrize("execution", executions(*EXECUTIONS))
def test_stop_after_work_ends_every_stage_process_cleanly(execution):
    runner = StageRunner(cpu_config(execution=execution), replicas=2, factories=fake_factories(decode_s=0.02))
    runner.start()
    col = Collector()
    submit_all(runner, col, [("clean-a", 1, 60), ("clean-b", 2, 30)])
    col.wait()
    runner.stop()
    # exit code 0: no stage hit an error on the way out (a replica thread reading a closed queue
    # at shutdown would exit the process with 1)
    assert [c.process.exitcode for c in runner._children] == [0] * len(runner._children)


@pytest.mark.parametrize("execution", executions(*EXECUTIONS))
def test_a_child_that_fails_at_startup_makes_start_raise_with_its_message(execution):
    runner = StageRunner(cpu_config(execution=execution), replicas=2,
                         factories=fake_factories(fail_start="no such weights: flow.pt"))
    # The child's own message, not "not ready after 600 s": start raised when the child failed,
    # without waiting out runner.start_timeout_s (no clock: a loaded box took 30 s to spawn).
    with pytest.raises(RunnerError, match=r"(code2wav(-\d|-host-\d)?|stages) failed to start") as info:
        runner.start()
    assert "no such weights: flow.pt" in str(info.value) and "not ready after" not in str(info.value)
    assert runner.alive() == []


def test_an_sm_reservation_off_cuda_makes_start_raise_with_the_setting_to_change():
    runner = StageRunner(cpu_config(execution="single", talker_sms=16), replicas=2,
                         factories=fake_factories())
    with pytest.raises(RunnerError, match=r"stages failed to start") as info:
        runner.start()
    assert "needs a CUDA device" in str(info.value) and "runner.talker_sms=0" in str(info.value)
    assert runner.alive() == []


@pytest.mark.parametrize("execution", executions(*EXECUTIONS))
def test_a_child_that_crashes_fails_in_flight_requests_and_ends_the_run(execution):
    runner = StageRunner(cpu_config(execution=execution), replicas=2,
                         factories=fake_factories(decode_s=0.05, crash_after_decodes=2))
    runner.start()
    try:
        col = Collector()
        submit_all(runner, col, [(f"crash-{i}", i, 200) for i in range(4)])
        col.wait()
        for rid in col.events:
            last = col.events[rid][-1]
            assert isinstance(last, RequestError), rid
            assert "exited with code 3" in last.message
        late = Collector()
        runner.submit(RunnerRequest("late", "x", max_codes=10), late.expect("late"))
        late.wait()
        assert isinstance(late.events["late"][0], RequestError)
    finally:
        pids = [p for p in runner.pids().values() if p]
        runner.stop()
    assert runner.alive() == []
    assert not [p for p in pids if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_talker_step_error_fails_the_requests_in_it_and_the_talker_keeps_serving():
    runner = StageRunner(cpu_config(), replicas=1, factories=fake_factories(fail_step=40))
    runner.start()
    try:
        col = Collector()
        submit_all(runner, col, [("step-a", 1, 100), ("step-b", 2, 100)])
        col.wait()
        for rid in ("step-a", "step-b"):
            last = col.events[rid][-1]
            assert isinstance(last, RequestError) and last.kind == "stage_error"
            assert "talker step failed: RuntimeError: fake talker step 40 failed" in last.message
        after = Collector()
        submit_all(runner, after, [("after", 3, 30)])
        after.wait()
        assert after.events["after"][-1].last_chunk  # the same talker process serves it
        assert "talker" in runner.alive() and runner.broken is None
    finally:
        runner.stop()


def test_a_talker_whose_every_step_fails_gives_up_and_breaks_the_runner():
    runner = StageRunner(cpu_config(), replicas=1, factories=fake_factories(fail_steps_from=5))
    runner.start()
    try:
        for attempt in range(3):  # each fails with the step; the third failing step is fatal
            col = Collector()
            submit_all(runner, col, [(f"doomed-{attempt}", attempt, 100)])
            col.wait()
            last = col.events[f"doomed-{attempt}"][-1]
            assert isinstance(last, RequestError) and "fake talker step" in last.message
        wait_for(runner.alive, lambda alive: "talker" not in alive)  # it exits after reporting
        assert runner.broken is not None and "talker failed" in runner.broken
    finally:
        runner.stop()


def test_stop_leaves_no_process_alive_and_fails_what_is_in_flight():
    runner = StageRunner(cpu_config(), replicas=2, factories=fake_factories(step_s=0.01))
    runner.start()
    pids = list(runner.pids().values())
    col = Collector()
    submit_all(runner, col, [("endless", 1, 100_000)])
    wait_for(lambda: len(col.events["endless"]), bool)  # in flight: its audio is coming
    runner.stop()
    col.wait()
    assert isinstance(col.events["endless"][-1], RequestError)
    assert runner.alive() == []
    assert not any(psutil.pid_exists(p) for p in pids)


def test_submit_before_start_is_an_error():
    runner = StageRunner(cpu_config(), replicas=1, factories=fake_factories())
    with pytest.raises(RunnerError, match="before start"):
        runner.submit(RunnerRequest("x", "y"), lambda e: None)


def test_threads_split_the_cores_over_talker_and_replicas():
    assert threads_per_process(0, replicas=1, cores=2) == 1
    assert threads_per_process(0, replicas=2, cores=2) == 1
    assert threads_per_process(0, replicas=1, cores=16) == 8
    assert threads_per_process(0, replicas=8, cores=128) == 14
    assert threads_per_process(3, replicas=8, cores=2) == 3


def test_take_batch_keeps_request_order_and_one_row_per_request():
    def p(rid, seq):
        return FakePayload(rid, seq, (), False)

    pending = deque([p("a", 0), p("a", 1), p("b", 0), p("c", 0), p("b", 1), p("d", 0)])
    batch = take_batch(pending, 3)
    assert [(x.request_id, x.chunk_seq) for x in batch] == [("a", 0), ("b", 0), ("c", 0)]
    assert [(x.request_id, x.chunk_seq) for x in pending] == [("a", 1), ("b", 1), ("d", 0)]


def test_runner_config_rejects_bad_values():
    with pytest.raises(ValueError, match="torch_threads"):
        RunnerConfig(torch_threads=-1)
    with pytest.raises(ValueError, match="start_timeout_s"):
        dataclasses.replace(RunnerConfig(), start_timeout_s=0)


def test_a_bad_reference_voice_fails_its_request_alone_and_voices_are_cached():
    runner = StageRunner(cpu_config(), replicas=1, factories=fake_factories())
    runner.start()
    try:
        col = Collector()
        voice = b"RIFF-a-voice"
        for rid, audio in (("bad-voice", b"BAD bytes"), ("voice-1", voice), ("no-voice", None)):
            runner.submit(RunnerRequest(rid, "some words", seed=1, max_codes=30, prompt_audio=audio),
                          col.expect(rid))
        col.wait()
        (err,) = col.events["bad-voice"]
        assert isinstance(err, RequestError) and err.kind == "bad_prompt" and "cannot decode reference audio" in err.message
        assert col.events["voice-1"][0].prompt == {"cache_hit": False, "setup_ms": 1.0}
        assert col.events["no-voice"][0].prompt["cache_hit"] is True  # the default voice
        assert all(e.prompt is None for e in col.events["voice-1"][1:])  # first chunk only
        again = Collector()
        runner.submit(RunnerRequest("voice-2", "x", seed=2, max_codes=30, prompt_audio=voice), again.expect("voice-2"))
        again.wait()
        assert again.events["voice-2"][0].prompt["cache_hit"] is True  # same bytes: a hit
        (replica,) = [m for m in runner.memory_snapshot() if m["process"] == "code2wav-0"]
        assert replica["prompt_cache_entries"] == 2 and replica["prompt_cache_bytes"] == len(voice)
    finally:
        runner.stop()


def _voice_in_the_pipe(decode_s: float, log_dir: Path) -> StageRunner:
    """A started one-replica runner whose replica sits inside a `decode_s` decode while a 4 MiB
    voice (far beyond the 64 KiB a pipe holds) is on its way to it, mostly still in the talker."""
    runner = StageRunner(cpu_config(), replicas=1, factories=fake_factories(decode_s=decode_s, log_dir=str(log_dir)))
    runner.start()
    col = Collector()
    runner.submit(RunnerRequest("first", "one two three four five", seed=1, max_codes=60), col.expect("first"))
    wait_for(lambda: decode_log(log_dir, "first"), bool)  # the replica is inside a decode of "first"
    voice = bytes(range(256)) * (16 * 1024)
    runner.submit(RunnerRequest("voiced", "one two three", seed=2, max_codes=60, prompt_audio=voice),
                  col.expect("voiced"))
    time.sleep(0.2)  # set-up only: the talker starts on the voice (later, and the asserts still hold)
    return runner


def _timed_stop(runner: StageRunner, timeout_s: float) -> float:
    t0 = time.monotonic()
    runner.stop(timeout_s=timeout_s)
    return time.monotonic() - t0


def test_stop_while_a_large_payload_is_in_the_pipe_stops_every_process_in_order(tmp_path):
    """A talker that exits while its queue's feeder thread is halfway through writing a payload
    (a voice of a few MB rides on a first payload) leaves a torn message that the replica would
    wait on forever. The talker flushes what it sent before it exits, and replicas get their
    sentinel after the talker is gone, so every process ends by itself (exit 0, not killed)."""
    runner = _voice_in_the_pipe(decode_s=1.0, log_dir=tmp_path)
    try:
        children = list(runner._children)
        took = _timed_stop(runner, 8.0)
    finally:
        runner.stop()
    assert [c.process.exitcode for c in children] == [0, 0], "a stage process had to be killed"
    assert took < 8.0


def test_stop_does_not_wait_on_a_replica_that_died_with_a_payload_half_written(tmp_path):
    """The talker flushes its queues before it exits, but not the queue of a replica that is gone:
    a half-written payload there would never be read, and the talker would wait until killed."""
    runner = _voice_in_the_pipe(decode_s=2.0, log_dir=tmp_path)
    try:
        os.kill(runner.pids()["code2wav-0"], signal.SIGKILL)  # like the OOM killer
        wait_for(lambda: runner.broken, lambda broken: broken is not None)
        talker = runner._children[0]
        took = _timed_stop(runner, 8.0)
    finally:
        runner.stop()
    # Not killed at its 8 s deadline: it ended by itself, not waiting on the dead replica's queue.
    assert talker.process.exitcode == 0, "the talker had to be killed"
    assert took < 8.0


def test_stop_waits_for_at_most_one_decode_however_long_the_replicas_backlog(tmp_path):
    """The Ctrl-C flake: a replica decoded its backlog chunk by chunk and read its inbox only
    between decodes, so the talker's flush of large first payloads (a voice each) waited on
    decode after decode, and the stop outlived its 10 s (old code: 11 s here, the talker nearly
    killed). Once the runner stops, replicas decode nothing more and only read: one decode at
    most, the one in progress. Counted in the decode log (each decode logs as it begins), not
    timed, so a loaded machine cannot flip it."""
    runner = StageRunner(cpu_config(), replicas=1, factories=fake_factories(decode_s=1.0, log_dir=str(tmp_path)))
    runner.start()
    try:
        col = Collector()
        for i in range(24):  # 24 voices of 3 MB: far more than a pipe holds, queued in the talker
            runner.submit(RunnerRequest(f"r{i}", "one two three four five six", seed=i, max_codes=200,
                                        prompt_audio=bytes([i]) * 3_000_000), col.expect(f"r{i}"))
        # until the first audio: the replica is now in its next decode, backlogged
        wait_for(lambda: any(col.events.values()), bool)
        children = list(runner._children)
        begun = len(decode_log(tmp_path, "r"))
        took = _timed_stop(runner, WAIT_S)
    finally:
        runner.stop()
    assert [c.process.exitcode for c in children] == [0, 0], "a stage process had to be killed"
    # At most the one that may have begun between the count and the stop; the backlog holds 23+.
    assert len(decode_log(tmp_path, "r")) - begun <= 1, f"decoded on after the stop ({took:.1f} s)"


@pytest.mark.parametrize(("execution", "talker_max_batch"), [
    pytest.param("processes", 4, id="processes-capped-talker"),
    pytest.param("single", None, id="single", marks=pytest.mark.slow),
    pytest.param("hosts", None, id="hosts", marks=pytest.mark.slow)])
def test_replicas_size_their_slot_pools_for_the_concurrency_the_runner_expects(execution, talker_max_batch):
    # 9 requests in flight over 2 replicas: at most 5 a replica (the least-loaded one gets the
    # next), so each pool starts with 5 slots, past the 2 batches of 2 rows, and none is idle
    # (a pool that grew later would drop its graphs). With a talker that admits 4 at once (more
    # clients than it takes): requests still decoding stay on their replica after the talker is
    # done with them, so the share comes from C = 9 all the same.
    capped = {} if talker_max_batch is None else {"talker_max_batch": talker_max_batch}
    runner = StageRunner(cpu_config(max_num_seqs=2, execution=execution, **capped), replicas=2,
                         factories=fake_factories(), concurrency=9)
    runner.start()
    try:
        infos = runner.replica_info()
        assert [infos[f"code2wav-{r}"]["code2wav"]["slots"] for r in (0, 1)] == [5, 5]
    finally:
        runner.stop()
    with pytest.raises(ValueError, match="concurrency"):
        StageRunner(cpu_config(), replicas=1, concurrency=0)


def test_without_a_concurrency_each_pool_starts_with_two_batches(shared):
    runner, _ = shared  # max_num_seqs 3, no concurrency given
    assert [i["code2wav"]["slots"] for i in runner.replica_info().values()] == [6, 6]  # 2 x max_num_seqs


def test_the_allocator_choice_leaves_a_users_setting_alone():
    from stages.runner.allocator import (
        ALLOC_CONF,
        EXPANDABLE_SEGMENTS,
        GENERIC_ALLOC_CONF,
        choose_allocator,
        runs_expandable_segments,
    )

    env = {}
    assert "set by the stage runner" in choose_allocator(env)
    assert env == {ALLOC_CONF: EXPANDABLE_SEGMENTS} and runs_expandable_segments({})
    for name in (ALLOC_CONF, GENERIC_ALLOC_CONF):  # torch reads the generic name first
        mine = {name: "garbage_collection_threshold:0.8"}
        assert choose_allocator(mine) == f"{name}=garbage_collection_threshold:0.8 (from the environment)"
        assert mine == {name: "garbage_collection_threshold:0.8"} and not runs_expandable_segments(mine)
    assert runs_expandable_segments({ALLOC_CONF: "max_split_size_mb:64, expandable_segments: True"})


def test_each_stage_process_sets_its_allocator_when_the_user_did_not(shared):
    # `shared` started with neither allocator variable set; the user's setting is the next test.
    from stages.runner.allocator import ALLOC_CONF

    runner, _ = shared
    names = {"single": ["stages"], "threads": ["talker", "code2wav"],
             "processes": ["talker", "code2wav-0", "code2wav-1"]}.get(runner.execution, ["talker", "code2wav-0"])
    if runner.cfg.runner.replicas_per_process == 2:
        names = ["talker", "code2wav-host-0"]
    for name in names:  # each process records its own choice (no effect on a CPU)
        record = runner.info[name]["allocator"]
        assert "set by the stage runner" in record and record.endswith("this process runs on cpu"), (name, record)
    assert runner.alloc_conf_after_start is None  # the parent's environment is left alone


@pytest.mark.parametrize("execution", executions(*EXECUTIONS))
def test_each_stage_process_keeps_a_users_allocator_setting(monkeypatch, execution):
    from stages.runner.allocator import ALLOC_CONF, GENERIC_ALLOC_CONF

    names = {"single": ["stages"], "threads": ["talker", "code2wav"], "processes": ["talker", "code2wav-0"],
             "hosts": ["talker", "code2wav-host-0"]}
    monkeypatch.delenv(GENERIC_ALLOC_CONF, raising=False)
    monkeypatch.setenv(ALLOC_CONF, "roundup_power2_divisions:4")
    runner = StageRunner(cpu_config(execution=execution), replicas=1, factories=fake_factories())
    runner.start()
    try:
        for name in names[execution]:  # each process records its own choice (no effect on a CPU)
            record = runner.info[name]["allocator"]
            assert "from the environment" in record and record.endswith("this process runs on cpu"), (name, record)
        assert os.environ.get(ALLOC_CONF) == "roundup_power2_divisions:4"  # the parent's is left alone
    finally:
        runner.stop()


def test_replica_hosts_group_consecutive_replicas_and_serve_each_on_its_own_thread(tmp_path):
    # 3 replicas, 2 a process: replicas 0 and 1 are threads of one host, replica 2 has its own.
    runner = StageRunner(cpu_config(execution="processes", replicas_per_process=2, max_num_seqs=2), replicas=3,
                         factories=fake_factories(decode_s=0.05, log_dir=str(tmp_path)), concurrency=6)
    runner.start()
    try:
        assert [c.name for c in runner._children] == ["talker", "code2wav-host-0", "code2wav-host-1"]
        assert [c.replicas for c in runner._children] == [(), (0, 1), (2,)]
        assert sorted(runner.replica_info()) == ["code2wav-0", "code2wav-1", "code2wav-2"]
        assert all(i["code2wav"]["slots"] == 2 for i in runner.replica_info().values())
        col = Collector()
        specs = [(f"host-{i}", 50 + i, 60) for i in range(6)]
        assert submit_all(runner, col, specs) == [0, 1, 2, 0, 1, 2]
        col.wait()
        for rid, seed, n in specs:
            codes = [c for e in col.events[rid] for c in e.codes]
            assert codes == expected_codes(seed, n, runner.cfg.talker.eos_token_id)
        who = {}  # request -> the "pid-thread" identity of the replica that decoded it
        for row in decode_log(tmp_path, "host-"):
            for rid in row["rows"]:
                who.setdefault(rid, set()).add(row["pid"])
        assert all(len(ids) == 1 for ids in who.values()), who
        replica = {r: next(iter(who[f"host-{r}"])) for r in range(3)}
        assert len(set(replica.values())) == 3  # three replicas, three threads
        process = {r: ident.split("-")[0] for r, ident in replica.items()}
        assert process[0] == process[1] != process[2]
        assert process[0] == str(runner.pids()["code2wav-host-0"])
        assert [w["stage"] for w in runner.work_snapshot()] == ["talker", "code2wav-0", "code2wav-1", "code2wav-2"]
    finally:
        runner.stop()
    assert [c.process.exitcode for c in runner._children] == [0, 0, 0]
