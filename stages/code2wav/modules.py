"""code2wav's two models built as every process builds them: the flow and HiFT, from the
official checkpoint when a weights directory is given, else from seeded random weights that keep
the signal's scale (`random_init`, D-INIT-1). The same seed gives the same weights in every
process and run: construction runs under a private RNG, and the scale-keeping draw has its own
generator.

    flow = build_flow(cfg, seed=0, weights_dir=None)              # CPU, float32
    hift = build_hift(cfg.hift, seed=1, weights_dir=None)         # CPU, float32, weight norm folded
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from stages.code2wav.config import Code2WavConfig, HiFTConfig
from stages.code2wav.flow import FlowModel
from stages.code2wav.hift import HiFTGenerator, fold_weight_norm
from stages.code2wav.hift_weights import find_hift_checkpoint, load_hift
from stages.code2wav.random_init import init_flow_, init_hift_
from stages.code2wav.weights import load_flow_weights

T = TypeVar("T")


def seeded(seed: int, build: Callable[[], T]) -> T:
    """Build modules under a private RNG seed so every process gets identical weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def build_flow(cfg: Code2WavConfig, *, seed: int, weights_dir: str | None) -> FlowModel:
    """The flow on the CPU in float32: the checkpoint's weights, or scale-keeping random ones."""
    flow = seeded(seed, lambda: FlowModel(cfg))
    if weights_dir is not None:
        load_flow_weights(flow, weights_dir)
    else:
        init_flow_(flow, seed=seed)
    return flow


def build_hift(cfg: HiFTConfig, *, seed: int, weights_dir: str | None) -> HiFTGenerator:
    """HiFT on the CPU in float32 with its weight norm folded (bit-identical outputs, fewer ops):
    the checkpoint's weights, or scale-keeping random ones (drawn after folding)."""
    hift = seeded(seed, lambda: HiFTGenerator(cfg))
    if weights_dir is not None:
        load_hift(hift, find_hift_checkpoint(weights_dir))
    fold_weight_norm(hift)
    if weights_dir is None:
        init_hift_(hift, seed=seed)
    return hift
