"""How the stage runner fails and stops, with fake engines: one request's failure leaves the
others running, a crashed or failing stage ends the run with its message, and a stop ends every
process in order without waiting out a backlog (helpers: tests/stages/runner_helpers.py).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from stages.runner import RequestError, RunnerError, RunnerRequest, StageRunner
from stages.runner.fakes import fake_factories
from tests.stages.runner_helpers import (
    EXECUTIONS,
    WAIT_S,
    Collector,
    cpu_config,
    decode_log,
    executions,
    submit_all,
    wait_for,
)


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


