"""Every way a run ends leaves run.json final (`complete`, `invalid`, `failed` with the error,
`interrupted`), and Ctrl-C or SIGTERM prints one line, with no child tracebacks, and exits 130 or
143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli.held_cli import HELD_CLI
from tts_bench.backends.base import RequestFailed
from tts_bench.backends.synthetic import SyntheticBackend
from tts_bench.cli import app
from tts_bench.errors import BackendError, ExitStatus
from tts_bench.rundir.results import RunDir

ROOT = Path(__file__).resolve().parents[2]


def make_run(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path, "ab", command_line=["x"], configs={})


def status_of(run: RunDir) -> dict:
    return json.loads(run.run_json.read_text())


def test_finishing_records_failed_with_the_error(tmp_path):
    run = make_run(tmp_path)
    with pytest.raises(BackendError):
        with run.finishing():
            raise BackendError("error: the server went away (backend); start it")
    doc = status_of(run)
    assert doc["status"] == "failed" and doc["error"] == "error: the server went away (backend); start it"


def test_finishing_records_interrupted_on_ctrl_c(tmp_path):
    run = make_run(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with run.finishing():
            raise KeyboardInterrupt
    assert status_of(run)["status"] == "interrupted"


def test_finishing_keeps_a_status_the_work_recorded_and_flags_one_it_forgot(tmp_path):
    done = make_run(tmp_path)
    with pytest.raises(RuntimeError):
        with done.finishing():
            done.update(status="complete")
            raise RuntimeError("after the result: e.g. rendering")
    assert status_of(done)["status"] == "complete"
    forgot = make_run(tmp_path)
    with forgot.finishing():
        pass
    assert status_of(forgot)["status"] == "failed"
    assert RunDir.open(forgot.path, lock=True).release() is None  # the lock was released


class _GoesDown(SyntheticBackend):
    """The first phase runs and half its requests fail (connection lost); then it cannot start."""

    starts = 0

    async def start(self, replicas: int) -> None:
        type(self).starts += 1
        if type(self).starts > 1:
            raise BackendError("error: cannot reach the speech server at http://127.0.0.1:9/v1 (backend)")
        await super().start(replicas)

    async def synthesize(self, request):
        if self.requests_seen % 2:
            self.requests_seen += 1
            raise RequestFailed("connection_error", "dropped after 0 bytes")
        async for chunk in super().synthesize(request):
            yield chunk


def test_a_server_that_goes_down_mid_run_gives_the_table_and_an_invalid_record(tmp_path, monkeypatch):
    monkeypatch.setattr(_GoesDown, "starts", 0)
    monkeypatch.setattr("tts_bench.load.phases.make_backend", _GoesDown)
    result = CliRunner().invoke(app, [
        "ab", "--config", str(ROOT / "configs/ab/synthetic.yaml"), "--set", "synthetic.chunk_delay_s=0",
        "--set", "synthetic.first_chunk_delay_s=0", "--set", "bench.warmup=0", "--tiers", "2x1",
        "--num-prompts", "6", "--repeats", "1", "--format", "json", "--result-dir", str(tmp_path)],
        standalone_mode=False)
    assert result.exception is None, result.output
    assert result.return_value == ExitStatus.INVALID_RUN
    doc = json.loads(result.stdout)
    assert doc["tiers"][0]["arms"]["base"]["failed"] == 3  # the table still shows what happened
    assert any("stopped early" in r and "cannot reach" in r for r in doc["invalid_reasons"])
    run = json.loads((Path(doc["run_dir"]) / "run.json").read_text())
    assert run["status"] == "invalid"


def _as_from_a_terminal() -> None:
    """SIGINT as a shell's foreground job has it. A non-interactive shell starts background jobs
    (`pytest ... &`) with SIGINT ignored, the child inherits that, and a Python started so never
    raises KeyboardInterrupt: the run went on to the end and exited 0, as if the Ctrl-C had come
    after it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("sig", "code", "line"), [
    (signal.SIGINT, 130, "error: interrupted (Ctrl-C)"),  # a terminal's Ctrl-C
    (signal.SIGTERM, 143, "error: terminated (SIGTERM)"),  # `timeout`, a CI job's time limit
], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_prints_one_line_no_child_tracebacks_and_leaves_interrupted(tmp_path, sig, code, line):
    """The signal goes to the whole process group while the tiny stages decode, as a terminal
    and `timeout` send it: the stage processes ignore it and are stopped in order."""
    # Events, not a clock: the third request is held from the moment it would be sent, so a
    # request has gone through both stage processes, the second is in them, and the run cannot
    # end before the signal comes (tests/cli/held_cli.py).
    marker = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "HOLD_AFTER": "2", "HOLD_MARKER": str(marker)}
    proc = subprocess.Popen(
        [sys.executable, HELD_CLI, "ab", "--tiers", "2x1", "--num-prompts", "40", "--result-dir", str(tmp_path)],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_as_from_a_terminal)
    try:
        seen = []
        while True:  # stderr until the runner is up (readline returns "" at EOF: a dead run)
            out = proc.stderr.readline()
            seen.append(out)
            if "runner ready" in out or not out:
                break
        assert "runner ready" in seen[-1], "".join(seen)
        deadline = time.monotonic() + 120  # a hang guard only
        while not marker.exists():
            assert proc.poll() is None, "the run ended before its third request"
            assert time.monotonic() < deadline, "no request finished"
            time.sleep(0.02)
        os.killpg(proc.pid, sig)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == code, rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    assert rest.strip().splitlines() == [rest.strip()] and rest.startswith(line), rest
    (run_json,) = tmp_path.glob("*/run.json")
    doc = json.loads(run_json.read_text())
    assert doc["status"] == "interrupted" and "interrupted" in doc["error"]


def _file_size_limit(limit: int):
    """A full disk for this child: writes past `limit` bytes fail with EFBIG (SIGXFSZ ignored,
    as a process that handles the error itself would)."""
    import resource

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_mid_run_prints_one_line_records_failed_and_resume_completes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    fast = [x for s in ["synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1", "bench.warmup=0",
                        "synthetic.first_chunk_delay_s=0.001", "synthetic.chunk_delay_s=0.001"] for x in ("--set", s)]
    args = [sys.executable, "-m", "tts_bench.cli", "ab", "--config", str(ROOT / "configs/ab/synthetic.yaml"),
            "--tiers", "8x1", "--num-prompts", "64", "--repeats", "1", *fast, "--result-dir", str(tmp_path)]
    # run.json (~15 KB) fits under the limit; requests.jsonl (128 records of ~450 bytes) does not.
    full = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=_file_size_limit(40_000))
    assert full.returncode == 1, full.stderr
    errors = [line for line in full.stderr.splitlines() if not line.startswith("INFO ")]
    assert len(errors) == 1 and errors[0].startswith("error: writing ") and "requests.jsonl failed: " in errors[0], \
        full.stderr
    assert "File too large" in errors[0] and errors[0].endswith("then --resume"), errors
    (run_dir,) = [p.parent for p in tmp_path.glob("*/run.json")]
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["status"] == "failed" and "requests.jsonl failed: [Errno 27] File too large" in doc["error"], doc
    resumed = subprocess.run([sys.executable, "-m", "tts_bench.cli", "ab", "--resume", str(run_dir)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert len({(r["arm"], r["request_id"], r.get("repeat"), r.get("phase")) for r in records}) == 128


# The signal lands inside a task's step rather than while the loop waits: the case the process-group
# test above meets only by chance (a request's synchronous admission check was running).
_SIGTERM_IN_A_TASK = """
import asyncio, os, signal, sys
from tts_bench import cli

if sys.argv[1] == "ignored":  # a background job of a non-interactive shell
    signal.signal(signal.SIGINT, signal.SIG_IGN)
cli._sigterm_interrupts()
unwound = []

async def worker(name):
    try:
        await asyncio.sleep(0)
        if name == "a":
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before this line returns
        await asyncio.sleep(30)
    finally:
        unwound.append(name)

async def main():
    try:
        await asyncio.gather(worker("a"), worker("b"))
    finally:
        unwound.append("main")

try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("interrupted", ",".join(sorted(unwound)), cli._state["terminated"])
"""


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_inside_a_running_task_cancels_every_task_instead_of_killing_one(sigint):
    """SIGTERM goes through asyncio.run's Ctrl-C path: every task unwinds through its finally
    blocks, asyncio.run raises KeyboardInterrupt once, and no task dies with an unretrieved
    exception (asyncio would print "Task exception was never retrieved" and a traceback); also
    where SIGINT is ignored and asyncio.run has no Ctrl-C handler to go through."""
    done = subprocess.run([sys.executable, "-c", _SIGTERM_IN_A_TASK, sigint], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "interrupted a,b,main True", (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "never retrieved" not in done.stderr, done.stderr
