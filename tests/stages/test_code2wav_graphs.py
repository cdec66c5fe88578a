"""Whole-chunk device graphs of code2wav (`ChunkGraphs`, `Token2Wav` with `code2wav_device_graph`).

On the CPU a stand-in graph API records the captured function and re-runs it on replay, so the
bookkeeping (first chunk eager, replays after, static inputs refreshed, stale graphs dropped
when the slot pool grows, the capture-failure latch) is tested everywhere. On CUDA, replay must
equal eager bit for bit for the same batch composition (torch.equal on audio, mel and state).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass, field

import pytest
import torch

from stages.code2wav.chunk_graphs import ChunkGraphs, copied_out
from stages.code2wav.token2wav import Token2Wav
from stages.platform.graphs import GraphAPI
from tests.stages.code2wav_tiny import assert_same_run, single_thread, staggered, streams_of, tiny_config  # noqa: F401
from tests.stages.graph_stand_in import ReplayingGraphs, check_streams_replay_their_final_chunks, lockstep

pytestmark = pytest.mark.usefixtures("single_thread")


class _Stream:
    device = torch.device("cpu")
    syncs = 0

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        type(self).syncs += 1


@dataclass
class _FakeGraph:
    """Captures the function called under `capture` and runs it again on `replay`."""

    replays: int = 0
    fn: object = None

    def replay(self) -> None:
        self.replays += 1
        self.fn()


@dataclass
class _FakeAPI:
    fail: bool = False
    graphs: list = field(default_factory=list)
    pending: object = None  # what the function under capture registers as its replay

    def api(self) -> GraphAPI:
        return GraphAPI(
            platform="fake", graph=self._graph, capture=self._capture, pool=lambda: None,
            stream=_Stream, use_stream=lambda s: contextlib.nullcontext(), current_stream=_Stream,
        )  # fmt: skip

    def _graph(self) -> _FakeGraph:
        g = _FakeGraph()
        self.graphs.append(g)
        return g

    @contextlib.contextmanager
    def _capture(self, graph: _FakeGraph, pool=None, stream=None):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        yield
        graph.fn = self.pending


def test_first_call_runs_eagerly_then_replays_with_fresh_inputs():
    fake = _FakeAPI()
    graphs = ChunkGraphs(fake.api())
    calls = []

    def fn(x):  # like a captured kernel: reads the static input, writes its own output
        calls.append(x.clone())
        out = x * 2
        fake.pending = lambda: out.copy_(x * 2)
        return out

    first = graphs.run("k", torch.tensor([1, 2]), fn)
    assert first.tolist() == [2, 4] and graphs.captures == 1 and graphs.replays == 0
    second = graphs.run("k", torch.tensor([5, 6]), fn)
    assert second.tolist() == [10, 12] and graphs.replays == 1
    assert len(calls) == 2  # one eager run + one capture; replays call no Python function


def test_a_replayed_result_survives_the_replays_of_other_shapes_queued_after_it():
    """Graphs of one pool may keep their temporaries where another graph's outputs lie (the
    allocator hands a capture what earlier captures freed). Modelled here: every graph's output
    is one shared buffer. A decode call queues all its groups before reading any back, so what
    `run` returns must already be out of the graph."""
    fake = _FakeAPI()
    graphs = ChunkGraphs(fake.api())
    shared = torch.zeros(2)

    def fn(offset):
        def body(x):
            fake.pending = lambda: shared.copy_(x + offset)
            return shared.copy_(x + offset)
        return body

    graphs.run("a", torch.tensor([0.0, 0.0]), fn(1))
    graphs.run("b", torch.tensor([0.0, 0.0]), fn(100))
    a = graphs.run("a", torch.tensor([1.0, 2.0]), fn(1))  # replayed, then b's replay queued after it
    b = graphs.run("b", torch.tensor([3.0, 4.0]), fn(100))
    assert graphs.replays == 2
    assert a.tolist() == [2.0, 3.0] and b.tolist() == [103.0, 104.0]


def test_copied_out_copies_every_tensor_of_a_nested_result():
    @dataclass
    class Out:
        audio: torch.Tensor
        parts: tuple
        extra: dict

    src = Out(torch.ones(2), (torch.zeros(1), 3), {"m": torch.full((1,), 5.0)})
    out = copied_out(src)
    src.audio.add_(1), src.parts[0].add_(1), src.extra["m"].add_(1)
    assert out.audio.tolist() == [1.0, 1.0] and out.parts[0].tolist() == [0.0] and out.parts[1] == 3
    assert out.extra["m"].tolist() == [5.0] and type(out) is Out


def test_capture_failure_keeps_the_eager_result_and_switches_graphs_off():
    fake = _FakeAPI(fail=True)
    graphs = ChunkGraphs(fake.api())
    out = graphs.run("k", torch.tensor([3]), lambda x: x + 1)
    assert out.tolist() == [4] and graphs.disabled and "capturing" in graphs.disabled
    again = graphs.run("k", torch.tensor([7]), lambda x: x + 1)
    assert again.tolist() == [8] and len(graphs) == 0  # eager from now on


def test_past_the_limit_every_graph_is_dropped_before_the_new_shape_runs():
    """Never one graph at a time: destroying one clears the cuBLAS workspace of the capture
    stream that the others still use (pytorch/pytorch#193402)."""
    fake = _FakeAPI()
    graphs = ChunkGraphs(fake.api(), max_graphs=2)
    held_when_called = []

    def fn(x):
        held_when_called.append(len(graphs))
        fake.pending = lambda: None
        return x

    syncs = _Stream.syncs
    for key in ("a", "b", "a", "c", "b"):
        graphs.run(key, torch.tensor([1]), fn)
    assert list(graphs._graphs) == ["c", "b"]
    # the caller's stream was synchronized before the drop: a replay queued earlier in the same
    # decode call (groups are copied back only after all are queued) must finish first
    assert _Stream.syncs == syncs + 1
    # eager run + capture per new shape: "c" ran with nothing held (a and b dropped first)
    assert held_when_called == [0, 0, 1, 1, 0, 0, 1, 1]
    assert graphs.captures == 4 and graphs.replays == 1


class _RecordingStream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.device = name, log, torch.device("cpu")

    def wait_stream(self, other) -> None:
        self.log.append((self.name, "waits for", other.name))


def test_a_new_shape_runs_on_the_callers_stream_and_only_the_capture_uses_the_side_stream():
    """A first run on the capture stream faulted on a contended H200; nothing may execute there
    (see the module docstring). The capture itself waits for the caller's work first."""
    log: list = []
    caller, side = _RecordingStream("caller", log), _RecordingStream("side", log)

    @contextlib.contextmanager
    def use_stream(stream):
        log.append(("use", stream.name))
        yield

    @contextlib.contextmanager
    def capture(graph, pool=None, stream=None):
        log.append(("capture on", stream.name))
        yield

    api = GraphAPI(platform="fake", graph=_FakeGraph, capture=capture, pool=lambda: None,
                   stream=lambda: side, use_stream=use_stream, current_stream=lambda: caller)
    graphs = ChunkGraphs(api)

    def fn(x):
        log.append("runs")
        return x + 1

    assert graphs.run("k", torch.tensor([1]), fn).tolist() == [2]
    assert log == ["runs", ("side", "waits for", "caller"), ("capture on", "side"), "runs"]
    assert graphs.captures == 1


def test_a_first_run_that_raises_captures_nothing():
    fake = _FakeAPI()
    graphs = ChunkGraphs(fake.api())

    def fn(x):
        raise RuntimeError("GET was unable to find an engine to execute this computation")

    with pytest.raises(RuntimeError, match="engine"):
        graphs.run("k", torch.tensor([1]), fn)
    assert len(graphs) == 0 and graphs.captures == 0 and graphs.disabled is None and not fake.graphs


TINY_TRAFFIC = [300, 60, 260, 30, 300, 75]  # the tiny CUDA test's stream lengths, in codes


def test_tiny_cuda_traffic_replays_graphs_with_the_stand_in_on_cpu():
    """The CUDA test's traffic must repeat shapes, or it would test capture without replay."""
    cfg = tiny_config()
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    t2w.graphs = ReplayingGraphs()
    for batch in staggered(streams_of(cfg, TINY_TRAFFIC)):
        t2w.decode(batch)
    assert t2w.graphs.captures >= 5 and t2w.graphs.replays >= 5


def test_replayed_chunks_equal_eager_with_the_stand_in_graphs_on_cpu():
    cfg = tiny_config(extra={"code2wav_device_graph": True})
    on = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True)
    off = Token2Wav(tiny_config(extra={"code2wav_device_graph": False}), device=torch.device("cpu"),
                    dtype=torch.float32, init_seed=0, keep_mel=True)
    assert on.graphs is None and off.graphs is None  # no graph API on the CPU
    on.graphs = ReplayingGraphs()
    streams = streams_of(cfg, [130, 60, 110, 30, 80])
    assert_same_run(on, off, streams)
    assert on.graphs.replays > 0 and on.graphs.captures > 0
    assert on.active_requests == off.active_requests == 0


def test_pool_growth_drops_captured_graphs():
    cfg = tiny_config()
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, slots=1)
    t2w.graphs = ReplayingGraphs()
    a, b = streams_of(cfg, [60, 60])
    t2w.decode([a[0]])
    t2w.decode([a[1]])
    assert len(t2w.graphs) == 2
    generation = t2w.pool.generation
    t2w.decode([a[2], b[0]])  # a second live request: the 1-slot pool doubles
    assert t2w.pool.generation == generation + 1 and t2w.pool.capacity == 2
    assert len(t2w.graphs) == 1  # only the graph captured after the growth


@pytest.mark.parametrize("initial", [0, pytest.param(10, marks=pytest.mark.slow)], ids=["full-first-chunk", "initial-chunk-10"])
def test_warmup_captures_every_steady_shape_solockstep_traffic_only_replays(initial):
    cfg = tiny_config(initial_codec_chunk_frames=initial)
    warm = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True, slots=4)
    cold = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True, slots=4)
    warm.graphs = ReplayingGraphs()
    captured = warm.warm_graphs(3)
    # each row count passes through its first, growing and settled shapes (at least two)
    assert captured == warm.graphs.captures and captured >= 2 * 3
    assert warm.active_requests == 0 and warm.pool.in_use == 0
    # warmed final chunks (D-GRAPH-6) replay one row at a time: the eager twin decodes them so too
    assert warm.final_shapes
    cold.final_shapes = set(warm.final_shapes)
    for rows in (1, 3, 2):
        streams = streams_of(cfg, [140] * rows, seed=rows)
        for batch in lockstep(streams):
            for x, y in zip(warm.decode(batch), cold.decode(batch)):  # the synthetic streams left no trace
                assert torch.equal(torch.from_numpy(x.audio), torch.from_numpy(y.audio)), (rows, x.chunk_seq)
                assert torch.equal(x.mel, y.mel)
    assert warm.graphs.captures == captured and warm.graphs.replays > 0


def test_warmup_does_nothing_when_switched_off_or_without_graphs():
    cfg = tiny_config(extra={"code2wav_graph_warmup": "false"})
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    assert t2w.warm_graphs(4) == 0  # no graphs on a CPU
    t2w.graphs = ReplayingGraphs()
    assert t2w.warm_graphs(4) == 0 and t2w.graphs.captures == 0 and t2w.pool is None


def test_warmup_skips_row_counts_the_pool_cannot_hold_without_growing():
    cfg = tiny_config()
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, slots=2)
    t2w.graphs = ReplayingGraphs()
    t2w.prompt_setup()
    generation = t2w.pool.generation
    t2w.warm_graphs(5)
    assert t2w.pool.capacity == 2 and t2w.pool.generation == generation
    assert {key.rows for key in t2w.graphs._graphs} == {1, 2}


# ---- CUDA ------------------------------------------------------------------------------------


def _cuda_pair(cfg, slots: int = 1):
    extra_off = {**cfg.extra, "code2wav_device_graph": False}
    from dataclasses import replace

    dev = torch.device("cuda")
    on = Token2Wav(replace(cfg, extra={**cfg.extra, "code2wav_device_graph": True}), device=dev,
                   dtype=torch.float32, init_seed=0, keep_mel=True, slots=slots)
    off = Token2Wav(replace(cfg, extra=extra_off), device=dev, dtype=torch.float32, init_seed=0, keep_mel=True,
                    slots=slots)
    return on, off


@pytest.mark.gpu
@pytest.mark.usefixtures("deterministic")
def test_cuda_graph_replay_equals_eager_bit_for_bit_tiny():
    on, off = _cuda_pair(tiny_config())
    assert on.graphs is not None and off.graphs is None
    # Long streams reach the steady shape together, so some shapes repeat (replays); the short
    # ones mix first, growing and last chunks into the batches (captures of many shapes).
    assert_same_run(on, off, streams_of(on.cfg, TINY_TRAFFIC))
    assert on.graphs.disabled is None and on.graphs.replays > 0


@pytest.mark.gpu
@pytest.mark.usefixtures("deterministic")
@pytest.mark.parametrize("finals", [False, True], ids=["warmed", "warmed-finals"])
def test_cuda_warmed_graphs_equal_eager_bit_for_bit_tiny(finals):
    """Graphs captured before serving, replayed in decode calls that queue several groups before
    reading any back: on an H200 this failed (5 of 46 chunks) until a replay's outputs were
    copied out of the graph's pool (ChunkGraphs.run)."""
    on, off = _cuda_pair(tiny_config(extra={"code2wav_final_chunk_graphs": finals}), slots=6)
    # three stages a stream can end in (only chunk, after one chunk, settled) x new-code counts
    finals_count = 3 * on.cfg.codec_chunk_frames if finals else 0
    assert on.warm_graphs(3) > finals_count and on.graphs.disabled is None
    assert len(on.final_shapes) == finals_count
    off.final_shapes = set(on.final_shapes)  # warmed finals run row by row: the same batches eagerly
    if finals:
        check_streams_replay_their_final_chunks(on, off)
    # Staggered traffic: decode calls that mix first, settled and final groups, warmed or not.
    replays = on.graphs.replays
    assert_same_run(on, off, streams_of(on.cfg, TINY_TRAFFIC), pools=False)
    assert on.graphs.disabled is None and on.graphs.replays > replays


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.usefixtures("deterministic")
def test_cuda_graph_replay_equals_eager_bit_for_bit_full_size():
    from stages.code2wav.config import Code2WavConfig

    on, off = _cuda_pair(Code2WavConfig())
    assert_same_run(on, off, streams_of(on.cfg, [150, 150, 150, 150, 100, 40]))
    assert on.graphs.disabled is None and on.graphs.replays > 0


def test_the_capture_stream_is_made_at_the_first_capture_on_the_capturing_thread():
    """Token2Wav is built on the host's thread, its replica serves on another; inside an SM
    partition only streams made on the serving thread run on the partition's SMs."""
    made = []

    def stream():
        made.append(threading.current_thread().name)
        return _Stream()

    fake = _FakeAPI()
    api = dataclasses.replace(fake.api(), stream=stream)
    graphs = ChunkGraphs(api)
    assert made == []
    worker = threading.Thread(target=lambda: graphs.run("k", torch.tensor([1]), lambda x: x + 1), name="replica")
    worker.start()
    worker.join()
    graphs.run("k2", torch.tensor([1]), lambda x: x + 1)
    assert made == ["replica"]  # one capture stream, made by the first capture's thread
