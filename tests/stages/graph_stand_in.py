"""CPU stand-ins for code2wav's device graphs, and the traffic and checks the graph tests share."""

from __future__ import annotations

import torch

from stages.code2wav.chunk_graphs import ChunkGraphs
from stages.code2wav.token2wav import Token2Wav
from tests.stages.code2wav_tiny import streams_of


class ReplayingGraphs(ChunkGraphs):
    """ChunkGraphs whose 'graph' re-runs the captured Python function on replay (CPU stand-in):
    checks the bookkeeping around real graphs (static inputs, outputs, invalidation)."""

    def __init__(self) -> None:
        self._graphs = {}
        self.disabled = None
        self.captures = self.replays = 0
        self.max_graphs = 48

    def invalidate(self) -> None:
        self._graphs.clear()

    def run(self, key, inputs, fn):
        entry = self._graphs.get(key)
        if entry is not None:
            static, fn0 = entry
            static.copy_(inputs)
            self.replays += 1
            return fn0(static)
        static = inputs.clone()
        out = fn(static)
        self._graphs[key] = (static, fn)
        self.captures += 1
        return out


def lockstep(streams):
    """Streams started together: every step has one chunk of each live stream."""
    for step in range(max(len(s) for s in streams)):
        yield [s[step] for s in streams if step < len(s)]


def final_graph_shapes(graphs) -> set:
    return {key for key in graphs._graphs if key.last}


def check_streams_replay_their_final_chunks(warm: Token2Wav, eager: Token2Wav) -> None:
    """Streams that end at every stage (their only chunk, after one chunk, settled) with 0, 7
    and chunk-1 new codes, one at a time, through a warmed replica and an eager twin: every
    chunk replays, the final one included, nothing is captured, and audio and mel are equal bit
    for bit."""
    chunk, captures = warm.cfg.codec_chunk_frames, warm.graphs.captures
    for full_chunks in (0, 1, 6):
        for new in (0, 7, chunk - 1):
            length = full_chunks * chunk + new
            (stream,) = streams_of(warm.cfg, [length], seed=length)
            assert len(stream) == full_chunks + 1
            replays = warm.graphs.replays
            for payload in stream:
                (x,) = warm.decode([payload])
                (y,) = eager.decode([payload])
                assert torch.equal(torch.from_numpy(x.audio), torch.from_numpy(y.audio)), (length, payload.chunk_seq)
                assert torch.equal(x.mel, y.mel)
            assert warm.graphs.replays - replays == len(stream), length
    assert warm.graphs.captures == captures and warm.active_requests == 0
