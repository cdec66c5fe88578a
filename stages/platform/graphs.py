"""Device-graph API of a platform: CUDA graphs on CUDA, NPU graphs on Ascend, none on CPU.

Model code that captures graphs asks for the API once and never names `torch.cuda` itself:

    api = graph_api(device)            # None on CPU: run eager
    if api is not None:
        graph = api.graph()
        side = api.stream()
        with api.use_stream(side):     # warm up on a side stream before capture (CUDA rule;
            fn(static_x)               # code2wav's ChunkGraphs does not: see its docstring)
        with api.capture(graph, pool=api.pool()):
            static_y = fn(static_x)
        graph.replay()

Landmine: a graph replays fixed addresses; inputs must be copied into the captured tensors and
outputs cloned before the next replay overwrites them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from stages.platform.device import _torch_npu
from stages.platform.partition import new_cuda_stream


# Captures are serialized process-wide: stages on threads of one process (replicas, and the
# talker with runner.execution=single) capture into their own pools, which CUDA allows at once in
# "thread_local" mode, but that was never run; one capture at a time costs little, since each
# stage captures a few dozen shapes once.
CAPTURE_LOCK = threading.Lock()


@dataclass(frozen=True)
class GraphAPI:
    """The graph classes and context managers of one platform."""

    platform: str  # "cuda" | "npu"
    graph: Callable[[], Any]  # torch.cuda.CUDAGraph | torch.npu.NPUGraph
    capture: Callable[..., Any]  # torch.cuda.graph | torch.npu.graph: (graph, pool=, stream=)
    pool: Callable[[], Any]  # graph_pool_handle: share memory between graphs
    stream: Callable[[], Any]  # a side stream for warmup / capture
    use_stream: Callable[[Any], Any]  # context manager that makes a stream current
    current_stream: Callable[[], Any]  # the calling thread's current stream
    # Extra keyword arguments of `capture`. CUDA: "thread_local" error mode, so a capture in one
    # thread does not fail because another thread (a replica) allocates or syncs meanwhile.
    capture_options: dict = field(default_factory=dict)


@contextlib.contextmanager
def _cuda_capture(graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"):
    """`torch.cuda.graph` without its entry ritual (device-wide sync, gc.collect, empty_cache).

    That ritual frees memory for the capture; with replicas on threads of one process it
    stalls every other replica at each capture (a runner at 128x8 captures ~24 shapes per
    replica) and empties their allocator caches. The capture stream must already wait for the
    work its inputs come from (callers make it wait on their stream)."""
    stream = stream if stream is not None else torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph.capture_begin(pool, capture_error_mode=capture_error_mode)
        try:
            yield
        finally:
            graph.capture_end()


def graph_api(device: torch.device) -> GraphAPI | None:
    """The graph API for `device`, or None on CPU (callers then stay eager)."""
    if device.type == "cuda":
        return GraphAPI(
            platform="cuda",
            graph=torch.cuda.CUDAGraph,
            capture=_cuda_capture,
            pool=torch.cuda.graph_pool_handle,
            # The calling thread's SM partition's, if it runs on one (stages.platform.partition):
            # a graph captured on another stream would not be confined to the partition.
            stream=lambda: new_cuda_stream(device),
            use_stream=torch.cuda.stream,
            current_stream=lambda: torch.cuda.current_stream(device),
            capture_options={"capture_error_mode": "thread_local"},
        )
    if device.type == "npu":
        if _torch_npu() is None:
            return None
        npu = torch.npu
        return GraphAPI(
            platform="npu",
            graph=npu.NPUGraph,
            capture=npu.graph,
            pool=npu.graph_pool_handle,
            stream=lambda: npu.Stream(device=device),
            use_stream=npu.stream,
            current_stream=lambda: npu.current_stream(device),
        )
    return None


class SideStreamCapture:
    """Captures forwards into one shared pool on one side stream, without syncing the device.

    A forward is warmed up on the side stream (CUDA's rule before a capture), then captured there;
    the side stream first waits for the caller's (its inputs were written there) and the caller's
    then waits for the side's (the warmup's writes, e.g. KV-cache rows, come before the first
    replay). No device-wide sync: with replicas on threads of the same process
    (`runner.execution: single`) a sync while one of them captures breaks its capture.

        captures = SideStreamCapture(api)
        graph, out = captures.capture(lambda: model(static_x))
    """

    def __init__(self, api: GraphAPI) -> None:
        self.api = api
        self.pool = api.pool()
        self.side = None  # made at the first capture, then reused

    def capture(self, forward: Callable[[], Any]) -> tuple[Any, Any]:
        """-> (graph, outputs of the captured `forward`, owned by the graph's pool)."""
        api = self.api
        if self.side is None:
            self.side = api.stream()
        caller, side = api.current_stream(), self.side
        side.wait_stream(caller)
        with api.use_stream(side):
            forward()
        graph = api.graph()
        with CAPTURE_LOCK, api.capture(graph, pool=self.pool, stream=side, **api.capture_options):
            out = forward()
        caller.wait_stream(side)
        return graph, out
