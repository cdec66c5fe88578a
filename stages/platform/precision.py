"""TF32 switches of a platform: cuBLAS matmuls and cuDNN convolutions on CUDA, nothing elsewhere.

torch has two process-wide TF32 flags, not per-device or per-thread ones:
`torch.backends.cuda.matmul.allow_tf32` (off by default) and `torch.backends.cudnn.allow_tf32`
(ON by default: left alone, every fp32 convolution runs in TF32). A stage says what it wants with
a `Tf32Flags` (the table of modes is `stages.precision`) and runs its region inside
`precision_scope`, which sets both flags for the region and restores them after.

Threads of one process (replicas beside each other, and the talker beside them with
`runner.execution: single`) share the flags, so the scopes share a lease: regions that want the
same flags run side by side, a region that wants other flags waits until the current ones have
left (and newcomers wait behind it, so it is not starved). The flags are read when an op is
launched from the host, so code launched inside a scope runs with the scope's flags; device
graphs bake them in at capture, and replays need no scope. A scope nested in a scope of the same
thread must want the same flags (an internal invariant: raising beats deadlocking).

`strict_fp32_baseline()` sets both flags off for a whole process (each stage process calls it
before any device work), so code outside every scope (a speaker embedding, a warmup) also runs in
fp32 instead of torch's TF32 convolutions.

    with precision_scope(device, Tf32Flags(matmul=False, cudnn=True)):  # TF32 convs only
        y = conv(x) @ w
    live_tf32(device)   # Tf32Flags a launch on `device` would use now (all False off CUDA)
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from stages.platform.device import is_cuda


@dataclass(frozen=True)
class Tf32Flags:
    """Whether fp32 matmuls (cuBLAS) and fp32 convolutions (cuDNN) may round inputs to TF32."""

    matmul: bool
    cudnn: bool


FP32 = Tf32Flags(matmul=False, cudnn=False)

_COND = threading.Condition()
_value: Tf32Flags | None = None  # the flags every current holder asked for
_baseline: Tf32Flags | None = None  # the flags before the first current holder came in
_holds: Counter[int] = Counter()  # thread ident -> scopes it holds (nesting)
_waiting: Counter[Tf32Flags] = Counter()  # flags that waiting threads want


def _read() -> Tf32Flags:
    return Tf32Flags(torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def _write(flags: Tf32Flags) -> None:
    torch.backends.cuda.matmul.allow_tf32 = flags.matmul
    torch.backends.cudnn.allow_tf32 = flags.cudnn


def _may_enter(want: Tf32Flags) -> bool:
    total = sum(_holds.values())
    if total == 0:
        return True
    # Joining holders of the same flags is fine unless a thread waits for other flags.
    return _value == want and not any(n for flags, n in _waiting.items() if flags != want)


@contextlib.contextmanager
def precision_scope(device: torch.device, want: Tf32Flags) -> Iterator[None]:
    """Both TF32 flags as `want` inside the block, the previous values after (CUDA only: a
    no-op elsewhere, where nothing runs in TF32). See the module docstring for threads."""
    if not is_cuda(device):
        yield
        return
    global _value, _baseline
    me = threading.get_ident()
    with _COND:
        if _holds[me]:
            if _value != want:
                raise RuntimeError(f"a TF32 scope asking {want} inside one holding {_value} (same thread)")
        else:
            _waiting[want] += 1
            try:
                _COND.wait_for(lambda: _may_enter(want))
            finally:
                _waiting[want] -= 1
            if not sum(_holds.values()):
                _baseline, _value = _read(), want
                _write(want)
        _holds[me] += 1
    try:
        yield
    finally:
        with _COND:
            _holds[me] -= 1
            if not _holds[me]:
                del _holds[me]
            if not _holds:
                assert _baseline is not None
                _write(_baseline)
                _value = _baseline = None
            _COND.notify_all()


def tf32_scope(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager[None]:
    """TF32 for both matmuls and convolutions on (`enabled`) or off inside the block."""
    return precision_scope(device, Tf32Flags(matmul=enabled, cudnn=enabled))


def live_tf32(device: torch.device) -> Tf32Flags:
    """The TF32 flags an fp32 matmul / convolution launched on `device` now would run with, read
    off torch's backend flags (never TF32 off CUDA)."""
    return _read() if is_cuda(device) else FP32


def tf32_enabled(device: torch.device) -> bool:
    """Whether a float32 matmul on `device` would run in TF32 now (never off CUDA)."""
    return live_tf32(device).matmul


def strict_fp32_baseline() -> None:
    """Both TF32 flags off for this process (torch leaves cuDNN's on). Call before any device
    work, outside every scope; the scopes restore to it."""
    with _COND:
        if _holds:
            raise RuntimeError("strict_fp32_baseline inside a TF32 scope")
        _write(FP32)
