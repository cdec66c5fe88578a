"""One writer per run directory, and a result that never counts a request twice.

Two `tts-bench ab --resume RUN` at once used to both exit 0 with 41 duplicate request keys and a
result claiming more completed requests than planned."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from tts_bench.rundir import lock as _runlock
from tts_bench.rundir.lock import LOCK_NAME, RunLock, RunLockedError
from tts_bench.rundir.results import RunDir

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}


def make_run(tmp_path: Path, **kw) -> RunDir:
    return RunDir.create(tmp_path / "runs", "ab", command_line=["x"], configs={"base": {}}, **kw)


def rec(arm: str, rid: str, **extra) -> dict:
    return {"arm": arm, "tier": "2x1", "repeat": 0, "request_id": rid, **extra}


def hold_in_child(run_dir: Path) -> subprocess.Popen:
    """A child process that takes the run's lock, says so, and sleeps."""
    code = textwrap.dedent(f"""
        import sys, time
        from tts_bench.rundir.results import RunDir
        run = RunDir.open({str(run_dir)!r}, lock=True)
        print("held", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    run = make_run(tmp_path, lock=False)
    child = hold_in_child(run.path)
    try:
        with pytest.raises(RunLockedError) as info:
            RunDir.open(run.path, lock=True)
        msg = str(info.value)
        assert f"pid {child.pid} on host {socket.gethostname()}" in msg and str(run.path) in msg
        assert info.value.exit_status == 2
        assert RunDir.open(run.path).doc["kind"] == "ab"  # readers take no lock
    finally:
        child.kill()
        child.wait()


def test_the_lock_of_a_killed_writer_is_taken_over(tmp_path):
    run = make_run(tmp_path, lock=False)
    child = hold_in_child(run.path)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert json.loads((run.path / LOCK_NAME).read_text())["pid"] == child.pid  # record left behind
    resumed = RunDir.open(run.path, lock=True)
    assert json.loads((run.path / LOCK_NAME).read_text())["pid"] == os.getpid()
    resumed.release()
    assert (run.path / LOCK_NAME).read_text() == ""  # released: no holder recorded


def test_a_created_run_is_locked_until_released(tmp_path):
    run = make_run(tmp_path)
    code = f"from tts_bench.rundir.results import RunDir; RunDir.open({str(run.path)!r}, lock=True)"
    busy = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
    assert busy.returncode != 0 and "RunLockedError" in busy.stderr and f"pid {os.getpid()}" in busy.stderr
    run.release()
    free = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
    assert free.returncode == 0, free.stderr


@pytest.mark.parametrize(("alive", "taken"), [(False, True), (True, False)])
def test_without_flock_the_recorded_pid_decides(tmp_path, monkeypatch, alive, taken):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    pid = os.getppid() if alive else dead.pid
    (run_dir / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(_runlock.fcntl, "flock", no_flock)
    if taken:
        lock = RunLock.acquire(run_dir)
        assert json.loads((run_dir / LOCK_NAME).read_text())["pid"] == os.getpid()
        lock.release()
    else:
        with pytest.raises(RunLockedError, match=f"pid {pid} on host"):
            RunLock.acquire(run_dir)


def test_duplicate_request_records_count_once_the_first_wins(tmp_path):
    run = make_run(tmp_path)
    for r in (rec("base", "a", v=1), rec("base", "b", v=1), rec("base", "a", v=2), rec("test", "a", v=1)):
        run.append_request(r)
    run.flush()
    got = [(r["arm"], r["request_id"], r["v"]) for r in RunDir.open(run.path).iter_requests()]
    assert got == [("base", "a", 1), ("base", "b", 1), ("test", "a", 1)]
    assert len(run.requests_path.read_text().splitlines()) == 4  # nothing rewritten


def _ab(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tts_bench.cli", "ab", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_resumes_of_one_run_one_exits_2_and_the_record_has_no_duplicates(tmp_path):
    synth = ["--config", "configs/ab/synthetic.yaml", "--set", "synthetic.chunk_seconds=0.1",
             "--set", "synthetic.seconds_per_word=0.1", "--set", "synthetic.first_chunk_delay_s=0.01",
             "--set", "synthetic.chunk_delay_s=0.01", "--set", "bench.warmup=0", "--repeats", "1",
             "--tiers", "2x1", "--num-prompts", "12", "--format", "json", "--result-dir", str(tmp_path)]
    out, err = _ab(*synth).communicate(timeout=120)
    run_dir = Path(json.loads(out)["run_dir"])
    jsonl = run_dir / "requests.jsonl"
    jsonl.write_text("".join(jsonl.read_text().splitlines(keepends=True)[:4]))  # "killed" early
    first = _ab("--resume", str(run_dir), "--format", "json")
    deadline = time.monotonic() + 120  # a hang guard only
    while time.monotonic() < deadline:  # until the first resume holds the lock
        text = (run_dir / LOCK_NAME).read_text() if (run_dir / LOCK_NAME).exists() else ""
        if text.strip() and json.loads(text)["pid"] == first.pid:
            break
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGSTOP)  # hold the first one inside its run, deterministically
    try:
        second = _ab("--resume", str(run_dir), "--format", "json")
        out2, err2 = second.communicate(timeout=120)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out1, err1 = first.communicate(timeout=120)
    assert second.returncode == 2, err2
    assert f"is being written by pid {first.pid}" in err2 and "Traceback" not in err2
    assert first.returncode == 0, err1
    doc = json.loads(out1)
    for arm in ("base", "test"):
        assert doc["tiers"][0]["arms"][arm]["completed"] == 12
    keys = Counter((r["arm"], r["request_id"]) for r in map(json.loads, jsonl.read_text().splitlines()))
    assert max(keys.values()) == 1 and len(keys) == 24
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
