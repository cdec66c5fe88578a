"""Device graphs of the talker's prefill forward (a request's condition rows -> 20 layers).

Admitting a request runs its prefill: ~35 kernels a layer, ~700 launches, one request at a
time. On an H200 at 128x8 that was the largest share of the talker's step (51 % of its busy time
with `runner.execution: single`, where eight replica threads share the interpreter lock, and
27 % as a process of its own; D-GRAPH-3). A replay is one launch, and it lets go of
the interpreter lock while it queues.

Shapes are fixed per graph, so the engine pads every request's condition rows to a length
bucket (`engine.prefill_length`) whether graphs are on or not: the graph and the eager path then
run the same kernels on the same shapes (equal bit for bit), and a request's prefill is a
function of the request alone, never of which requests were admitted with it. Graphs are keyed
by that length, captured lazily on first use and share one memory pool. Inputs go through
static buffers (`x`, `slot`); the returned hidden rows are the graph's and are overwritten by
its next replay, so the engine queues its read of them (the code logits of the last real row)
before it admits the next request.

Landmines (as for decode_graph.py):
* The warmup before a capture writes the KV-cache rows of the slot being admitted, with the
  same values the replay that follows writes; nothing stale is left.
* The slot is a device tensor ([1] long), not an int, so one graph serves every slot; the cache
  write is an index over the flat cache (`KVCache.prefill_rows`), no host sync.

    graphs = PrefillGraphs(model, graph_api(device), max_seq_len=1024, device=device, dtype=dtype)
    hidden = graphs.run(padded_rows, slot_ids[slot:slot + 1])   # [T, D], a view
"""

from __future__ import annotations

import logging

import torch

from stages.platform.graphs import GraphAPI, SideStreamCapture
from stages.talker.model import TalkerModel

logger = logging.getLogger(__name__)


class PrefillGraphs:
    def __init__(self, model: TalkerModel, api: GraphAPI, *, max_seq_len: int, device, dtype) -> None:
        self.model = model
        self.x = torch.zeros(max_seq_len, model.cfg.hidden_size, device=device, dtype=dtype)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.captures = SideStreamCapture(api)  # one pool for every length
        self.graphs: dict[int, tuple[object, torch.Tensor]] = {}

    def _forward(self, length: int) -> torch.Tensor:
        return self.model.prefill_rows(self.x[:length], self.slot)

    def _capture(self, length: int) -> tuple[object, torch.Tensor]:
        graph, out = self.captures.capture(lambda: self._forward(length))
        logger.debug("talker prefill graph captured: length=%d", length)
        return graph, out

    def run(self, x: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """x: [T, D] (padded condition rows), slot: [1] long -> hidden [T, D] (graph-owned)."""
        length = x.shape[0]
        self.x[:length].copy_(x)
        self.slot.copy_(slot)
        if length not in self.graphs:
            self.graphs[length] = self._capture(length)
        graph, out = self.graphs[length]
        graph.replay()
        return out
