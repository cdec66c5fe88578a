"""CFM decoder + DiT: schedule, CFG batch layout, noise indexing, cache order, chunked == masked."""

from __future__ import annotations

import math

import pytest
import torch

from stages.code2wav.cfm import CausalCFM, cosine_t_span
from stages.code2wav.flow_encoder import block_causal_mask
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

MEL_TOL = 1e-5  # fp32, chunked vs one-shot: summation order only


def _cfm(seed: int = 0) -> CausalCFM:
    torch.manual_seed(seed)
    cfm = CausalCFM(tiny_config()).eval()
    cfm.init_noise(seed=seed, device=torch.device("cpu"), dtype=torch.float32)
    return cfm


def _capture_inputs(cfm: CausalCFM) -> list[torch.Tensor]:
    seen = []
    original = cfm.estimator.forward_chunk

    def spy(x_in, t, *args, **kwargs):
        seen.append(x_in.clone())
        return original(x_in, t, *args, **kwargs)

    cfm.estimator.forward_chunk = spy
    return seen


def test_cosine_schedule_endpoints_and_shape():
    span = cosine_t_span(10)
    assert len(span) == 11 and span[0] == 0.0 and abs(span[-1] - 1.0) < 1e-12
    assert span[3] == 1 - math.cos(0.3 * math.pi / 2)
    assert all(b > a for a, b in zip(span, span[1:]))


def test_cfg_batch_is_cond_rows_then_uncond_rows_with_zeroed_conditioning():
    cfm, b, t = _cfm(), 3, 10
    seen = _capture_inputs(cfm)
    mu, cond = torch.randn(b, 80, t), torch.randn(b, 80, t)
    spk = torch.randn(b, 80)
    with torch.no_grad():
        cfm.solve(mu, spk, cond, cnn_cache=None, att_cache=None)
    assert len(seen) == cfm.cfg.n_timesteps
    x_in = seen[0]
    assert x_in.shape == (2 * b, 320, t)
    x, m, s, c = x_in.split(80, dim=1)
    assert torch.equal(x[:b], x[b:])  # x shared
    assert torch.equal(m[:b], mu) and torch.equal(c[:b], cond)
    assert torch.equal(s[:b], spk[:, :, None].expand(-1, -1, t))
    assert not m[b:].any() and not s[b:].any() and not c[b:].any()


def test_noise_is_seeded_and_indexed_by_cache_length():
    a, b = _cfm(seed=5), _cfm(seed=5)
    assert torch.equal(a.noise, b.noise)
    assert not torch.equal(a.noise, _cfm(seed=6).noise)
    seen = _capture_inputs(a)
    mu = torch.randn(1, 80, 8)
    with torch.no_grad():
        first = a.solve(mu, torch.randn(1, 80), mu, cnn_cache=None, att_cache=None)
        a.solve(mu, torch.randn(1, 80), torch.zeros_like(mu),
                cnn_cache=first.cnn_cache, att_cache=first.att_cache)  # fmt: skip
    assert torch.equal(seen[0][0, :80], a.noise[0, :, 0:8])
    assert torch.equal(seen[a.cfg.n_timesteps][0, :80], a.noise[0, :, 8:16])


def test_estimator_cache_shapes_and_current_first_order():
    cfm, cfg = _cfm(), tiny_config()
    b, t = 2, 6
    mu = torch.randn(b, 80, t)
    with torch.no_grad():
        first = cfm.solve(mu, torch.randn(b, 80), mu, cnn_cache=None, att_cache=None)
        second = cfm.solve(mu, torch.randn(b, 80), mu, cnn_cache=first.cnn_cache, att_cache=first.att_cache)
    d = cfg.dit
    assert first.cnn_cache.shape == (cfg.n_timesteps, d.depth, 2 * b, 2 * d.hidden_size, 2)
    assert first.att_cache.shape == (cfg.n_timesteps, d.depth, 2 * b, d.num_heads, t, 2 * d.head_dim)
    assert second.att_cache.shape[4] == 2 * t
    # new K/V sit in front of the old cache: the tail of the new cache *is* the old cache
    assert torch.equal(second.att_cache[:, :, :, :, t:], first.att_cache)


def test_chunked_solve_equals_block_causal_one_shot():
    cfm = _cfm()
    prompt, chunks = 12, [10, 10, 4]
    total = prompt + sum(chunks)
    torch.manual_seed(2)
    mu, spk = torch.randn(1, 80, total), torch.randn(1, 80)
    cond = torch.zeros(1, 80, total)
    cond[:, :, :prompt] = torch.randn(1, 80, prompt)
    with torch.no_grad():
        out = cfm.solve(mu[:, :, :prompt], spk, cond[:, :, :prompt], cnn_cache=None, att_cache=None)
        pieces, start = [], prompt
        for n in chunks:
            out = cfm.solve(mu[:, :, start : start + n], spk, cond[:, :, start : start + n],
                            cnn_cache=out.cnn_cache, att_cache=out.att_cache)  # fmt: skip
            pieces.append(out.mel)
            start += n
        mask = block_causal_mask([prompt, *chunks], mu.device)
        ref = cfm.solve(mu, spk, cond, cnn_cache=None, att_cache=None, mask=mask).mel[:, :, prompt:]
        unmasked = cfm.solve(mu, spk, cond, cnn_cache=None, att_cache=None).mel[:, :, prompt:]
    chunked = torch.cat(pieces, dim=2)
    assert (chunked - ref).abs().max().item() < MEL_TOL
    assert (chunked - unmasked).abs().max().item() > 1e-3  # the mask matters: the check can fail
