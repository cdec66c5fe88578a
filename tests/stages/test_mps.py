"""runner.sharing: the private MPS daemon (stages.platform.mps) and how the runner uses it.

A fake `nvidia-cuda-mps-control` on PATH stands in for the driver's: `-d` starts a detached
sleeper and writes its pid file (as the real daemon does in its pipe directory), `quit` on stdin
ends it. So start, client variables, stop, the failure paths and the stage processes' environment
are asserted on any CPU; what MPS does to a GPU is measured on the H200 (D-EXEC-3).
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import tempfile
import textwrap
import threading

import psutil
import pytest

from stages.config import RunnerConfig, StageConfig
from stages.platform import PlatformError, platform_override
from stages.platform import mps
from stages.platform.mps import MpsDaemon, mps_client
from stages.runner import ChunkReady, RequestError, RunnerRequest, StageRunner
from stages.runner.fakes import fake_factories
from stages.runner.sharing import resolve_sharing

FAKE_CONTROL = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, signal, subprocess, sys
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    mode = os.environ.get("FAKE_MPS_MODE", "ok")
    pid_file = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
    if sys.argv[1:] == ["-d"]:
        if mode == "fail":
            print("An instance of this daemon is already running", file=sys.stderr)
            sys.exit(3)
        sleeper = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.05)"],
                                   start_new_session=True)  # keeps the daemon's stdout open, as a real one may
        with open(pid_file, "w") as f:
            f.write(str(sleeper.pid))
        open(os.path.join(pipe, "control"), "w").close()
        sys.exit(0)
    if sys.stdin.read().strip() == "quit" and mode != "stubborn":
        os.kill(int(open(pid_file).read()), signal.SIGTERM)
""")


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    """A fake control program first on PATH; its sleepers are killed after the test."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / mps.CONTROL
    program.write_text(FAKE_CONTROL)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(mps, "_DEFAULT_PIPE", str(tmp_path / "no-system-daemon"))
    started: list[MpsDaemon] = []
    real_start = MpsDaemon.start.__func__

    def start(cls, control=mps.CONTROL):
        daemon = real_start(cls, control)
        started.append(daemon)
        return daemon

    monkeypatch.setattr(MpsDaemon, "start", classmethod(start))
    yield started
    for daemon in started:
        if daemon.pid is not None and psutil.pid_exists(daemon.pid):
            os.kill(daemon.pid, signal.SIGKILL)


def running(pid: int) -> bool:
    return mps._alive(pid)


def test_daemon_gives_clients_its_private_directories_and_stop_ends_it(fake_control, caplog):
    daemon = MpsDaemon.start()
    env = daemon.client_env()
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": str(daemon.root / "pipe"),
                   "CUDA_MPS_LOG_DIRECTORY": str(daemon.root / "log")}
    assert daemon.root.name.startswith("tts-mps-") and daemon.pid is not None and running(daemon.pid)
    daemon.stop()
    assert not running(daemon.pid) and "did not quit" not in caplog.text  # quit, not killed
    assert not daemon.root.exists()
    daemon.stop()  # twice is harmless


def test_below_normal_clients_carry_priority_one(fake_control):
    daemon = MpsDaemon.start()
    try:
        assert daemon.client_env(below_normal=True)["CUDA_MPS_CLIENT_PRIORITY"] == "1"
        assert "CUDA_MPS_CLIENT_PRIORITY" not in daemon.client_env()
    finally:
        daemon.stop()


def test_missing_control_program_names_the_setting_to_change(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PlatformError, match=r"needs nvidia-cuda-mps-control on PATH .*runner.sharing=time-sliced"):
        MpsDaemon.start()


def test_failing_start_reports_the_daemons_message_and_leaves_no_directory(fake_control, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_MPS_MODE", "fail")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with pytest.raises(PlatformError, match="exited with 3 .*already running"):
        MpsDaemon.start()
    assert not list(tmp_path.glob("tts-mps-*"))


def test_daemon_that_ignores_quit_is_killed_with_a_warning(fake_control, monkeypatch, caplog):
    daemon = MpsDaemon.start()
    monkeypatch.setenv("FAKE_MPS_MODE", "stubborn")
    daemon.stop(timeout_s=0.5)
    assert "did not quit" in caplog.text
    assert not running(daemon.pid)
    assert not daemon.root.exists()


def test_mps_client_reads_how_a_process_shares_its_device(tmp_path, monkeypatch):
    monkeypatch.setattr(mps, "_DEFAULT_PIPE", str(tmp_path))
    assert mps_client({}) == "time-sliced"
    assert mps_client({"CUDA_MPS_PIPE_DIRECTORY": "/x"}) == "mps"
    assert mps_client({"CUDA_MPS_PIPE_DIRECTORY": "/x", "CUDA_MPS_CLIENT_PRIORITY": "1"}) == "mps, below-normal priority"
    (tmp_path / "control").touch()  # a system-wide daemon listens where clients look by default
    assert mps_client({}) == "mps (system daemon)"


@pytest.mark.parametrize("runner, message", [
    (dict(sharing="mps-first"), "runner.sharing must be one of auto, time-sliced, mps, mps-talker-first"),
    (dict(sharing="mps", execution="single"), "needs several stage processes"),
    (dict(sharing="mps-talker-first", device="cpu"), "CUDA's Multi-Process Service"),
])
def test_sharing_that_cannot_apply_is_rejected_at_load(runner, message):
    with pytest.raises(ValueError, match=message):
        RunnerConfig(**runner)


def test_auto_sharing_is_mps_only_on_cuda_with_the_control_program(fake_control, tmp_path, monkeypatch):
    auto = RunnerConfig()
    with platform_override(cuda=True):
        assert resolve_sharing(auto, "processes") == ("mps", "auto: CUDA with an MPS control program")
        assert resolve_sharing(auto, "threads")[0] == "mps"
        assert resolve_sharing(auto, "single")[0] == "time-sliced"
        assert resolve_sharing(RunnerConfig(device="cpu"), "processes")[0] == "time-sliced"
        system = tmp_path / "system"
        system.mkdir()
        (system / "control").touch()
        monkeypatch.setattr(mps, "_DEFAULT_PIPE", str(system))
        assert "system-wide" in resolve_sharing(auto, "processes")[1]
        monkeypatch.setattr(mps, "_DEFAULT_PIPE", str(tmp_path / "none"))
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        assert resolve_sharing(auto, "processes") == ("time-sliced", "auto: nvidia-cuda-mps-control is not on PATH")
    with platform_override(cuda=False):
        assert resolve_sharing(auto, "processes") == ("time-sliced", "auto: not CUDA")
    assert resolve_sharing(RunnerConfig(sharing="time-sliced"), "processes") == ("time-sliced", "runner.sharing")


def test_talker_first_runner_makes_its_processes_clients_and_quits_the_daemon(fake_control):
    cfg = StageConfig(runner=RunnerConfig(device="auto", torch_threads=1, sharing="mps-talker-first"))
    runner = StageRunner(cfg, replicas=2, factories=fake_factories())
    runner.start()
    try:
        (daemon,) = fake_control
        assert runner.sharing == "mps-talker-first"
        assert runner.info["talker"]["sharing"] == "mps"  # read from the child's own environment
        assert {runner.info[f"code2wav-{r}"]["sharing"] for r in (0, 1)} == {"mps, below-normal priority"}
        ended, last = threading.Event(), []

        def on_event(event) -> None:
            if isinstance(event, RequestError) or event.last_chunk:
                last.append(event)
                ended.set()

        runner.submit(RunnerRequest("a", "some words", seed=1, max_codes=60), on_event)
        assert ended.wait(30.0)
        assert isinstance(last[0], ChunkReady)  # served end to end, not failed
    finally:
        runner.stop()
    assert not running(daemon.pid) and not daemon.root.exists()


def test_time_sliced_runner_starts_no_daemon(fake_control):
    runner = StageRunner(StageConfig(runner=RunnerConfig(device="cpu", torch_threads=1)), replicas=1,
                         factories=fake_factories())
    runner.start()
    try:
        assert runner.sharing == "time-sliced" and not fake_control
        assert runner.info["talker"]["sharing"] == "time-sliced"
    finally:
        runner.stop()
