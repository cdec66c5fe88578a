"""Stage runner plumbing with fake engines (fast; independent of model speed).

The fakes (`stages.runner.fakes`) have the real engines' shapes and deterministic outputs, so
chunk order, codes, audio, pinning and batching are asserted exactly. Each StageRunner spawns
1 + R processes (~2 s on a 2-core CPU), so tests share runners where they can. How a run fails
and stops is tests/stages/test_runner_failures.py; the helpers are tests/stages/runner_helpers.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import threading
import time
from collections import deque

import numpy as np
import pytest

from stages.config import RunnerConfig
from stages.profiling.ranges import TALKER_RANGE
from stages.runner import ChunkReady, RunnerRequest, StageRunner
from stages.runner.allocator import (
    ALLOC_CONF,
    EXPANDABLE_SEGMENTS,
    GENERIC_ALLOC_CONF,
    choose_allocator,
    runs_expandable_segments,
)
from stages.runner.fakes import FakePayload, fake_factories
from stages.runner.process import threads_per_process
from stages.runner.replica_proc import step_shapes, take_batch
from stages.runner.work import work_delta
from tests.stages.runner_fakes import meeting_factories, meetings
from tests.stages.runner_helpers import (
    EXECUTIONS,
    WAIT_S,
    Collector,
    cpu_config,
    decode_log,
    executions,
    expected_codes,
    submit_all,
    wait_for,
)


@pytest.fixture(scope="module", params=EXECUTIONS)
def shared(request, tmp_path_factory):
    """One talker + 2 replicas (max_num_seqs 3) with a slow-ish fake decoder, for several tests;
    once with the replicas as processes, once as threads of one process, once with the talker
    and the replicas as threads of one process, once as threads of a replica host process."""
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


def _one_replica_decodes(tmp_path, traffic, *, decode_s: float, **runner) -> list[dict]:
    """Run `traffic(runner, col)` on a one-replica fake runner; its decode calls, in order."""
    stage_runner = StageRunner(cpu_config(**runner), replicas=1,
                               factories=fake_factories(decode_s=decode_s, log_dir=str(tmp_path)))
    stage_runner.start()
    try:
        col = Collector()
        traffic(stage_runner, col)
        col.wait()
    finally:
        stage_runner.stop()
    return decode_log(tmp_path, "")


def test_with_first_chunks_first_a_new_stream_does_not_wait_behind_a_backlog(tmp_path):
    # One row a step and a slow decoder: "long" queues many chunks; "late" arrives after its first
    # audio and has its first chunk decoded at the next step, while "long" still has chunks left.
    def traffic(runner, col):
        submit_all(runner, col, [("long", 1, 25 * 10)])
        wait_for(lambda: len(col.events["long"]), lambda n: n >= 1)
        submit_all(runner, col, [("late", 2, 30)])

    calls = _one_replica_decodes(tmp_path, traffic, decode_s=0.1, max_num_seqs=1, first_chunks_first=True)
    order = [r["rows"][0] for r in calls]
    assert order.count("long") == 11 and order.count("late") == 2
    assert order[order.index("late"):].count("long") >= 3, order


def test_with_one_shape_steps_a_replica_step_decodes_one_chunk_shape_beside_final_chunks(tmp_path):
    # Staggered requests of several chunks on one replica: steps would mix first, growing and
    # settled chunks; with one_shape_steps each decode call holds one of them, plus final chunks.
    def traffic(runner, col):
        for i in range(6):
            submit_all(runner, col, [(f"shape-{i}", 40 + i, 25 * (3 + i % 3))])
            time.sleep(0.05)

    calls = _one_replica_decodes(tmp_path, traffic, decode_s=0.02, max_num_seqs=4, one_shape_steps=True)
    assert all(len({s for s in c["shapes"] if s is not None}) == 1 for c in calls if any(c["shapes"])), calls
    assert sum(1 for c in calls for s in c["shapes"] if s is None) == 6  # every final chunk decoded
    assert {s for c in calls for s in c["shapes"]} == {"first", "growing", "steady", None}
    assert sorted({rid for c in calls for rid in c["rows"]}) == [f"shape-{i}" for i in range(6)]


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


def test_one_shape_steps_take_the_first_payloads_shape_and_final_chunks_only():
    def p(rid, seq, shape):
        return FakePayload(rid, seq, (shape,), shape is None)

    def shape_of(x):
        return x.codes[0]

    def queue():
        return deque([p("a", 3, "steady"), p("a", 4, "steady"), p("b", 0, "first"), p("c", 5, "steady"),
                      p("d", 1, "growing"), p("e", 9, None), p("f", 0, "first")])

    def ids(xs):
        return [(x.request_id, x.chunk_seq) for x in xs]

    pending = queue()
    assert ids(take_batch(pending, 8, shape_of=shape_of)) == [("a", 3), ("c", 5), ("e", 9)]
    assert ids(pending) == [("a", 4), ("b", 0), ("d", 1), ("f", 0)]
    assert ids(take_batch(pending, 8, shape_of=shape_of)) == [("a", 4)]  # the oldest sets the shape
    pending = queue()  # with first chunks first, a first chunk sets it
    assert ids(take_batch(pending, 8, first_chunks_first=True, shape_of=shape_of)) == [("b", 0), ("e", 9), ("f", 0)]
    pending = queue()  # final chunks count against the cap like any row
    assert ids(take_batch(pending, 2, shape_of=shape_of)) == [("a", 3), ("c", 5)]
    # a request whose oldest chunk has another shape waits whole: its later chunk is not taken
    pending = deque([p("a", 1, "growing"), p("b", 3, "steady"), p("a", 2, "steady"), p("c", 4, "steady")])
    assert ids(take_batch(pending, 8, shape_of=shape_of)) == [("a", 1)]
    assert ids(pending) == [("b", 3), ("a", 2), ("c", 4)]
    assert ids(take_batch(pending, 8, shape_of=lambda x: None)) == [("b", 3), ("a", 2), ("c", 4)]


def test_one_shape_steps_need_an_engine_that_names_chunk_shapes():
    with pytest.raises(TypeError, match="one_shape_steps.*step_shape.*object has none"):
        step_shapes(object())


def test_first_chunks_first_takes_streams_first_chunks_before_older_chunks_of_others():
    def p(rid, seq):
        return FakePayload(rid, seq, (), False)

    def queue():
        return deque([p("a", 3), p("a", 4), p("b", 7), p("c", 0), p("d", 2), p("e", 0)])

    pending = queue()
    assert [(x.request_id, x.chunk_seq) for x in take_batch(pending, 2)] == [("a", 3), ("b", 7)]  # the oldest
    pending = queue()
    batch = take_batch(pending, 3, first_chunks_first=True)
    # both first chunks, then the oldest other request's oldest chunk; in queue order
    assert [(x.request_id, x.chunk_seq) for x in batch] == [("a", 3), ("c", 0), ("e", 0)]
    assert [(x.request_id, x.chunk_seq) for x in pending] == [("a", 4), ("b", 7), ("d", 2)]
    pending = queue()  # room for everyone: the same rows as the default rule
    assert take_batch(pending, 8, first_chunks_first=True) == take_batch(queue(), 8)
    assert [x.request_id for x in pending] == ["a"]


def test_runner_config_rejects_bad_values():
    with pytest.raises(ValueError, match="torch_threads"):
        RunnerConfig(torch_threads=-1)
    with pytest.raises(ValueError, match="start_timeout_s"):
        dataclasses.replace(RunnerConfig(), start_timeout_s=0)


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

