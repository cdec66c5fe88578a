"""Building the stages a profile measures: in this process, seeded random weights, sized to
the workload rather than to serving.

The talker gets as many slots as the largest B and as many cache positions as the profiled
steps need, not `runner.max_seq_len`: at 128 slots a full-length cache is 15 GiB in fp32, CPU
RAM included. Both stages are eager (the talker's decode and prefill graphs off, Token2Wav's
`graphs = None`): a replayed device graph is one launch with no profiler ranges inside, and what
a profile accounts for is the launches and the components' device time. (Under torch 2.11 the
kernels of a talker graph replayed inside the talker's range were attached to no operator, and
its device-ms row read 0.47 ms for a 5-9 ms step: `results/h200/profile_fused_layers_128x8.md`.)

    place = placement(stages.runner)   # runner.device / runner.dtype, resolved once
    talker = build_talker(stages, place, rows=8, text=profile_text(0), chunks=3)
    t2w = build_code2wav(stages, place)
    prepare_prompt(t2w)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from stages.code2wav.token2wav import Token2Wav
from stages.config import RunnerConfig, StageConfig
from stages.platform import dtype_from_name, resolve_device
from stages.profiling.talker_step import talker_cache_len, talker_positions
from stages.talker.engine import TalkerEngine
from stages.talker.options import DECODE_GRAPH_FLAG, PREFILL_GRAPH_FLAG


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype


def placement(runner: RunnerConfig) -> Placement:
    """`runner.device` / `runner.dtype` as torch objects (raises PlatformError like the runner)."""
    return Placement(resolve_device(runner.device), dtype_from_name(runner.dtype))


def build_talker(
    stages: StageConfig, place: Placement, *, rows: int, text: str, chunks: int
) -> TalkerEngine:
    """An eager talker engine (decode and prefill graphs off, whatever the config says) with
    `rows` slots (seed `runner.seed`), its cache sized to profiling `text` for `chunks` steps.
    The config's other stage flags (fused layers, prelude) stay: they are what arms compare."""
    positions = talker_positions(text, chunks)
    eager = {**stages.talker.extra, DECODE_GRAPH_FLAG: False, PREFILL_GRAPH_FLAG: False}
    return TalkerEngine(
        dataclasses.replace(stages.talker, extra=eager), device=place.device, dtype=place.dtype, max_batch=rows,
        max_seq_len=talker_cache_len(positions, stages.runner.max_seq_len),
        init_seed=stages.runner.seed,
    )  # fmt: skip


def build_code2wav(stages: StageConfig, place: Placement) -> Token2Wav:
    """An eager Token2Wav (seed `runner.seed`)."""
    t2w = Token2Wav(stages.code2wav, device=place.device, dtype=place.dtype, init_seed=stages.runner.seed)
    t2w.graphs = None  # a graph replay would hide the ranges and launches a profile counts
    return t2w


def prepare_prompt(t2w: Token2Wav) -> None:
    """Compute the default prompt's caches once, before any B: every profiled stream starts
    from them, and no B's timings should carry that cost."""
    t2w.prompt_setup()
