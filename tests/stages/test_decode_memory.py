"""A steady decode's transient memory: the caches live in the slot pool, so a decode adds only
its activations and one Euler step's attention buffers, a fraction of the B rows' caches.

Tiny config with a wide attention cache (8 heads x 32 dims) so the cache, not HiFT, dominates.
Peaks come from `torch.profiler` memory events (see scripts/decode_memory.py).
"""

from __future__ import annotations

import pytest
import torch

from scripts.decode_memory import measure, peak_bytes
from stages.code2wav.config import DiTConfig
from stages.code2wav.streaming import Chunker
from stages.code2wav.token2wav import Token2Wav
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

WIDE_DIT = DiTConfig(hidden_size=32, depth=2, num_heads=8, head_dim=32)


def test_steady_decode_peak_is_a_fraction_of_the_rows_caches():
    rows = 2
    r = measure(tiny_config(dit=WIDE_DIT), rows=rows, device=torch.device("cpu"))
    # Gathered rows + step buffer ~ 2 x (L + T) / (n_t x L) ~ 0.23 of B x A; the rest is activations.
    assert r["peak_over_B_times_A"] < 0.5, r
    assert r["att_frames"] == 300 + 100  # prompt + keep frames


def test_the_shared_prompt_setup_is_never_written():
    t2w = Token2Wav(tiny_config(), device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    setup = t2w.prompt_setup()
    before = [t.clone() for t in vars(setup.cache).values()]
    gen = torch.Generator().manual_seed(1)
    streams = []
    for r in range(3):
        codes = torch.randint(0, t2w.cfg.flow.vocab_size, (150,), generator=gen).tolist()
        ch = Chunker(t2w.cfg, f"r{r}", seed=r)
        streams.append([*ch.push(codes), ch.finish()])
    for step in range(len(streams[0])):
        t2w.decode([s[step] for s in streams])
    assert all(torch.equal(a, b) for a, b in zip(before, vars(setup.cache).values()))
    assert t2w.active_requests == 0 and t2w.pool.in_use == 0


@pytest.mark.gpu
def test_cuda_steady_decode_peak_is_below_the_rows_caches():
    r = measure(tiny_config(dit=WIDE_DIT), rows=4, device=torch.device("cuda"))
    assert r["peak_over_B_times_A"] < 0.5, r


def test_peak_bytes_sees_an_allocation():
    assert peak_bytes(lambda: torch.empty(1 << 20), torch.device("cpu")) >= 1 << 20
