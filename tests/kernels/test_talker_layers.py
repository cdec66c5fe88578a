"""The talker's fused decode layers (`stages.talker.layer_triton`, `TalkerModel._decode_fused`).

CPU cases run the Triton kernels under the interpreter (`kernel_for` picks the interpreted twin
for CPU tensors) against the modules' own ops: RoPE and the cache writes bit for bit, the
residual + RMSNorm to fp32 rounding, a whole decode (and an engine's logits) to fp32 rounding.
The CUDA cases live in tests/stages/test_talker_gpu.py.

Run: python -m pytest tests/kernels/test_talker_layers.py -q
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from stages.flags import FlagError
from stages.talker.config import TalkerConfig
from stages.talker.engine import TalkerEngine, TalkerRequest
from stages.talker.kernels import TalkerKernels, decode_layers
from stages.talker.model import RMSNorm, TalkerModel, apply_rope

# bf16 under the interpreter, which rounds fp32 -> bf16 toward zero: a few ulps of values up to ~8.
INTERPRETED_BF16 = dict(rtol=2**-6, atol=2**-4)

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, intermediate_size=128, llm_dim=64)


def select_fused_decode(model: TalkerModel, fused: bool, device: torch.device) -> str:
    """Route `model`'s decode as `kernels.decode_layers` chooses for it; what it said."""
    layers = decode_layers(fused, model, device)
    model.use_kernels(TalkerKernels(layers=layers))
    return layers.reason


def model_of(cfg: TalkerConfig, *, max_batch=4, max_seq_len=64, dtype=torch.float32) -> TalkerModel:
    model = TalkerModel(cfg)
    model.init_random_weights(torch.Generator().manual_seed(0))
    model = model.to(dtype).eval().requires_grad_(False)
    model.fold_weight_norm()
    model.setup_caches(max_batch=max_batch, max_seq_len=max_seq_len, device="cpu", dtype=dtype)
    gen = torch.Generator().manual_seed(5)
    for layer in model.model.layers:  # earlier positions hold something, as in a running batch
        cache = layer.self_attn.kv_cache
        cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
        cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return model


def split_qkv(qkv, heads, kv_heads, hd):
    rows = qkv.shape[0]
    q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=1)
    return (t.view(rows, 1, n, hd).transpose(1, 2) for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_rope_to_cache_is_the_modules_rope_and_write_bit_for_bit(interpret, dtype, heads, kv_heads):
    from stages.talker.layer_triton import rope_to_cache

    rows, hd, slots, seq = 3, 16, 5, 40
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * hd, generator=gen).to(dtype)
    angles = torch.randn(seq, hd, generator=gen)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    positions = torch.tensor([7, 0, 39])
    k_cache = torch.randn(slots, kv_heads, seq, hd, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, seq, hd, generator=gen).to(dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()

    q = rope_to_cache(qkv, positions, cos, sin, k_cache, v_cache, heads)

    q_ref, k_ref, v_ref = split_qkv(qkv, heads, kv_heads, hd)
    c, s = cos[positions][:, None, None], sin[positions][:, None, None]
    for r in range(rows):  # what KVCache.write stores: rotated k, raw v, at (slot r, position)
        want_k[r, :, positions[r]] = apply_rope(k_ref, c, s)[r, :, 0]
        want_v[r, :, positions[r]] = v_ref[r, :, 0]
    assert q.shape == (rows, heads, 1, hd) and q.dtype == dtype
    if dtype == torch.float32:
        assert torch.equal(q, apply_rope(q_ref, c, s))
        assert torch.equal(k_cache, want_k)  # every other slot and position untouched
    else:
        # The interpreter rounds fp32 -> bf16 toward zero (compiled kernels round to nearest
        # even, as torch does: bit for bit on CUDA, tests/stages/test_talker_gpu.py), three
        # times on the way: a few ulps of values up to ~8.
        torch.testing.assert_close(q, apply_rope(q_ref, c, s), **INTERPRETED_BF16)
        torch.testing.assert_close(k_cache, want_k, **INTERPRETED_BF16)
    assert torch.equal(v_cache, want_v)  # v is copied, not computed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_add_rms_norm_is_the_residual_add_and_the_module(interpret, dtype):
    from stages.talker.layer_triton import add_rms_norm

    gen = torch.Generator().manual_seed(2)
    norm = RMSNorm(48, eps=1e-6).to(dtype)  # 48: a masked block of 64 lanes
    with torch.no_grad():
        norm.weight.copy_(torch.rand(48, generator=gen) + 0.5)
    x = (torch.randn(5, 48, generator=gen) * 3).to(dtype)
    delta = torch.randn(5, 48, generator=gen).to(dtype)
    x_before = x.clone()

    total, normed = add_rms_norm(x, delta, norm)
    if dtype == torch.float32:
        assert torch.equal(total, x + delta)  # one rounding to the stored dtype, as torch's add
    else:
        torch.testing.assert_close(total, x + delta, **INTERPRETED_BF16)
    assert torch.equal(x, x_before)  # the input is not written
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else INTERPRETED_BF16
    with torch.no_grad():
        torch.testing.assert_close(normed, norm(x + delta), **tol)
        same, alone = add_rms_norm(x, None, norm)
        assert same is x
        torch.testing.assert_close(alone, norm(x), **tol)


def test_a_position_outside_the_cache_writes_nothing(interpret):
    from stages.talker.layer_triton import rope_to_cache

    cache = torch.randn(2, 2, 8, 4, generator=torch.Generator().manual_seed(4))
    k, v = cache.clone(), cache.clone()
    table = torch.ones(8, 4)
    qkv = torch.ones(2, (2 + 4) * 4)
    rope_to_cache(qkv, torch.tensor([8, -1]), table, table, k, v, 2)  # past the end, before the start
    assert torch.equal(k, cache) and torch.equal(v, cache)
    rope_to_cache(qkv, torch.tensor([7, 0]), table, table, k, v, 2)  # the last and first rows do land
    assert torch.equal(v[0, :, 7], torch.ones(2, 4)) and torch.equal(v[1, :, 0], torch.ones(2, 4))


def test_kernels_refuse_what_they_cannot_address(interpret):
    from stages.talker.layer_triton import add_rms_norm, rope_to_cache

    norm = RMSNorm(16, eps=1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        add_rms_norm(torch.zeros(4, 32)[:, ::2], None, norm)
    with pytest.raises(ValueError, match="norm weight"):
        add_rms_norm(torch.zeros(4, 8), None, norm)
    with pytest.raises(ValueError, match="delta"):
        add_rms_norm(torch.zeros(4, 16), torch.zeros(4, 16, dtype=torch.float64), norm)
    cache = torch.zeros(2, 2, 8, 4)
    table = torch.zeros(8, 4)
    qkv = torch.zeros(2, (2 + 4) * 4)
    with pytest.raises(ValueError, match="qkv"):
        rope_to_cache(qkv[:, :-4], torch.zeros(2, dtype=torch.long), table, table, cache, cache.clone(), 2)
    with pytest.raises(ValueError, match="positions"):  # more rows than cache slots
        rope_to_cache(torch.zeros(3, 24), torch.zeros(3, dtype=torch.long), table, table, cache, cache.clone(), 2)
    with pytest.raises(ValueError, match="positions"):
        rope_to_cache(qkv, torch.zeros(2, dtype=torch.int32), table, table, cache, cache.clone(), 2)
    with pytest.raises(ValueError, match="rope tables"):
        rope_to_cache(qkv, torch.zeros(2, dtype=torch.long), table[:4], table[:4], cache, cache.clone(), 2)


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_fused_decode_matches_the_modules_decode(interpret, kv_heads):
    cfg = TalkerConfig(**{**TINY, "num_kv_heads": kv_heads})
    plain, fused = model_of(cfg), model_of(cfg)
    assert select_fused_decode(fused, True, torch.device("cpu")).startswith("fused")
    assert plain.layer_kernels is None and fused.layer_kernels is not None
    x = torch.randn(3, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([5, 0, 17])  # row 1 is a free slot writing at its position 0
    with torch.no_grad():
        want, got = plain.decode(x, positions, 32), fused.decode(x, positions, 32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(plain.model.layers, fused.model.layers, strict=True):
        torch.testing.assert_close(b.self_attn.kv_cache.k, a.self_attn.kv_cache.k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.self_attn.kv_cache.v, a.self_attn.kv_cache.v, rtol=1e-5, atol=1e-5)
    # Layer 0's cache rows come from the same GEMM input: bit for bit the modules' writes.
    assert torch.equal(fused.model.layers[0].self_attn.kv_cache.k, plain.model.layers[0].self_attn.kv_cache.k)


def test_fuse_projections_makes_views_and_keeps_the_state_dict():
    model = model_of(TalkerConfig(**TINY))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse_projections()
    model.fuse_projections()  # idempotent
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert attn.qkv_weight.shape == (3 * 64, 64) and mlp.gate_up_weight.shape == (2 * 128, 64)
    for lin in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert lin.weight.untyped_storage().data_ptr() == attn.qkv_weight.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_up_weight[128:].data_ptr()


def test_selection_says_why_the_modules_decode_stays(monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = model_of(TalkerConfig(**TINY))
    assert select_fused_decode(model, True, torch.device("cpu")) == "unfused (CPU without TRITON_INTERPRET=1)"
    assert select_fused_decode(model, False, torch.device("cpu")) == "unfused (stage extra talker_fused_layers is false)"
    assert model.layer_kernels is None


def test_a_compile_failure_keeps_the_modules_decode(interpret, monkeypatch, caplog):
    from stages.talker import layer_triton

    def broken(model):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(layer_triton, "warm_up", broken)
    model = model_of(TalkerConfig(**TINY))
    with caplog.at_level(logging.WARNING):
        said = select_fused_decode(model, True, torch.device("cpu"))
    assert said == "unfused (the fused kernels failed to compile (RuntimeError: no compiler here))"
    assert model.layer_kernels is None
    assert "unfused decode layers kept" in caplog.text


def test_warm_up_leaves_the_caches_alone(interpret):
    from stages.talker import layer_triton

    model = model_of(TalkerConfig(**TINY))
    cache = model.model.layers[0].self_attn.kv_cache
    k, v = cache.k.clone(), cache.v.clone()
    layer_triton.warm_up(model)
    assert torch.equal(cache.k, k) and torch.equal(cache.v, v)


def test_engine_flag_is_strict_and_reported(interpret):
    def engine(extra):
        cfg = dataclasses.replace(TalkerConfig(**TINY), extra=extra)
        return TalkerEngine(cfg, device=torch.device("cpu"), dtype=torch.float32, max_batch=2, max_seq_len=128)

    with pytest.raises(FlagError, match="talker_fused_layers"):
        engine({"talker_fused_layers": "on"})
    with pytest.raises(FlagError, match="talker_fused_layers"):  # a typo names the real key
        engine({"talker_fused_layer": True})
    assert engine({}).describe()["fused_layers"] is True
    assert engine({"talker_fused_layers": False}).describe()["fused_layers"] is False


def test_engine_logits_with_fused_layers_match_the_modules(interpret):
    """Steps of a batch whose requests join at different times: the logits each step samples
    from agree with the unfused engine's to fp32 rounding."""

    def logits_of(fused: bool) -> list[torch.Tensor]:
        cfg = dataclasses.replace(TalkerConfig(**TINY), extra={"talker_fused_layers": fused})
        eng = TalkerEngine(cfg, device=torch.device("cpu"), dtype=torch.float32, max_batch=4, max_seq_len=128)
        seen: list[torch.Tensor] = []
        original = eng._logits
        eng._logits = lambda rows: seen.append(original(rows).clone()) or seen[-1]
        eng.add(TalkerRequest("a", "First words here.", seed=1, max_codes=6))
        for k in range(6):
            if k == 2:
                eng.add(TalkerRequest("b", "A second request.", seed=2, max_codes=3))
            eng.step()
        return seen

    plain, fused = logits_of(False), logits_of(True)
    assert len(plain) == len(fused) == 6
    for want, got in zip(plain, fused, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
