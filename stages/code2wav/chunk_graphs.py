"""Device graphs of whole code2wav chunks, captured lazily per batch shape and replayed.

An eager full-size chunk launches ~11,000 small kernels, so a replica is bound by the host, not
the device. `ChunkDecoder.run` is shape-static and sync-free for a given `BatchShape`, so one
graph per shape replays the whole chunk (encoder, 10 Euler steps, HiFT, cache stores) in one
launch. Inputs enter through one static int64 tensor (`meta`); a replay's outputs are copied out
of the graph's own tensors on the device before `run` returns, so what the caller gets is its own
(see the landmines: a later replay of another shape may write over the graph's outputs).

The first chunk of a shape runs eagerly on the caller's stream and returns that real result;
then the same function is captured on the capture stream, on the same static input, without
executing. Warmup cannot simply run before capture and be replayed after: the decode advances the
request's state (it writes caches), so running it twice would decode the next chunk from the
wrong state. (Capturing a new shape first and replaying it, skipping the eager run, failed on an
H200 under the allocator's pool accounting; it is not used.)

Why the caller's stream and not the capture stream (the usual "warm up on the side stream"): on
an H200 (torch 2.11) a first run on the capture stream faulted with an illegal memory access
whenever the device was contended: at 64x4 with the real talker beside the replicas 96 of 128
requests failed, and with the fake talker beside a matmul loop in another process 192 of 192;
the first error surfaced in HiFT's first ConvTranspose1d, with cuDNN on or off. Run on the
caller's stream, the same 64x4 run completed every request. The faulting kernel was not pinned
down (a device sync after every module hides the fault). What the side-stream warmup was for,
library state made before the capture, is then made during it: PyTorch allocates a stream's
cuBLAS workspace on its first use there, here from the graphs' pool.

Graphs of one replica share a memory pool; they never run concurrently (one replica, one
stream), so their temporaries may overlap. Each replica owns its pool and stream, so replicas on
threads of one process never share either.

Landmines:
* a capture that fails (an op that syncs, an unsupported kernel) switches graphs off for this
  instance for good (logged once) and the chunk's eager result stands;
* captured graphs hold the slot pool's addresses: `invalidate()` after the pool reallocates;
* a graph's outputs are not safe from the other graphs of its pool: the allocator hands a capture
  the blocks that earlier captures freed, so a graph's outputs may lie where an earlier-captured
  graph keeps its temporaries, and that graph's next replay overwrites them. Sharing a pool is
  only safe when outputs are consumed before any other graph replays (PyTorch's "replay in
  capture order" rule), and a decode call queues every group before copying any back. Measured
  on an H200: with the warmup's graphs, 5 of 46 chunks of staggered tiny traffic came back with
  another group's temporaries as audio. So `run` copies a replay's outputs out (one device copy
  per output tensor, queued right after the replay);
* graphs are dropped all together, never one at a time: destroying a CUDA graph clears the
  cuBLAS workspace of the stream it was captured on (torch 2.11, pytorch/pytorch#193402), and
  every other graph captured on that stream still writes to that workspace. Past `max_graphs`
  shapes the whole set goes and is captured again as shapes come back;
* nothing executes on the capture stream: the first run of a shape is the caller's, and the
  capture only records (so the caller never has to wait for the capture stream);
* captures are serialized process-wide (`stages.platform.graphs.CAPTURE_LOCK`, shared with the
  talker's decode graphs).

    graphs = ChunkGraphs(graph_api(device), max_graphs=48)
    out = graphs.run(shape, meta_host, lambda meta: decoder.run(meta, shape))
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from stages.platform.graphs import CAPTURE_LOCK, GraphAPI

log = logging.getLogger(__name__)


@dataclass
class _Captured:
    graph: Any
    inputs: torch.Tensor
    outputs: Any


def copied_out(outputs: Any) -> Any:
    """`outputs` (a tensor, or a dataclass, tuple, list or dict of them) with every tensor
    cloned: queued on the current stream after the replay that wrote them."""
    if isinstance(outputs, torch.Tensor):
        return outputs.clone()
    if dataclasses.is_dataclass(outputs) and not isinstance(outputs, type):
        return dataclasses.replace(outputs, **{f.name: copied_out(getattr(outputs, f.name))
                                               for f in dataclasses.fields(outputs) if f.init})
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(copied_out(x) for x in outputs)
    if isinstance(outputs, dict):
        return {k: copied_out(v) for k, v in outputs.items()}
    return outputs


class ChunkGraphs:
    """Shape-keyed graphs of one function `fn(static_inputs) -> outputs` on one stream."""

    def __init__(self, api: GraphAPI, *, max_graphs: int = 48) -> None:
        self.api, self.max_graphs = api, max_graphs
        self.pool = api.pool()
        # Made at the first capture, on the replica's own thread: inside an SM partition
        # (stages.platform.partition) its captures must be on the partition's streams.
        self.stream: Any = None
        self._graphs: dict[Hashable, _Captured] = {}
        self.disabled: str | None = None  # why capture was switched off, if it was
        self.captures = 0
        self.replays = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def __contains__(self, key: Hashable) -> bool:
        """Whether a run of `key` now would replay (a held graph), not run eagerly."""
        return key in self._graphs

    def invalidate(self) -> None:
        """Drop every graph (their captured addresses are stale), and their memory pool.

        A pool whose graphs were all destroyed must not be captured into again: on an H200
        (torch 2.11) that tripped the allocator's `use_count > 0` assert and then corrupted
        memory. New graphs get a fresh pool. The caller's stream is synchronized first: a decode
        call queues several groups before it copies any back, and a replay still running must
        not lose its graph (or the capture stream's cuBLAS workspace, see above)."""
        self.api.current_stream().synchronize()
        self._graphs.clear()
        self.pool = self.api.pool()

    def run(self, key: Hashable, inputs: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> Any:
        """`fn` on `inputs` (host or device): replayed when `key` was captured, else eager
        (and captured for next time). The returned tensors are the caller's: later runs never
        write to them."""
        entry = self._graphs.get(key)
        if entry is not None:
            entry.inputs.copy_(inputs, non_blocking=True)
            entry.graph.replay()
            self.replays += 1
            return copied_out(entry.outputs)
        if len(self._graphs) >= self.max_graphs:
            # All together, and before the new shape's first run, which makes the capture
            # stream's cuBLAS workspace anew for the graphs to come (see the landmines above).
            log.info("code2wav graphs: %d shapes held, dropping them all for a new one", len(self._graphs))
            self.invalidate()
        return self._eager_then_capture(key, inputs, fn)

    def _static(self, inputs: torch.Tensor) -> torch.Tensor:
        static = torch.empty(inputs.shape, dtype=inputs.dtype, device=self.api.current_stream().device)
        static.copy_(inputs, non_blocking=True)
        return static

    def _eager_then_capture(self, key: Hashable, inputs: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> Any:
        # A new shape's first chunk runs eagerly on the caller's stream (not the capture stream:
        # see the module docstring) and its result is the real one; the capture then records
        # the same function on the same static input without executing it.
        static = self._static(inputs)
        result = fn(static)
        if self.disabled is None:
            self._capture(key, static, fn)
        return result

    def _capture(self, key: Hashable, static: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> _Captured | None:
        graph = self.api.graph()
        if self.stream is None:
            self.stream = self.api.stream()
        self.stream.wait_stream(self.api.current_stream())  # `static` was filled on the caller's
        try:
            with CAPTURE_LOCK, self.api.capture(graph, pool=self.pool, stream=self.stream, **self.api.capture_options):
                outputs = fn(static)
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager
            self.disabled = f"{type(exc).__name__}: {exc}"
            self.invalidate()
            log.warning("code2wav device graphs off for this replica (capture failed: %s); running eager", self.disabled)
            return None
        entry = _Captured(graph, static, outputs)
        self._graphs[key] = entry
        self.captures += 1
        log.debug("code2wav graph captured: %s (%d held)", key, len(self._graphs))
        return entry
