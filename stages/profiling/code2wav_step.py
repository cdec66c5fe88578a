"""The code2wav workload of `tts-bench profile`: one decode of B streams' steady payloads.

It runs on an eager Token2Wav (`build.build_code2wav`). Streams are fed their first chunks untimed until the flow caches reach their
steady (trimmed) shape, so every profiled call sees the same payload and cache shapes; decode
mutates per-stream state, so each profiled call decodes the *next* prepared chunk.

    t2w = build_code2wav(stages, place)
    prepare_prompt(t2w)
    m = measure_code2wav_step(t2w, 8, chunks=3, tag="base")   # DECODE_RANGE + components
"""

from __future__ import annotations

import math

import torch
from torch.profiler import record_function

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.streaming import Chunker, CodecPayload
from stages.code2wav.token2wav import Token2Wav
from stages.profiling.launches import WARMUP, Measured, measure
from stages.profiling.ranges import DECODE_RANGE, RANGES


def steady_start(cfg: Code2WavConfig) -> int:
    """Chunks fed before the cache shapes stop changing: the estimator/conformer caches grow by
    one chunk of mel frames per chunk (the first by its own, maybe shorter, length) until they
    hold prompt + keep frames, then get trimmed."""
    after_first = max(0, cfg.prompt_keep_frames - cfg.first_chunk_frames * cfg.flow.up_rate)
    return 1 + math.ceil(after_first / cfg.chunk_mel_frames)


def prepare_streams(cfg: Code2WavConfig, rows: int, chunks: int, tag: str) -> list[list[CodecPayload]]:
    """`rows` streams of `chunks` full payloads each, from seeded random codes."""
    gen = torch.Generator().manual_seed(rows)
    streams = []
    for r in range(rows):
        chunker = Chunker(cfg, f"profile-{tag}-{rows}-{r}", seed=r)
        n = cfg.first_chunk_frames + (chunks - 1) * cfg.codec_chunk_frames
        payloads = chunker.push(torch.randint(0, cfg.flow.vocab_size, (n,), generator=gen).tolist())
        assert len(payloads) == chunks, "one payload per chunk of codes"
        streams.append(payloads)
    return streams


def measure_code2wav_step(t2w: Token2Wav, rows: int, chunks: int, *, tag: str = "") -> Measured:
    """Launches and range times (DECODE_RANGE + COMPONENT_RANGES) of one code2wav decode of
    `rows` streams' steady payloads."""
    start = steady_start(t2w.cfg)
    streams = prepare_streams(t2w.cfg, rows, start + WARMUP + chunks, tag)
    step = iter(range(len(streams[0])))

    def decode_next() -> None:
        i = next(step)
        with record_function(DECODE_RANGE):
            t2w.decode([s[i] for s in streams])

    for _ in range(start):
        decode_next()
    try:
        return measure(decode_next, device=t2w.device, repeats=chunks, warmup=WARMUP,
                       ranges=RANGES["code2wav_step"])  # fmt: skip
    finally:
        for s in streams:
            t2w.drop(s[0].request_id)
