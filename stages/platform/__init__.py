"""The platform layer: the one place that knows CUDA from Ascend NPU from CPU.

Everything else takes a `torch.device` and a `torch.dtype` and asks here when a decision depends
on the platform (TF32, Triton, streams, graphs, allocator numbers). Nothing here constructs a
device or imports `torch_npu` at import time, and importing it needs torch alone (psutil is
imported by the memory helpers when called), so the sampling prelude and the kernel scripts can
use it on a machine with torch + triton only.

    from stages.platform import resolve_device, dtype_from_name, synchronize, graph_api
    device = resolve_device("auto")     # cuda, else npu, else cpu
    api = graph_api(device)             # CUDAGraph / NPUGraph helpers, None on CPU
    memory_stats(device)                # allocator (or RSS on CPU) bytes of this process
    with tf32_scope(device, True):      # TF32 matmuls and convs on CUDA, no-op elsewhere
        ...
"""

from stages.platform.device import (
    DEVICE_KINDS,
    accelerator_available,
    compile_failure,
    cuda_available,
    describe_device,
    determinism_facts,
    deterministic_kernels,
    device_count,
    device_name,
    dtype_from_name,
    is_cpu,
    is_cuda,
    npu_available,
    platform_override,
    resolve_device,
    set_current_device,
    synchronize,
    synchronize_stream,
    tf32_tensor_cores,
    thread_stream,
    timing_event,
    triton_unavailable_reason,
    unwrapped_current_device,
)
from stages.platform.errors import PlatformError
from stages.platform.graphs import GraphAPI, graph_api
from stages.platform.memory import (
    empty_cache,
    free_memory_bytes,
    host_available_bytes,
    memory_stats,
    reset_peak_memory,
)
from stages.platform.precision import (
    FP32,
    Tf32Flags,
    live_tf32,
    precision_scope,
    strict_fp32_baseline,
    tf32_enabled,
    tf32_scope,
)

__all__ = [
    "DEVICE_KINDS",
    "FP32",
    "Tf32Flags",
    "GraphAPI",
    "PlatformError",
    "accelerator_available",
    "compile_failure",
    "cuda_available",
    "describe_device",
    "determinism_facts",
    "deterministic_kernels",
    "device_count",
    "device_name",
    "dtype_from_name",
    "empty_cache",
    "free_memory_bytes",
    "graph_api",
    "host_available_bytes",
    "is_cpu",
    "is_cuda",
    "live_tf32",
    "memory_stats",
    "npu_available",
    "platform_override",
    "precision_scope",
    "reset_peak_memory",
    "resolve_device",
    "set_current_device",
    "strict_fp32_baseline",
    "synchronize",
    "synchronize_stream",
    "tf32_enabled",
    "tf32_scope",
    "tf32_tensor_cores",
    "thread_stream",
    "timing_event",
    "triton_unavailable_reason",
    "unwrapped_current_device",
]
