"""The platform layer: the one place that knows CUDA from Ascend NPU from CPU.

Everything else takes a `torch.device` and a `torch.dtype`. Nothing here constructs a device or
imports `torch_npu` at import time.

    from stages.platform import resolve_device, dtype_from_name, synchronize, graph_api
    device = resolve_device("auto")     # cuda, else npu, else cpu
    api = graph_api(device)             # CUDAGraph / NPUGraph helpers, None on CPU
    memory_stats(device)                # allocator (or RSS on CPU) bytes of this process
"""

from stages.platform.device import (
    DEVICE_KINDS,
    PlatformError,
    accelerator_available,
    cuda_available,
    describe_device,
    deterministic_kernels,
    device_count,
    dtype_from_name,
    is_cuda,
    is_npu,
    npu_available,
    platform_override,
    resolve_device,
    set_current_device,
    synchronize,
    thread_stream,
    triton_available,
)
from stages.platform.graphs import GraphAPI, graph_api
from stages.platform.memory import free_memory_bytes, host_available_bytes, memory_stats

__all__ = [
    "DEVICE_KINDS",
    "GraphAPI",
    "PlatformError",
    "accelerator_available",
    "cuda_available",
    "describe_device",
    "deterministic_kernels",
    "device_count",
    "dtype_from_name",
    "free_memory_bytes",
    "graph_api",
    "host_available_bytes",
    "is_cuda",
    "is_npu",
    "memory_stats",
    "npu_available",
    "platform_override",
    "resolve_device",
    "set_current_device",
    "synchronize",
    "thread_stream",
    "triton_available",
]
