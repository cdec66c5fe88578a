"""The stage config: talker + code2wav + runner, one frozen tree loaded from a stage YAML.

    configs/stages/minicpmo45.yaml       real dims (GPU)
    configs/stages/minicpmo45-tiny.yaml  shrunk widths/depths, same vocab/chunking/steps (CPU)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stages.code2wav.config import Code2WavConfig
from stages.talker.config import TalkerConfig


@dataclass(frozen=True)
class RunnerConfig:
    """How the stages are run: device, dtype, batching, replicas, weights."""

    device: Literal["auto", "cuda", "npu", "cpu"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_num_seqs: int = 8  # rows a stage-2 replica batches per step
    talker_max_batch: int = 128  # concurrent requests the talker decodes together
    max_seq_len: int = 4096  # static KV cache length per talker slot
    seed: int = 0  # seeds random weight init (identical in every process and run)
    weights: str | None = None  # official MiniCPM-o 4.5 directory; None -> seeded random init
    torch_threads: int = 0  # 0 = leave torch's default

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.talker_max_batch < 1:
            raise ValueError("runner.max_num_seqs and runner.talker_max_batch must be >= 1")


@dataclass(frozen=True)
class StageConfig:
    talker: TalkerConfig = field(default_factory=TalkerConfig)
    code2wav: Code2WavConfig = field(default_factory=Code2WavConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
