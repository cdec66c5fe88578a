"""Run directories: versioned run.json, durable JSONL, atomic updates, resume keys."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tts_bench.rundir import appender as _appender

from tts_bench.rundir import atomic_json
from tts_bench.errors import ConfigError, TtsBenchError
from tts_bench.rundir.provenance import collect_environment
from tts_bench.rundir.records import request_key
from tts_bench.rundir.results import RunDir
from tts_bench.rundir.run_json import SCHEMA_VERSION


def make_run(tmp_path, **kw) -> RunDir:
    return RunDir.create(
        tmp_path / "runs",
        "ab",
        command_line=["tts-bench", "ab", "--tiers", "2x1"],
        configs={"base": {"backend": "synthetic"}, "test": {"backend": "synthetic", "x": 1}},
        **kw,
    )


def rec(arm: str, tier: str, repeat: int, rid: str, **extra) -> dict:
    return {"arm": arm, "tier": tier, "repeat": repeat, "request_id": rid, **extra}


def test_create_writes_versioned_header(tmp_path):
    run = make_run(tmp_path, device="cpu: test")
    assert re.fullmatch(r"\d{8}-\d{6}-ab-[0-9a-f]{6}", run.path.name)
    doc = json.loads(run.run_json.read_text())
    assert doc["schema_version"] == SCHEMA_VERSION == 1
    assert doc["kind"] == "ab" and doc["status"] == "running"
    assert doc["command_line"] == ["tts-bench", "ab", "--tiers", "2x1"]
    assert set(doc["configs"]) == set(doc["config_hashes"]) == {"base", "test"}
    assert doc["config_hashes"]["base"] != doc["config_hashes"]["test"]
    env = doc["environment"]
    assert env["device"] == "cpu: test" and env["python"] and env["host"]
    assert "numpy" in env["libraries"]
    assert run.requests_path.exists() and run.read_requests() == []


def test_two_runs_in_the_same_second_get_distinct_dirs(tmp_path):
    assert make_run(tmp_path).path != make_run(tmp_path).path


def test_environment_never_imports_torch():
    code = textwrap.dedent(
        """
        import sys
        from tts_bench.rundir.provenance import collect_environment
        env = collect_environment()
        assert "torch" not in sys.modules, "collect_environment imported torch"
        print(env["python"])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr


def test_environment_tolerates_no_git(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable reachable
    env = collect_environment(cwd=tmp_path)
    assert env["git_sha"] is None and env["git_dirty"] is None


def test_environment_records_git_sha_and_dirty(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    try:
        subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True, timeout=30)
        (tmp_path / "f").write_text("a")
        subprocess.run([*git, "add", "f"], cwd=tmp_path, check=True, timeout=30)
        subprocess.run([*git, "commit", "-qm", "x"], cwd=tmp_path, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("git is not available")
    env = collect_environment(cwd=tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", env["git_sha"]) and env["git_dirty"] is False
    (tmp_path / "f").write_text("b")
    assert collect_environment(cwd=tmp_path)["git_dirty"] is True


def test_append_and_read_back_in_order(tmp_path):
    run = make_run(tmp_path)
    run.append_request(rec("base", "2x1", 0, "en_0001", audio_rtf=0.5))
    run.append_request(rec("test", "2x1", 0, "en_0001", audio_rtf=0.4))
    run.flush()
    lines = run.requests_path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["audio_rtf"] == 0.4
    assert [r["arm"] for r in run.read_requests()] == ["base", "test"]


def test_appends_are_fsynced_off_the_callers_thread(tmp_path, monkeypatch):
    # A slow disk must not stall the load generator's event loop: append returns at once, the
    # background writer fsyncs, and flush waits for it.
    # The disk is held (an event, not a clock): the appends must return while the first fsync
    # is still waiting, which an append that fsyncs on the caller's thread cannot.
    calls, held_too_long, release = [], [], threading.Event()
    real = os.fsync

    def slow_fsync(fd):
        if not release.wait(10):  # a hang guard: only an append waiting on this fsync gets here
            held_too_long.append(fd)
        calls.append(threading.current_thread().name)
        real(fd)

    run = make_run(tmp_path)
    monkeypatch.setattr(_appender.os, "fsync", slow_fsync)
    for i in range(5):
        run.append_request(rec("base", "2x1", 0, f"r{i}"))
    release.set()
    run.flush()
    assert held_too_long == [], "append waited for the fsync"
    assert calls and all(name.startswith("appender:") for name in calls)
    assert len(calls) < 5  # group commit: queued lines share an fsync
    assert len(run.requests_path.read_text().splitlines()) == 5
    run.close()


def test_write_errors_surface_on_the_next_call(tmp_path, monkeypatch):
    def broken(fd):
        raise OSError(28, "No space left on device")

    run = make_run(tmp_path)
    monkeypatch.setattr(_appender.os, "fsync", broken)
    run.append_request(rec("base", "2x1", 0, "a"))
    with pytest.raises(TtsBenchError, match="No space left"):
        run.flush()


def test_open_sees_lines_still_queued_by_another_handle(tmp_path):
    run = make_run(tmp_path)
    for i in range(50):
        run.append_request(rec("base", "2x1", 0, f"r{i}"))
    assert len(RunDir.open(run.path).completed_keys()) == 50


def test_close_then_append_again_keeps_writing(tmp_path):
    with make_run(tmp_path) as run:
        run.append_request(rec("base", "2x1", 0, "a"))
    run.append_request(rec("base", "2x1", 0, "b"))
    assert [r["request_id"] for r in run.read_requests()] == ["a", "b"]


def test_numpy_values_are_serialised(tmp_path):
    np = pytest.importorskip("numpy")
    run = make_run(tmp_path)
    run.append_request(rec("base", "2x1", np.int64(1), "a", audio_rtf=np.float32(0.5), codes=np.arange(3)))
    got = run.read_requests()[0]
    assert got["repeat"] == 1 and got["audio_rtf"] == 0.5 and got["codes"] == [0, 1, 2]


def test_update_is_atomic_and_merges(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    run.update(aggregates={"2x1": {"mean_audio_rtf": 0.5}})
    run.update(status="complete")
    doc = json.loads(run.run_json.read_text())
    assert doc["status"] == "complete" and doc["aggregates"]["2x1"]["mean_audio_rtf"] == 0.5

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_json.os, "replace", boom)
    with pytest.raises(OSError):
        run.update(status="broken")
    # The old document is intact: a failed update never leaves half a run.json behind.
    assert json.loads(run.run_json.read_text())["status"] == "complete"


def test_torn_last_line_is_skipped_and_resume_keys_exclude_it(tmp_path):
    run = make_run(tmp_path)
    run.append_request(rec("base", "2x1", 0, "a"))
    run.append_request(rec("test", "2x1", 0, "a"))
    run.flush()
    with open(run.requests_path, "a") as fh:
        fh.write('{"arm": "base", "tier": "2x1", "rep')  # SIGKILL mid-write
    assert len(run.read_requests()) == 2
    assert run.completed_keys() == {("base", "2x1", 0, "a"), ("test", "2x1", 0, "a")}


def test_open_repairs_the_tail_so_resumed_appends_start_a_fresh_line(tmp_path):
    run = make_run(tmp_path)
    run.append_request(rec("base", "2x1", 0, "a"))
    run.flush()
    with open(run.requests_path, "a") as fh:
        fh.write('{"arm": "ba')
    resumed = RunDir.open(run.path)
    resumed.append_request(rec("base", "2x1", 0, "b"))
    assert [r["request_id"] for r in resumed.read_requests()] == ["a", "b"]


def test_open_keeps_an_unterminated_but_complete_last_record(tmp_path):
    run = make_run(tmp_path)
    run.flush()
    with open(run.requests_path, "a") as fh:
        fh.write(json.dumps(rec("base", "2x1", 0, "a")))  # killed between the record and "\n"
    resumed = RunDir.open(run.path)
    resumed.append_request(rec("base", "2x1", 0, "b"))
    assert [r["request_id"] for r in resumed.read_requests()] == ["a", "b"]


def test_corrupt_line_in_the_middle_is_an_error(tmp_path):
    run = make_run(tmp_path)
    run.append_request(rec("base", "2x1", 0, "a"))
    run.flush()
    with open(run.requests_path, "a") as fh:
        fh.write("garbage\n")
    run.append_request(rec("base", "2x1", 0, "b"))
    with pytest.raises(ConfigError, match=r"requests.jsonl:2"):
        run.read_requests()


def test_resume_keys_distinguish_arm_tier_repeat_and_id(tmp_path):
    run = make_run(tmp_path)
    for arm in ("base", "test"):
        for repeat in (0, 1):
            run.append_request(rec(arm, "4x2", repeat, "en_0001#2"))
    assert RunDir.open(run.path).completed_keys() == {
        (arm, "4x2", repeat, "en_0001#2") for arm in ("base", "test") for repeat in (0, 1)
    }
    assert request_key(rec("base", "2x1", 1, "x")) == ("base", "2x1", 1, "x")


def test_open_rejects_foreign_or_future_directories(tmp_path):
    with pytest.raises(ConfigError, match="no run.json"):
        RunDir.open(tmp_path)
    run = make_run(tmp_path)
    run.update(schema_version=99)
    with pytest.raises(ConfigError, match="schema_version 99"):
        RunDir.open(run.path)


def test_update_flushes_queued_requests_first(tmp_path):
    run = make_run(tmp_path)
    for i in range(20):
        run.append_request(rec("base", "2x1", 0, f"r{i}"))
    run.update(status="complete")
    assert len(run.requests_path.read_text().splitlines()) == 20


def test_sigkill_keeps_every_flushed_request(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys, time
        from tts_bench.rundir.results import RunDir
        run = RunDir.create({str(tmp_path)!r}, "ab", command_line=["x"], configs={{}})
        for i in range(30):
            run.append_request({{"arm": "base", "tier": "2x1", "repeat": 0, "request_id": f"r{{i}}"}})
        run.flush()
        print(run.path, flush=True)
        time.sleep(60)
        """
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=repo, stdout=subprocess.PIPE, text=True)
    try:
        path = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert len(RunDir.open(path).completed_keys()) == 30


def test_environment_names_the_runtime_variables_that_were_set(monkeypatch, tmp_path):
    from tts_bench.rundir.provenance import RUNTIME_VARIABLES

    for name in RUNTIME_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "x")
    assert collect_environment(cwd=tmp_path)["runtime_variables"] == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")
    assert collect_environment(cwd=tmp_path)["runtime_variables"] == {}


@pytest.mark.parametrize("content", ["[1, 2]", "null", "7"])
def test_open_refuses_a_run_json_that_is_not_an_object(tmp_path, content):
    (tmp_path / "run.json").write_text(content)
    with pytest.raises(ConfigError, match="not a run record"):
        RunDir.open(tmp_path)
