"""How the runner's stage processes share a CUDA device (`runner.sharing`), resolved and set up.

Time-sliced, each process its own device context (the GPU's default), or clients of a private
MPS daemon (`stages.platform.mps`) that the runner starts before its children and stops after
them. This module decides which (`resolve_sharing`, for `auto`) and hands each process the
environment that makes it a client (`Sharing.env_for`).

    sharing = Sharing.start(cfg.runner, execution="processes")
    spec_env = sharing.env_for(talker=True)     # into ProcessSpec.env
    ...
    sharing.stop()
"""

from __future__ import annotations

import atexit
import shutil
from dataclasses import dataclass

from stages.config import RunnerConfig
from stages.platform import cuda_available
from stages.platform.mps import CONTROL, MpsDaemon, system_daemon

Env = tuple[tuple[str, str], ...]


def resolve_sharing(runner: RunnerConfig, execution: str) -> tuple[str, str]:
    """(`runner.sharing` resolved, why) for a resolved `execution`.

    `auto` is mps where it can be (D-EXEC-3): an H200 A/B read mean RTF -29.1 % [-32.9, -25.1] at
    128x8 and -16.7 % [-27.7, -4.1] at 64x4 against time-sliced contexts, 32x1 within noise, codes
    identical. It falls back to time-sliced with one process (single), off CUDA, without the
    control program, or where a system-wide daemon already makes every CUDA process a client (a
    second daemon would compete with it for the GPU)."""
    if runner.sharing != "auto":
        return runner.sharing, "runner.sharing"
    if execution == "single":
        return "time-sliced", "auto: execution single is one device context"
    if runner.device in ("cpu", "npu") or not cuda_available():
        return "time-sliced", "auto: not CUDA"
    if system_daemon():
        return "time-sliced", "auto: a system-wide MPS daemon already serves every CUDA process here"
    if shutil.which(CONTROL) is None:
        return "time-sliced", f"auto: {CONTROL} is not on PATH"
    return "mps", "auto: CUDA with an MPS control program"


@dataclass
class Sharing:
    """The resolved mode, its daemon (mps*) and the environments of the two kinds of process."""

    mode: str = "time-sliced"
    why: str = "not started"  # what decided the mode (the runner's ready line says it)
    daemon: MpsDaemon | None = None
    talker_env: Env = ()
    replica_env: Env = ()

    @classmethod
    def start(cls, runner: RunnerConfig, execution: str) -> Sharing:
        """Resolve `runner.sharing` and start its daemon if it needs one (PlatformError if that fails)."""
        mode, why = resolve_sharing(runner, execution)
        if mode == "time-sliced":
            return cls(mode, why)
        daemon = MpsDaemon.start()
        atexit.register(daemon.stop)  # a harness that dies without stop() leaves no daemon behind
        below_normal = mode == "mps-talker-first"
        return cls(mode, why, daemon, tuple(daemon.client_env().items()),
                   tuple(daemon.client_env(below_normal=below_normal).items()))

    def env_for(self, *, talker: bool) -> Env:
        """A process's client variables: the talker's for any process hosting it."""
        return self.talker_env if talker else self.replica_env

    def stop(self) -> None:
        """Quit the daemon, if any; call it once the clients are gone (safe twice)."""
        if self.daemon is not None:
            self.daemon.stop()
            atexit.unregister(self.daemon.stop)  # a long run starts many runners: keep none
