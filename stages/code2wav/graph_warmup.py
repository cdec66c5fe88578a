"""Capturing a replica's chunk graphs before it serves (`Token2Wav.warm_graphs`).

Without it each new batch shape's first chunk pays an eager run plus a capture while requests
wait. Synthetic streams of the default voice (silence codes) decode in lockstep, chunk after
chunk, until their shape repeats: the cache lengths settle at the trim after a few chunks, so
one row count passes through ~3 shapes (first, growing, settled; a shorter first chunk,
`initial_codec_chunk_frames`, is the first shape then). Row counts 1..max_rows are
warmed, up to the slot pool's capacity (growing the pool would drop the graphs again).

With `code2wav_final_chunk_graphs`, one-row final chunks are captured too: at every stage a
stream passes through until its caches settle (its only chunk, after one chunk, ..., settled:
3 stages at full size), one shape per count of new codes a final chunk can bring there
(0..chunk-1), 75 at full size. Only these final shapes go through the graphs while serving
(`Token2Wav.final_shapes`; final chunks that end in one step replay them one row at a time,
launch_plan.py; one dropped with the rest is captured again when it comes back); any other final
chunk runs eagerly, since final shapes of several rows are too many to capture as they come.

    captured = warm_graphs(t2w, max_rows=8)   # through Token2Wav.warm_graphs
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from stages.code2wav.chunk_decode import BatchShape, start_shape
from stages.code2wav.streaming import Chunker, CodecPayload

if TYPE_CHECKING:
    from stages.code2wav.token2wav import Token2Wav

WARMUP_PREFIX = "__graph-warmup-"  # request ids of the synthetic streams
_MAX_CHUNKS = 16  # a stream's shape settles after a few chunks (the cache trim); a bound
# Room the graphs need so that warming does not overflow them (past `max_graphs` the whole set
# is dropped, chunk_graphs.py): shapes a row count passes through (3 at full size, one more
# after a shorter first chunk), plus shapes first met while serving (streams out of lockstep).
_SHAPES_PER_ROW_COUNT = 4
_SPARE_GRAPHS = 8


def warm_graphs(t2w: Token2Wav, max_rows: int) -> int:
    """Capture `t2w`'s chunk graphs for 1..`max_rows` rows (and its settled final chunks when
    the flag says so); returns how many were captured (0 with graphs off, the warmup off, or a
    failed capture, which leaves graphs off as it would while serving)."""
    graphs = t2w.graphs
    if graphs is None or not t2w.options.graph_warmup:
        return 0
    t2w.prompt_setup()
    before = graphs.captures
    width = min(max_rows, t2w.pool.capacity)
    finals = t2w.options.final_chunk_graphs
    per_row_count = _SHAPES_PER_ROW_COUNT + (t2w.cfg.first_chunk_frames < t2w.cfg.codec_chunk_frames)
    # Room for every shape: a row count's stages, and with final graphs one shape per count of
    # new codes at each stage a stream can end in (as many stages as a row count passes through).
    final_room = per_row_count * t2w.cfg.codec_chunk_frames if finals else 0
    graphs.max_graphs = max(graphs.max_graphs, per_row_count * width + final_room + _SPARE_GRAPHS)
    for rows in range(1, width + 1):
        with _streams(t2w, f"{rows}", rows) as chunkers:
            _settle(t2w, chunkers)
        if graphs.disabled is not None:
            return graphs.captures - before
    if finals and width > 0:
        _warm_final_chunks(t2w, width)
    return graphs.captures - before


def _warm_final_chunks(t2w: Token2Wav, width: int) -> None:
    """Streams that end after 0, 1, ... full chunks, up to the first stage whose cache shape
    repeats (settled), each ending with its own count of new codes (every count a final chunk
    there can bring), `width` streams at a time; stops early when capture goes off."""
    seen = set()
    for full_chunks in range(_MAX_CHUNKS):
        counts = list(range(t2w.cfg.chunk_codes(full_chunks)))
        for start in range(0, len(counts), width):
            group = counts[start : start + width]
            with _streams(t2w, f"final-{full_chunks}-{start}", len(group)) as chunkers:
                for _ in range(full_chunks):  # these replay the warmed graphs
                    _lockstep_chunk(t2w, chunkers)
                if full_chunks and start == 0:  # the stage's cache shape (a first chunk's is unique)
                    shape = t2w.stream_shape(chunkers[0].request_id)
                    if shape in seen:
                        return  # settled: the previous stage was this one
                    seen.add(shape)
                for chunker, new in zip(chunkers, group):
                    chunker.push([t2w.cfg.silence_code] * new)  # fewer than a chunk: no payload yet
                    final = chunker.finish()
                    t2w.final_shapes.add(_final_shape(t2w, final, full_chunks))  # so this decode captures it
                    t2w.decode([final])  # one row; frees the stream's slot
            if t2w.graphs.disabled is not None:
                return


def _final_shape(t2w: Token2Wav, final: CodecPayload, full_chunks: int) -> BatchShape:
    """The one-row shape `final` decodes with; a stream's only chunk has no admitted stream yet."""
    if full_chunks:
        return t2w.chunk_shape(final, rows=1)
    start = start_shape(t2w.prompt_setup(final.prompt_id).prompt_len)
    return replace(start, rows=1, tokens=len(final.codes), last=True)


def _lockstep_chunk(t2w: Token2Wav, chunkers: list[Chunker]) -> None:
    """One full chunk of silence codes for every stream, decoded together."""
    t2w.decode([c.push([t2w.cfg.silence_code] * c.chunk_frames)[0] for c in chunkers])


def _settle(t2w: Token2Wav, chunkers: list[Chunker]) -> bool:
    """Decode the streams in lockstep until the next chunk's shape would repeat; False when
    capture went off on the way or the shape never settled."""
    seen = set()
    for _ in range(_MAX_CHUNKS):
        _lockstep_chunk(t2w, chunkers)
        if t2w.graphs.disabled is not None:
            return False
        shape = t2w.stream_shape(chunkers[0].request_id)
        if shape in seen:
            return True
        seen.add(shape)
    return False


@contextmanager
def _streams(t2w: Token2Wav, tag: str, rows: int) -> Iterator[list[Chunker]]:
    """`rows` synthetic streams of the default voice, dropped on the way out whatever happens."""
    chunkers = [Chunker(t2w.cfg, f"{WARMUP_PREFIX}{tag}-{i}") for i in range(rows)]
    try:
        yield chunkers
    finally:
        for c in chunkers:
            t2w.drop(c.request_id)  # a no-op for a stream its final chunk already ended
