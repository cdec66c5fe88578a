"""A private CUDA MPS daemon for the stage processes (`runner.sharing: mps | mps-talker-first`).

Why: as processes, the talker and R code2wav replicas are R + 1 device contexts, and the GPU
time-slices contexts: a context's kernels run only in its slice. At 128x8 on an H200 the talker
waited for the device 77-86 % of its busy time beside eight replica contexts
(`results/h200/ab_finals_128x8.md`). Under the Multi-Process Service the processes are clients
of one server context, and their kernels share the SMs at the same time, like streams of one
process, while each keeps its own interpreter (no GIL between replicas, unlike `execution:
threads`).

The daemon is the runner's own: its pipe and log directories are a fresh temporary directory,
so it does not join a system-wide daemon (where one runs, `runner.sharing: auto` starts none:
`stages.runner.sharing`), and only processes given `client_env()` become its clients (the
harness process, which may hold a plain context for its memory preflight, does not). `stop()` quits it; the runner calls that after its processes are gone.

Landmines: the variables must be in a process's environment before CUDA initialises there (the
driver reads them once, at cuInit), so a stage process applies them before it touches the device.
`CUDA_MPS_CLIENT_PRIORITY=1` (below normal) makes the server schedule a client's kernels after
those of normal clients (the H200's driver 580 honours it: the talker's step got shorter, the
replicas' longer; an older driver may not know the variable). MPS is a CUDA facility with no
Ascend counterpart. Measured: D-EXEC-3 (mps against time-sliced, and the talker-first ranking).

    daemon = MpsDaemon.start()
    env = daemon.client_env(below_normal=True)   # into a child's os.environ before cuInit
    ...
    daemon.stop()
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stages.platform.errors import PlatformError

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
_PIPE_ENV, _LOG_ENV, _PRIORITY_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_CLIENT_PRIORITY"
_DEFAULT_PIPE = "/tmp/nvidia-mps"  # where clients look when CUDA_MPS_PIPE_DIRECTORY is unset
_READY_S = 10.0  # the daemon's control socket appears within milliseconds; this is slack
_POLL_S = 0.05


@dataclass
class MpsDaemon:
    """One running control daemon (it starts its server when the first client connects)."""

    control: str  # path of nvidia-cuda-mps-control
    root: Path  # temporary directory holding pipe/ and log/
    pid: int | None  # the daemon's pid, from its pid file
    stopped: bool = False

    @classmethod
    def start(cls, control: str = CONTROL) -> MpsDaemon:
        """Start a daemon in a new temporary directory; raises PlatformError with what to do."""
        path = shutil.which(control)
        if path is None:
            raise PlatformError(
                f"error: runner.sharing needs {control} on PATH (MPS daemon start); install the "
                "NVIDIA driver's utilities or set runner.sharing=time-sliced")
        root = Path(tempfile.mkdtemp(prefix="tts-mps-"))
        (root / "pipe").mkdir()
        (root / "log").mkdir()
        env = {**os.environ, _PIPE_ENV: str(root / "pipe"), _LOG_ENV: str(root / "log")}
        try:
            # Its output goes to a file, not a pipe: a daemon's children may hold a pipe open
            # long after `-d` returned, and reading it to EOF would wait for them.
            with open(root / "log" / "start.out", "w+") as out:
                done = subprocess.run([path, "-d"], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=_READY_S)
                out.seek(0)
                said = out.read().strip()
            if done.returncode != 0:
                raise PlatformError(
                    f"error: {control} -d exited with {done.returncode} (MPS daemon start): "
                    f"{said}; set runner.sharing=time-sliced")
            pid = _wait_for_pid(root / "pipe" / "nvidia-cuda-mps-control.pid")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        log.info("MPS: private control daemon pid %s (pipe %s)", pid, root / "pipe")
        return cls(path, root, pid)

    def client_env(self, *, below_normal: bool = False) -> dict[str, str]:
        """The variables that make a process this daemon's client (set them before cuInit)."""
        env = {_PIPE_ENV: str(self.root / "pipe"), _LOG_ENV: str(self.root / "log")}
        if below_normal:
            env[_PRIORITY_ENV] = "1"
        return env

    def stop(self, timeout_s: float = 10.0) -> None:
        """Quit the daemon (and its server) and remove its directory; safe to call twice.

        Call it once the clients are gone: the server finishes when its last client exits. A
        daemon that does not quit in `timeout_s` is killed, with a warning."""
        if self.stopped:
            return
        self.stopped = True
        env = {**os.environ, **self.client_env()}
        try:
            subprocess.run([self.control], input="quit\n", env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("MPS: quit failed (%s)", exc)
        if self.pid is not None and not _wait_gone(self.pid, timeout_s):
            log.warning("MPS: daemon pid %d did not quit in %.0f s; killing it", self.pid, timeout_s)
            _kill(self.pid)
            _wait_gone(self.pid, timeout_s)
        shutil.rmtree(self.root, ignore_errors=True)


def mps_client(env: Mapping[str, str]) -> str:
    """How a process with environment `env` shares its device, for its run facts: "time-sliced",
    "mps", "mps, below-normal priority" or "mps (system daemon)" (every CUDA process on the
    machine is then a client, whatever runner.sharing says)."""
    if _PIPE_ENV not in env:
        return "mps (system daemon)" if system_daemon() else "time-sliced"
    return "mps, below-normal priority" if env.get(_PRIORITY_ENV) == "1" else "mps"


def system_daemon() -> bool:
    """Whether a system-wide control daemon listens where clients look by default (then every
    CUDA process without CUDA_MPS_PIPE_DIRECTORY is its client)."""
    return (Path(_DEFAULT_PIPE) / "control").exists()


def _wait_for_pid(pid_file: Path) -> int | None:
    """The daemon's pid once it wrote its pid file (None if it never did: then it cannot be
    waited for at stop, only asked to quit)."""
    pid = _poll(lambda: _read_pid(pid_file), _READY_S)
    if pid is None:
        log.warning("MPS: no pid file at %s after %.0f s", pid_file, _READY_S)
    return pid


def _read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _wait_gone(pid: int, timeout_s: float) -> bool:
    return _poll(lambda: not _alive(pid), timeout_s) is not None


def _poll(check, timeout_s: float):
    """`check()` every _POLL_S until it returns something truthy (returned), or None at timeout."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            return None
        time.sleep(_POLL_S)
    return value


def _alive(pid: int) -> bool:
    """Running (a zombie counts as gone: the daemon is reparented, and a container's init may
    never reap it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # exists, owned by someone else
        return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
