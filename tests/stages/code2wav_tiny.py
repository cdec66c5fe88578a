"""Tiny code2wav config for CPU tests: small widths/depths; real vocab, chunking, step count."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from stages.code2wav.config import Code2WavConfig, DiTConfig, FlowEncoderConfig, HiFTConfig


def tiny_config(**overrides) -> Code2WavConfig:
    flow = FlowEncoderConfig(input_size=32, attention_heads=2, linear_units=64, num_blocks=2, num_up_blocks=1)
    dit = DiTConfig(hidden_size=32, depth=2, num_heads=2, head_dim=16)
    hift = HiFTConfig(base_channels=16, f0_predictor_channels=16)
    cfg = Code2WavConfig(flow=flow, dit=dit, hift=hift)
    return replace(cfg, **overrides)


@pytest.fixture(autouse=False)
def single_thread():
    """Run intra-op on one thread: on a shared 2-core box, 2 spinning threads under load are
    10-50x slower than one (measured 0.1 s vs 2-8 s per tiny chunk). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
