"""Device selection, synchronization, dtypes and Triton availability: the only CUDA/NPU/CPU switch.

Model code takes a `torch.device` and a `torch.dtype` and never asks which platform it is on;
the runner asks here once per process. `torch_npu` is imported lazily, only in this package and
only when an NPU is asked for (`auto` or `npu`): importing it patches `torch` and, without CANN
installed, raises, so an import at module level would break every CPU machine.

Tests can force the answers (nanochat-style override), e.g. to check that a stage parses its
flags at construction even where `is_cuda` is False:

    with platform_override(cuda=False, npu=False):
        assert resolve_device("auto").type == "cpu"
        assert not is_cuda(torch.device("cuda", 0))

    device = resolve_device("auto")        # cuda if available, else npu, else cpu
    dtype = dtype_from_name("bfloat16")
    synchronize(device)                    # before every clock read on an async device
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import torch

from stages.platform.errors import PlatformError
from stages.platform.partition import new_cuda_stream

log = logging.getLogger(__name__)

DEVICE_KINDS = ("auto", "cuda", "npu", "cpu")
_TRITON_DEVICE_TYPES = frozenset({"cuda", "npu", "cpu"})  # cpu: interpreter (correctness only)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class _Override:
    """Forced answers for tests; None = ask the real platform."""

    cuda: bool | None = None  # cuda_available() and is_cuda(...)
    npu: bool | None = None  # npu_available()
    triton: bool | None = None  # triton_unavailable_reason(...): None when True


_OVERRIDE = _Override()


@contextlib.contextmanager
def platform_override(
    *, cuda: bool | None = None, npu: bool | None = None, triton: bool | None = None
) -> Iterator[None]:
    """Force platform answers inside the block (tests only); restores the previous state after.

    `cuda=False` makes `cuda_available()` and `is_cuda(d)` False for every device, so a test on a
    GPU host can exercise the CPU branch; `cuda=True` does the opposite (no device is created).
    """
    global _OVERRIDE
    previous = _OVERRIDE
    forced = {"cuda": cuda, "npu": npu, "triton": triton}
    _OVERRIDE = replace(previous, **{k: v for k, v in forced.items() if v is not None})
    try:
        yield
    finally:
        _OVERRIDE = previous


@functools.lru_cache(maxsize=1)
def _torch_npu() -> ModuleType | None:
    """`torch_npu` if installed and importable (needs CANN), else None; imported at most once."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    try:
        return importlib.import_module("torch_npu")
    except Exception as exc:  # torch_npu without a working CANN raises all sorts of errors
        log.info("torch_npu is installed but does not import (%s); NPU unavailable", exc)
        return None


def cuda_available() -> bool:
    if _OVERRIDE.cuda is not None:
        return _OVERRIDE.cuda
    return torch.cuda.is_available()


def npu_available() -> bool:
    if _OVERRIDE.npu is not None:
        return _OVERRIDE.npu
    return _torch_npu() is not None and bool(torch.npu.is_available())


def accelerator_available() -> bool:
    """Whether `runner.device: auto` would pick an accelerator (CUDA or NPU) on this host."""
    return cuda_available() or npu_available()


def is_cuda(device: torch.device | str) -> bool:
    """Whether `device` is a CUDA device (the override wins; used for CUDA-only policies)."""
    if _OVERRIDE.cuda is not None:
        return _OVERRIDE.cuda
    return torch.device(device).type == "cuda"


def tf32_tensor_cores(device: torch.device | str) -> bool:
    """Whether `device` has TF32 tensor cores (CUDA compute capability 8.0 or later): what the
    3xTF32 kernels need (`stages.code2wav.dit_gemm`); False off CUDA."""
    if not is_cuda(device):
        return False
    return torch.cuda.get_device_capability(torch.device(device)) >= (8, 0)


def is_cpu(device: torch.device | str) -> bool:
    """Whether `device` is the host (no device allocator, no streams, no graphs)."""
    return torch.device(device).type == "cpu"


def device_count(kind: str = "auto") -> int:
    """Visible accelerators of `kind` (`auto`: CUDA, else NPU); 0 on a CPU-only machine."""
    if kind in ("auto", "cuda") and cuda_available():
        # A forced answer (tests) stands for one device even where there is none.
        return max(torch.cuda.device_count(), int(_OVERRIDE.cuda is True))
    if kind in ("auto", "npu") and npu_available():
        return max(torch.npu.device_count() if _torch_npu() else 0, int(_OVERRIDE.npu is True))
    return 0


def resolve_device(kind: str = "auto", index: int = 0) -> torch.device:
    """`auto|cuda|npu|cpu` -> a torch.device (`index` for accelerators); raises PlatformError.

    `auto` picks cuda if available, else npu if torch_npu imports and reports a device, else cpu.
    Asking explicitly for a device that is absent is an error, never a silent CPU fallback.
    """
    if kind not in DEVICE_KINDS:
        raise PlatformError(
            f"error: unknown device {kind!r} (runner.device); valid: {', '.join(DEVICE_KINDS)}"
        )
    if kind == "auto":
        kind = "cuda" if cuda_available() else "npu" if npu_available() else "cpu"
    if kind == "cuda" and not cuda_available():
        raise PlatformError("error: no CUDA device (runner.device: cuda); use auto or cpu")
    if kind == "npu" and not npu_available():
        raise PlatformError(
            "error: no Ascend NPU (runner.device: npu); install torch_npu with CANN, or use auto"
        )
    if kind == "cpu":
        return torch.device("cpu")
    if not 0 <= index < device_count(kind):
        raise PlatformError(
            f"error: no {kind} device {index} ({device_count(kind)} visible) (runner.devices); "
            "list visible device indices, or use auto"
        )
    return torch.device(kind, index)


# cuBLAS is deterministic only with a fixed workspace configuration (read once, at its init).
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE = ":4096:8"


def deterministic_kernels() -> None:
    """Run-to-run deterministic kernels: call before any CUDA work (a value the user set in
    CUBLAS_WORKSPACE_CONFIG is kept).

    Measured on an H200 (torch 2.11, full-size code2wav at a batch of one): the same chunk's
    mel was equal from run to run but its audio differed in the low bits in 2 of 6 chunks, so a
    replayed device graph could not be compared with its eager chunk, nor two A/B arms' audio.
    Under `torch.use_deterministic_algorithms(True)` eager == eager and graph == eager held in
    6 of 6 chunks, captures included. cuBLAS needs a fixed workspace configuration for that
    (~24 MiB per stream; the runner also puts it in each stage process's environment).

    Ops without a deterministic implementation warn rather than fail (`warn_only`). What the
    stages run that torch's list names: on the CPU none (the tiny stages decode under the strict
    mode, warn_only off, with no error and identical audio twice); on CUDA `index_put_` /
    `index_copy_` (a deterministic sort-based path: stages.platform.indexing keeps it cheap),
    the talker prelude's integer `scatter_add_` and cuDNN's convolutions and transposed
    convolutions (deterministic algorithms under this mode), and HiFT's sine-phase
    `torch.cumsum` over float frames, which torch flags on CUDA in any case: it warns, and its
    chunks read equal run to run in the H200 probe above. TF32 is the precision mode's business
    (`stages.precision`): off in every stage process unless a mode asks for it.
    """
    os.environ.setdefault(CUBLAS_WORKSPACE_ENV, CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # use_deterministic_algorithms already keeps cuDNN to deterministic algorithms; these say so
    # where cuDNN reads them, and no autotuning picks an algorithm by timing (benchmark).
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # Deterministic mode also fills every new uninitialized tensor with NaN, a debugging aid:
    # one more kernel per `torch.empty`, 5,048 fills in one steady full-size code2wav chunk
    # (B = 2, against ~47k other ops), in a replica that is bound by launches. No stage reads
    # memory it has not written (with the fill on, outputs held no NaN and graph == eager), so
    # the results do not depend on it.
    torch.utils.deterministic.fill_uninitialized_memory = False


def determinism_facts() -> dict[str, Any]:
    """What this process's kernels run under, read off torch (for the run record)."""
    return {
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        CUBLAS_WORKSPACE_ENV: os.environ.get(CUBLAS_WORKSPACE_ENV),
    }


def set_current_device(device: torch.device) -> None:
    """Make `device` the calling thread's current device (no-op on CPU): library calls that
    take no device argument (graph pools, handles) then land on it."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "npu":
        _torch_npu()
        torch.npu.set_device(device)


@contextlib.contextmanager
def thread_stream(device: torch.device, *, high_priority: bool = False) -> Iterator[None]:
    """A new device stream, current for the calling thread inside the block (no-op on CPU).

    Replicas on threads of one process each run on their own stream, so their kernels and
    graph replays can overlap on the device instead of queueing on the default stream.
    `high_priority`: the device schedules this stream's ready kernels before those of normal
    streams (the talker beside the replicas: every replica waits on its codes)."""
    priority = -1 if high_priority else 0  # lower is higher; -1 is high on every CUDA device
    if device.type == "cuda":
        # Inside `on_partition` the stream is the partition's (stages.platform.partition).
        with torch.cuda.stream(new_cuda_stream(device, priority=priority)):
            yield
    elif device.type == "npu":
        _torch_npu()
        with torch.npu.stream(torch.npu.Stream(device=device, priority=priority)):
            yield
    else:
        yield


def synchronize(device: torch.device) -> None:
    """Wait for queued work on `device` (no-op on CPU). Call before reading a host clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        _torch_npu()
        torch.npu.synchronize(device)


def synchronize_stream(device: torch.device) -> None:
    """Wait for the calling thread's current stream on `device` only (no-op on CPU).

    What a replica thread uses to time its own work: a device-wide sync from one thread while
    another thread of the process captures a graph fails ("operation not permitted when stream
    is capturing", seen on an H200 with replicas on threads) and breaks that capture."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    elif device.type == "npu":
        _torch_npu()
        torch.npu.current_stream(device).synchronize()


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (host memory) on `device`, queued on the calling thread's stream without waiting.

    A copy from ordinary (pageable) host memory waits for the stream to drain first, i.e. for
    every kernel queued before it: the talker, admitting a request, would wait for the prefill it
    had just launched for the one before. From pinned memory the copy is queued like a kernel,
    and the caching host allocator keeps the pinned block until the copy has run. (On an NPU,
    torch_npu pins for the NPU.) CPU: the tensor itself."""
    if device.type not in ("cuda", "npu"):
        return tensor.to(device)
    if device.type == "npu":
        _torch_npu()
    return tensor.pin_memory().to(device, non_blocking=True)


def device_to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Host copies of `tensors` (all on one device) for ONE wait on the device: every copy but the
    last is queued into pinned memory, and the last, an ordinary copy, waits for the stream, by
    then past the queued ones (same stream, in order). Two ordinary copies would wait twice (a
    second host sync for a mel that is already done). CPU tensors come back as they are."""
    if not tensors or tensors[0].device.type not in ("cuda", "npu"):
        return [t.cpu() for t in tensors]
    if tensors[0].device.type == "npu":
        _torch_npu()
    out = []
    for t in tensors[:-1]:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        out.append(host)
    return [*out, tensors[-1].cpu()]


def timing_event(device: torch.device) -> Any | None:
    """A device event that can time work (`enable_timing`), or None on CPU.

    `event.record()` marks the calling thread's current stream; `a.elapsed_time(b)` (ms, once
    `b` has completed) is then how long the device took from mark `a` to mark `b`, including
    time the stream's work waited there for SMs or for another context's time slice."""
    if device.type == "cuda":
        return torch.cuda.Event(enable_timing=True)
    if device.type == "npu":
        _torch_npu()
        return torch.npu.Event(enable_timing=True)
    return None


def dtype_from_name(name: str) -> torch.dtype:
    """`float32|bfloat16|float16` (also fp32/bf16/fp16) -> torch dtype; raises PlatformError."""
    try:
        return _DTYPES[name.strip().lower()]
    except (KeyError, AttributeError):
        raise PlatformError(
            f"error: unknown dtype {name!r} (runner.dtype); valid: float32, bfloat16, float16"
        ) from None


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why a Triton kernel cannot run for `device` in this process, or None if it can.

    cuda/npu: triton must import (a broken install raises anything at import, so it is really
    imported, once, not just looked up). cpu: only under the interpreter (`TRITON_INTERPRET=1`),
    which is how kernel tests run in CI; it is far too slow for benchmarks, so CPU runs use
    eager code. The test override (`platform_override(triton=...)`) wins.
    """
    if _OVERRIDE.triton is not None:
        return None if _OVERRIDE.triton else "Triton forced off (platform_override)"
    if device.type not in _TRITON_DEVICE_TYPES:
        return f"no Triton for device type {device.type!r}"
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "").strip() != "1":
        return "CPU without TRITON_INTERPRET=1"
    try:
        importlib.import_module("triton")
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        return f"triton does not import ({type(exc).__name__}: {exc})"
    return None


def compile_failure(warm_up: Callable[[], object], what: str, kept: str, *, log: logging.Logger,
                    owner: str) -> str | None:
    """Run `warm_up` (it compiles Triton kernels now, outside any graph capture); the reason it
    failed, logged on `log` as "`owner`: `kept` kept, ..." (what runs instead), or None. A broken
    compiler must not take the stage down: the torch path it would have replaced runs instead."""
    try:
        warm_up()
    except Exception as exc:  # noqa: BLE001 - any compiler failure means the fallback
        reason = f"{what} failed to compile ({type(exc).__name__}: {exc})"
        log.warning("%s: %s kept, %s", owner, kept, reason)
        return reason
    return None


def unwrapped_current_device(get_device: Callable[[], int]) -> Callable[[], int]:
    """`get_device` minus torch's lazy-init wrapper when it is torch's CUDA current-device query.

    `torch.cuda.current_device()` is `_lazy_init(); torch._C._cuda_getDevice()`: three Python
    frames per call. Once CUDA is initialised the C getter alone returns the same index, so a
    caller that only runs after initialisation (a raw Triton launch) may call it instead.
    Any other getter is returned as it is.
    """
    cuda_get_device = getattr(torch._C, "_cuda_getDevice", None)
    if get_device is getattr(torch.cuda, "current_device", None) and cuda_get_device is not None:
        return cuda_get_device
    return get_device


def device_name(device: torch.device) -> str | None:
    """The accelerator's product name, e.g. `NVIDIA H200`; None for the host."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "npu":
        _torch_npu()
        return torch.npu.get_device_name(device)
    return None


def describe_device(device: torch.device) -> str:
    """A human-readable device name for run records, e.g. `cuda:0 (NVIDIA H200)`."""
    name = device_name(device)
    if name is not None:
        return f"{device} ({name})"
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
