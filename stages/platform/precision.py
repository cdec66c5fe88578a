"""Matmul precision switches of a platform: TF32 on CUDA, nothing elsewhere.

torch's TF32 switch (`torch.backends.cuda.matmul.allow_tf32`) is one process-wide flag, not a
per-device or per-thread one. A scope that sets it for a region and restores it after must
hold `_TF32_LOCK`, so replicas on threads of one process take turns through such regions
instead of restoring each other's value mid-region. A scope that sets it and leaves it set
takes no lock: it is only safe when every caller asks the same value (a stage's TF32 mode is
resolved once per process, so "off" and "all" never flip it).

    with tf32_scope(device, True, restore=True):   # TF32 inside, the previous value after
        y = x @ w
    tf32_enabled(device)                            # what a matmul on `device` would use now
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from stages.platform.device import is_cuda

_TF32_LOCK = threading.RLock()


@contextlib.contextmanager
def tf32_scope(device: torch.device, enabled: bool, *, restore: bool) -> Iterator[None]:
    """TF32 matmuls on (`enabled`) or off inside the block, on CUDA only (a no-op elsewhere).

    `restore=True`: set for the block and restored after, under the process-wide lock.
    `restore=False`: set and left set (no lock; see the module docstring for when that is safe).
    Device graphs bake the flag in at capture; replays do not enter this scope.
    """
    if not is_cuda(device):
        yield
        return
    if not restore:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        yield
        return
    with _TF32_LOCK:
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = enabled
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before


def tf32_enabled(device: torch.device) -> bool:
    """Whether a float32 matmul on `device` would run in TF32 now (never off CUDA)."""
    return is_cuda(device) and torch.backends.cuda.matmul.allow_tf32
