"""Run a call once more from a CUDA graph, for the GPU cases of the kernel tests."""

from __future__ import annotations

from collections.abc import Callable

import torch


def replayed(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`fn()`'s output as a CUDA graph of it replays it: warmed once and captured on a side stream
    (as the runner's capture does), replayed on the current one, synchronised. Its inputs must
    stay where they are; compare the result with an eager call's for a bit-for-bit replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn()
        with torch.cuda.graph(graph, stream=stream):
            captured = fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    return captured
