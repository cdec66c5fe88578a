"""Allocator and process memory of the calling process, for the `torch` and `rss` samplers.

On an accelerator the numbers are the caching allocator's (allocated = live tensors, reserved =
held by the allocator, peak = max allocated since start or the last reset); on CPU there is no
device allocator, so allocated/reserved report the process RSS and peak the OS high-water mark.
The dict keys carry units; `source` says which kind of number it is.

    stats = memory_stats(device)   # {"allocated_bytes": ..., "source": "cuda-allocator", ...}
    free_memory_bytes(device)      # what is free to allocate: cuda (mem_get_info) or host RAM
    reset_peak_memory(device)      # peak_bytes counts from here (allocator; no-op on CPU)
    empty_cache(device)            # cached, unused blocks back to the device (no-op on CPU)
"""

from __future__ import annotations

import os
import sys

import torch

from stages.platform.device import _torch_npu


def _rss_bytes() -> int:
    import psutil  # here, not at the top: importing stages.platform must need torch alone

    return int(psutil.Process(os.getpid()).memory_info().rss)


def _peak_rss_bytes(rss: int) -> int:
    try:
        import resource
    except ImportError:  # Windows
        return rss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is KiB on Linux and bytes on macOS.
    return max(rss, int(peak) if sys.platform == "darwin" else int(peak) * 1024)


def memory_stats(device: torch.device) -> dict:
    """allocated/reserved/peak bytes of `device`'s allocator (RSS on CPU) plus the process RSS."""
    rss = _rss_bytes()
    if device.type == "cuda":
        return {
            "allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "reserved_bytes": int(torch.cuda.memory_reserved(device)),
            "peak_bytes": int(torch.cuda.max_memory_allocated(device)),
            "rss_bytes": rss,
            "source": "cuda-allocator",
        }
    if device.type == "npu" and _torch_npu() is not None:
        return {
            "allocated_bytes": int(torch.npu.memory_allocated(device)),
            "reserved_bytes": int(torch.npu.memory_reserved(device)),
            "peak_bytes": int(torch.npu.max_memory_allocated(device)),
            "rss_bytes": rss,
            "source": "npu-allocator",
        }
    return {
        "allocated_bytes": rss,
        "reserved_bytes": rss,
        "peak_bytes": _peak_rss_bytes(rss),
        "rss_bytes": rss,
        "source": "rss",
    }


def reset_peak_memory(device: torch.device) -> None:
    """Make the allocator's peak (`memory_stats(device)["peak_bytes"]`) start again from what is
    allocated now, to measure one piece of work; a no-op on CPU, whose peak is the process's
    high-water mark and cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "npu" and _torch_npu() is not None:
        torch.npu.reset_peak_memory_stats(device)


def empty_cache(device: torch.device) -> None:
    """Hand the caching allocator's unused blocks back to the device (a no-op on CPU): between
    benchmark cases, so blocks one case cached do not decide what the next one can allocate."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "npu" and _torch_npu() is not None:
        torch.npu.empty_cache()


def free_memory_bytes(device: torch.device) -> int | None:
    """Bytes free for new allocations on `device`: `torch.cuda.mem_get_info` on CUDA (this
    creates the calling process's CUDA context), the host's available RAM on CPU, None where
    this layer cannot tell (NPU)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        return host_available_bytes()
    return None


def host_available_bytes() -> int:
    """RAM the host can give new allocations without swapping (psutil's `available`)."""
    import psutil

    return int(psutil.virtual_memory().available)
