"""Stepwise estimator-attention caches (`StepwiseAttCache`): same bytes as the stack/solve/split
reference, updated in place once saturated, and a decode's transient peak far below one B-row
cache generation (the reference peaks at ~3: stacked input + untrimmed output + split rows).

Tiny config with a wide attention cache (8 heads x 32 dims) so the cache, not HiFT, dominates.
Peaks come from `torch.profiler` memory events (see scripts/decode_memory.py).
"""

from __future__ import annotations

import pytest
import torch

from scripts.decode_memory import peak_bytes
from stages.code2wav.config import DiTConfig
from stages.code2wav.streaming import Chunker
from stages.code2wav.token2wav import Token2Wav
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

WIDE_DIT = DiTConfig(hidden_size=32, depth=2, num_heads=8, head_dim=32)
FIELDS = ("conformer_cnn", "conformer_att", "estimator_cnn", "estimator_att")


def _t2w(stepwise: bool, **kw) -> Token2Wav:
    cfg = tiny_config(**kw)
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True)
    t2w.stepwise_att_cache = stepwise
    return t2w


def _streams(cfg, lengths: list[int]) -> dict[str, list]:
    gen = torch.Generator().manual_seed(7)
    out = {}
    for i, n in enumerate(lengths):
        ch = Chunker(cfg, f"r{i}", seed=i)
        codes = torch.randint(0, cfg.flow.vocab_size, (n,), generator=gen).tolist()
        out[f"r{i}"] = [*ch.push(codes), ch.finish()]
    return out


def test_stepwise_equals_reference_bytes_with_ragged_traffic_and_trim():
    arms = [_t2w(True), _t2w(False)]
    setup = arms[0].prompt_setup()
    setup_att = setup.cache.estimator_att.clone()
    pending = _streams(arms[0].cfg, [150, 40, 120, 95, 10])
    start = {rid: i // 2 for i, rid in enumerate(pending)}
    step, in_place = 0, 0
    while pending:
        batch = [q.pop(0) for rid, q in pending.items() if start[rid] <= step]
        pending = {rid: q for rid, q in pending.items() if q}
        # Held references: identity (not a data_ptr, which malloc may reuse) proves in place.
        before = {rid: s.flow.estimator_att for rid, s in arms[0]._requests.items()}
        outs = [arm.decode(batch) for arm in arms]
        for x, y in zip(*outs):
            assert x.request_id == y.request_id and x.chunk_seq == y.chunk_seq
            assert torch.equal(torch.from_numpy(x.audio), torch.from_numpy(y.audio))
            assert torch.equal(x.mel, y.mel)
        assert arms[0]._requests.keys() == arms[1]._requests.keys()
        for rid, s in arms[0]._requests.items():
            ref = arms[1]._requests[rid].flow
            for f in FIELDS:
                assert torch.equal(getattr(s.flow, f), getattr(ref, f)), (step, rid, f)
            in_place += before.get(rid) is s.flow.estimator_att
        step += 1
    assert in_place >= 5  # saturated rows were really updated in place
    assert torch.equal(setup.cache.estimator_att, setup_att)  # the shared prompt cache untouched
    assert arms[0].active_requests == 0


def _steady_decode_peak(stepwise: bool, rows: int) -> tuple[int, int]:
    t2w = _t2w(stepwise, dit=WIDE_DIT)
    streams = list(_streams(t2w.cfg, [200] * rows).values())
    for step in range(3):  # chunk 0, growth, first trim: saturated afterwards
        t2w.decode([s[step] for s in streams])
    att = t2w._requests["r0"].flow.estimator_att
    limit = t2w.prompt_setup().prompt_len + t2w.cfg.prompt_keep_frames
    assert att.shape[4] == limit
    peak = peak_bytes(lambda: t2w.decode([s[3] for s in streams]), torch.device("cpu"))
    return peak, att.numel() * att.element_size()


def test_steady_decode_peak_is_a_fraction_of_one_cache_generation():
    rows = 2
    peak, per_request = _steady_decode_peak(True, rows)
    generation = rows * per_request  # the B rows' estimator_att, live before the call anyway
    # One step buffer is generation * (L + T) / (n_t * L) ~ 0.11; the rest is activations.
    assert peak < 0.5 * generation, (peak, generation)


def test_reference_path_peaks_above_one_and_a_half_generations():
    """What the bound above guards against: untrimmed B-row output + split rows (~2.1
    generations; the stacked input is dropped after the solve, else ~3.1)."""
    rows = 2
    peak, per_request = _steady_decode_peak(False, rows)
    assert peak > 1.5 * rows * per_request, (peak, rows * per_request)


@pytest.mark.gpu
def test_cuda_stepwise_equals_reference_and_peak_is_below_one_generation():
    if not torch.cuda.is_available():
        pytest.skip("requires a CUDA device")
    device = torch.device("cuda")
    cfg = tiny_config(dit=WIDE_DIT)
    arms = []
    for stepwise in (True, False):
        t2w = Token2Wav(cfg, device=device, dtype=torch.float32, init_seed=0, keep_mel=True)
        t2w.stepwise_att_cache = stepwise
        arms.append(t2w)
    streams = list(_streams(cfg, [200] * 4).values())
    peaks = []
    for step in range(4):
        batch = [s[step] for s in streams]
        outs = []
        for arm in arms:
            box = []
            peaks.append(peak_bytes(lambda arm=arm, b=batch, box=box: box.append(arm.decode(b)), device))
            outs.append(box[0])
        for x, y in zip(*outs):
            assert torch.equal(torch.from_numpy(x.audio), torch.from_numpy(y.audio))
            assert torch.equal(x.mel, y.mel)
    for rid, s in arms[0]._requests.items():
        for f in FIELDS:
            assert torch.equal(getattr(s.flow, f), getattr(arms[1]._requests[rid].flow, f))
    att = arms[0]._requests["r0"].flow.estimator_att
    generation = 4 * att.numel() * att.element_size()
    stepwise_peak, reference_peak = peaks[-2], peaks[-1]  # the saturated step
    assert stepwise_peak < 0.5 * generation < reference_peak, (stepwise_peak, reference_peak)
