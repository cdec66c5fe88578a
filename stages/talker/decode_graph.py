"""Device graphs of the talker's decode forward (emb_code -> 20 layers -> head_code logits).

An eager decode step launches ~35 small kernels per layer; at batch sizes where each kernel
takes a few microseconds the step is bound by launches on the host, not by the device. A graph
replays the whole forward in one launch. Sampling stays eager (each request owns a generator,
and requests come and go), so only the forward is captured.

Shapes are fixed per graph, so graphs are keyed by (rows bucket, kv_len): rows rounded up to a
power of two (capped at max_batch; the extra rows are free slots, see below) and kv_len as the
engine already buckets it. Graphs are captured lazily on first use and share one memory pool.
Inputs go through static buffers (`ids`, `pos`); the logits buffer of a graph is overwritten
by its next replay and may be by another graph's (a capture is given the pool blocks earlier
captures freed, which the earlier graphs use for temporaries), so callers queue their reads of
it before the next `run` (code2wav's graphs copy their outputs out instead: chunk_graphs.py).

Landmines:
* Rows R..bucket-1 of a replay are free slots: their position is set to 0, so their dummy write
  lands in their own (unused) cache row -- never in an active request's.
* Warmup before capture runs the same forward on the same inputs as the replay that follows it,
  so its KV-cache writes are exactly the ones the replay makes (no stale garbage).
* The capture must not sync the host: the forward uses only index ops, no `.item()`.
* Nor may capturing sync the device (replicas may be threads of the same process):
  `SideStreamCapture` orders the side stream against the caller's instead.

    graphs = DecodeGraphs(model, graph_api(device), max_batch=64, device=device)
    logits = graphs.run(prev_ids[:R], positions[:R], kv_len)   # [R, V] fp32, a view
"""

from __future__ import annotations

import logging

import torch

from stages.platform.graphs import GraphAPI, SideStreamCapture
from stages.talker.model import TalkerModel

logger = logging.getLogger(__name__)


class DecodeGraphs:
    def __init__(self, model: TalkerModel, api: GraphAPI, *, max_batch: int, device) -> None:
        self.model, self.max_batch = model, max_batch
        self.ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.pos = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.captures = SideStreamCapture(api)  # one pool for every shape
        self.graphs: dict[tuple[int, int], tuple[object, torch.Tensor]] = {}

    def rows_bucket(self, rows: int) -> int:
        return min(self.max_batch, 1 << (rows - 1).bit_length())

    def _forward(self, rows: int, kv_len: int) -> torch.Tensor:
        m = self.model
        hidden = m.decode(m.emb_code[0](self.ids[:rows]), self.pos[:rows], kv_len)
        return m.code_logits(hidden)  # [rows, V] fp32

    def _capture(self, rows: int, kv_len: int) -> tuple[object, torch.Tensor]:
        graph, out = self.captures.capture(lambda: self._forward(rows, kv_len))
        logger.debug("talker decode graph captured: rows=%d kv_len=%d", rows, kv_len)
        return graph, out

    def run(self, ids: torch.Tensor, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """ids, positions: [R] long (row r == slot r) -> logits [R, V] fp32 (graph-owned)."""
        rows = ids.shape[0]
        bucket = self.rows_bucket(rows)
        self.ids[:rows].copy_(ids)
        self.pos[:rows].copy_(positions)
        self.pos[rows:bucket].zero_()  # free slots write at their own position 0
        key = (bucket, kv_len)
        if key not in self.graphs:
            self.graphs[key] = self._capture(bucket, kv_len)
        graph, out = self.graphs[key]
        graph.replay()
        return out[:rows]
