"""Final chunks through code2wav's device graphs (`code2wav_final_chunk_graphs`): warmed one-row
shapes, replayed while serving one row at a time, captured again after a drop; the launch order
of a decode call (replays before eager groups). CPU, with the replaying stand-in graphs."""

from __future__ import annotations

import pytest
import torch

from stages.code2wav.token2wav import Token2Wav
from tests.stages.code2wav_tiny import single_thread, staggered, streams_of, tiny_config  # noqa: F401
from tests.stages.graph_stand_in import (
    ReplayingGraphs,
    check_streams_replay_their_final_chunks,
    final_graph_shapes,
    lockstep,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def test_final_chunk_graphs_warm_one_shape_per_stage_and_new_code_count_and_replay_while_serving():
    on = tiny_config(extra={"code2wav_final_chunk_graphs": True})
    warm = Token2Wav(on, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True, slots=4)
    steady = Token2Wav(tiny_config(extra={"code2wav_final_chunk_graphs": False}), device=torch.device("cpu"),
                       dtype=torch.float32, init_seed=0, slots=4)
    eager = Token2Wav(tiny_config(extra={"code2wav_device_graph": False}), device=torch.device("cpu"),
                      dtype=torch.float32, init_seed=0, keep_mel=True, slots=4)
    warm.graphs, steady.graphs = ReplayingGraphs(), ReplayingGraphs()
    chunk = on.codec_chunk_frames
    warm.warm_graphs(3)
    steady.warm_graphs(3)
    finals = final_graph_shapes(warm.graphs)
    # Three stages a stream can end in (its only chunk, after one chunk, settled), each with
    # 0..chunk-1 new codes: a stage is the cache shape the final chunk decodes from.
    stages = {(k.conformer_len, k.estimator_len, k.hift_frames, k.tail_samples) for k in finals}
    assert len(stages) == 3 and len(finals) == 3 * chunk and warm.graphs.captures - steady.graphs.captures == 3 * chunk
    assert min(hift for _, _, hift, _ in stages) == 0  # a stream's only chunk: no vocoder frames yet
    for stage in stages:
        tokens = {k.tokens for k in finals if (k.conformer_len, k.estimator_len, k.hift_frames, k.tail_samples) == stage}
        assert tokens == {on.codec_left_context_frames + n for n in range(chunk)}, stage
    assert {k.rows for k in finals} == {1} and not final_graph_shapes(steady.graphs)
    assert warm.final_shapes == finals and not steady.final_shapes
    assert warm.active_requests == 0 and warm.pool.in_use == 0
    check_streams_replay_their_final_chunks(warm, eager)


def test_a_final_chunk_without_a_warmed_graph_runs_eagerly_and_is_never_captured():
    for extra in ({"code2wav_final_chunk_graphs": True}, {"code2wav_final_chunk_graphs": False}):
        t2w = Token2Wav(tiny_config(extra=extra), device=torch.device("cpu"), dtype=torch.float32, init_seed=0,
                        slots=2)
        t2w.graphs = ReplayingGraphs()
        # 130, 60 and 75 codes end in steps 5, 2 and 4 of the staggered traffic: three final groups
        for batch in staggered(streams_of(t2w.cfg, [130, 60, 75], seed=3)):
            t2w.decode(batch)
        assert t2w.graphs.captures > 0 and not final_graph_shapes(t2w.graphs) and not t2w.final_shapes, extra
        # every non-final group replayed or was captured; what is left ran eagerly: the finals
        assert t2w.work()["groups"] - t2w.graphs.replays - t2w.graphs.captures == 3, extra


def test_warmed_final_shapes_are_captured_again_after_the_graphs_are_dropped():
    cfg = tiny_config(extra={"code2wav_final_chunk_graphs": True})
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, slots=2)
    t2w.graphs = ReplayingGraphs()
    t2w.warm_graphs(2)
    warmed = set(t2w.final_shapes)
    *steps, last = lockstep(streams_of(cfg, [60, 60, 60], seed=5))  # three live requests: the pool grows
    for batch in steps:
        t2w.decode(batch)
    assert t2w.pool.capacity > 2 and not final_graph_shapes(t2w.graphs) and t2w.final_shapes == warmed
    # Three settled final chunks of one length: one row at a time, the first captured again.
    assert len({t2w.chunk_shape(p, rows=1) for p in last} & warmed) == 1 and all(p.last_chunk for p in last)
    captures, replays = t2w.graphs.captures, t2w.graphs.replays
    t2w.decode(last)
    assert (t2w.graphs.captures - captures, t2w.graphs.replays - replays) == (1, 2)
    assert len(final_graph_shapes(t2w.graphs)) == 1 and t2w.work()["eager_final_groups"] == 0
    length = 6 * cfg.codec_chunk_frames + 7
    (first,) = streams_of(cfg, [length], seed=1)
    captures = t2w.graphs.captures
    for payload in first:
        t2w.decode([payload])
    assert t2w.graphs.captures > captures and len(final_graph_shapes(t2w.graphs)) == 2  # its own length, captured again
    (second,) = streams_of(cfg, [length], seed=2)
    replays = t2w.graphs.replays
    for payload in second:
        t2w.decode([payload])
    assert t2w.graphs.replays - replays == len(second)  # its final chunk included


def test_warmed_final_groups_run_row_by_row_and_replays_are_queued_before_eager_groups():
    """Lockstep streams that end together: their 3-row final group runs as three one-row
    replays (no eager final group), the audio bit for bit an eager twin's that splits the same
    way; in the decode call where they end beside four new streams' first chunks (a 4-row shape
    the warmup did not capture, so it runs eagerly), every replay is launched before the eager
    group, and the output keeps the input's order."""
    cfg = tiny_config(extra={"code2wav_final_chunk_graphs": True})
    warm = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True, slots=8)
    eager = Token2Wav(tiny_config(extra={"code2wav_device_graph": False}), device=torch.device("cpu"),
                      dtype=torch.float32, init_seed=0, keep_mel=True, slots=8)
    warm.graphs = ReplayingGraphs()
    warm.warm_graphs(3)
    eager.final_shapes = set(warm.final_shapes)  # the same row-by-row finals, eagerly
    chunk = cfg.codec_chunk_frames
    streams = streams_of(cfg, [6 * chunk + 7] * 3 + [2 * chunk] * 4, seed=11)
    trio, late = streams[:3], streams[3:]
    steps = list(lockstep(trio))
    end = len(steps) - 1
    steps[end] = [late[0][0], *steps[end][:2], late[1][0], steps[end][2], *(s[0] for s in late[2:])]
    steps += list(lockstep([s[1:] for s in late]))
    launches = _record_launches(warm)
    for n, batch in enumerate(steps):
        launches.clear()
        for p, x, y in zip(batch, warm.decode(batch), eager.decode(batch)):
            assert (x.request_id, x.chunk_seq) == (p.request_id, p.chunk_seq)
            assert torch.equal(torch.from_numpy(x.audio), torch.from_numpy(y.audio)), (x.request_id, x.chunk_seq)
            assert torch.equal(x.mel, y.mel)
        if n == end:
            final_step = list(launches)
    assert warm.work()["eager_final_groups"] == 0
    assert [(s.last, s.rows, replayed) for s, replayed in final_step] == [(True, 1, True)] * 3 + [(False, 4, False)]


def _record_launches(t2w: Token2Wav) -> list:
    """Patch `t2w` to log each group it launches: (shape, whether a graph held it then)."""
    launches, launch = [], t2w._launch_group

    def logged(shape, items, streams):
        launches.append((shape, shape in t2w.graphs and (not shape.last or shape in t2w.final_shapes)))
        return launch(shape, items, streams)

    t2w._launch_group = logged
    return launches
