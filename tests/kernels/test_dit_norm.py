"""The DiT's fused residual + LayerNorm + modulation (`stages.code2wav.dit_triton`) and its use.

CPU cases run the kernel under the Triton interpreter (`kernel_for` picks the interpreted twin
for CPU tensors) against the eager chain; the `gpu` cases run it compiled, in fp32 and bf16,
and a whole DiT call with it. The eager chain itself must stay bit-identical to the block order
it replaced (written out in `_reference_forward`), since CPU runs and the reference-parity tests
go through it.

Run: python -m pytest tests/kernels/test_dit_norm.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch

from stages.code2wav.dit import DiT, gated, modulate, residual_norm_modulate_eager
from stages.code2wav.kernels import norm_kernel
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.stages.code2wav_tiny import check_a_dit_path_on_cuda, random_dit, use

EPS = 1e-6
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(b: int, t: int, c: int, *, per_row: bool, device="cpu", dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    x = rand(b, t, c)
    y = rand(b, c, t).transpose(1, 2)  # the conv branch's layout: a transposed view
    # Modulation rows as the adaLN linear makes them: views into one [M, 1, 3C] output.
    # The scale is 1 + a view, a dense tensor of its own (as `block_modulation` makes it), so the
    # three rows have different batch strides.
    mods = rand(b if per_row else 1, 1, 3 * c)
    gate, shift, scale = mods.chunk(3, dim=-1)
    return x, y, gate, shift, scale + 1


@pytest.mark.parametrize("per_row", [False, True], ids=["shared-rows", "per-row"])
@pytest.mark.parametrize("c", [48, 64], ids=["C48-masked", "C64"])
def test_fused_matches_the_eager_chain_on_the_interpreter(interpret, per_row, c):
    from stages.code2wav.dit_triton import residual_norm_modulate

    x, y, gate, shift, scale = _inputs(2, 5, c, per_row=per_row)
    want_x, want_h = residual_norm_modulate_eager(x, gate, y, shift, scale, eps=EPS)
    fused_x = x.clone()
    h = residual_norm_modulate(fused_x, gate, y, shift, scale, eps=EPS)
    torch.testing.assert_close(fused_x, want_x, rtol=0, atol=1e-6)  # updated in place
    torch.testing.assert_close(h, want_h, rtol=1e-5, atol=1e-5)
    assert h.is_contiguous() and h.shape == x.shape


def test_fused_without_residual_leaves_x_alone(interpret):
    from stages.code2wav.dit_triton import residual_norm_modulate

    x, _, _, shift, scale = _inputs(3, 4, 32, per_row=False, seed=1)
    before = x.clone()
    h = residual_norm_modulate(x, None, None, shift, scale, eps=EPS)
    assert torch.equal(x, before)
    torch.testing.assert_close(h, residual_norm_modulate_eager(x, None, None, shift, scale, eps=EPS)[1],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "case, message",
    [
        ("transposed-x", "contiguous"),
        ("wide-row", "modulation row"),
        ("rows-of-another-batch", "modulation row"),
        ("short-y", "branch output"),
    ],
)
def test_fused_refuses_layouts_it_cannot_read(interpret, case, message):
    from stages.code2wav.dit_triton import residual_norm_modulate

    x, y, gate, shift, scale = _inputs(2, 4, 32, per_row=False)
    if case == "transposed-x":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    elif case == "wide-row":
        shift = torch.zeros(1, 1, 64)
    elif case == "rows-of-another-batch":
        scale = torch.ones(3, 1, 32)
    elif case == "short-y":
        y = y[:, :3]
    with pytest.raises(ValueError, match=message):
        residual_norm_modulate(x, gate, y, shift, scale, eps=EPS)


def _attention_case(b=2, t=5, heads=2, d=16, cached=3, device="cpu", dtype=torch.float32, seed=0):
    from stages.code2wav.config import DiTConfig
    from stages.code2wav.dit import Attention

    torch.manual_seed(seed)
    attn = Attention(DiTConfig(hidden_size=32, depth=1, num_heads=heads, head_dim=d))
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.5)
    attn = attn.to(device=device, dtype=dtype)
    x = torch.randn(b, t, 32, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)
    # The destination is a step slice of a larger arena (as the CFM hands it): not contiguous
    # over its leading dims, old frames behind the new ones.
    arena = torch.randn(3, b, heads, t + cached, 2 * d, device=device, dtype=dtype)
    return attn, x, arena


def _eager_qk(attn, x, out_cache):
    t = x.shape[1]
    q = attn.q_norm(attn._split(attn.to_q(x)))
    out_cache[:, :, :t, : attn.d] = attn.k_norm(attn._split(attn.to_k(x))).transpose(1, 2)
    out_cache[:, :, :t, attn.d :] = attn._split(attn.to_v(x)).transpose(1, 2)
    return q


def test_qk_norm_to_cache_matches_the_eager_attention_prologue(interpret):
    from stages.code2wav.dit_triton import qk_norm_to_cache

    attn, x, arena = _attention_case()
    want_cache = arena.clone()
    with torch.no_grad():
        want_q = _eager_qk(attn, x, want_cache[1])
        qkv = torch.nn.functional.linear(x, *attn.qkv_projection())
        got_q = qk_norm_to_cache(qkv, attn.q_norm, attn.k_norm, arena[1], attn.h)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(arena, want_cache, rtol=1e-5, atol=1e-5)
    assert torch.equal(arena[1, :, :, 5:], want_cache[1, :, :, 5:])  # old frames untouched
    assert torch.equal(arena[0], want_cache[0]) and torch.equal(arena[2], want_cache[2])


def test_qk_norm_to_cache_refuses_a_cache_it_cannot_write(interpret):
    from stages.code2wav.dit_triton import qk_norm_to_cache

    attn, x, arena = _attention_case()
    qkv = torch.nn.functional.linear(x, *attn.qkv_projection()).detach()
    with pytest.raises(ValueError, match="cache must be"):
        qk_norm_to_cache(qkv, attn.q_norm, attn.k_norm, arena[1, :, :, :4], attn.h)  # fewer frames than T
    with pytest.raises(ValueError, match="cache must be"):
        qk_norm_to_cache(qkv, attn.q_norm, attn.k_norm, arena[1].transpose(2, 3).contiguous().transpose(2, 3), attn.h)
    with pytest.raises(ValueError, match="qkv must be"):
        qk_norm_to_cache(qkv[:, :, :-1], attn.q_norm, attn.k_norm, arena[1], attn.h)


def test_the_qkv_projection_follows_a_weight_load():
    attn, x, _ = _attention_case()
    w, _ = attn.qkv_projection()
    assert attn.qkv_projection()[0] is w  # cached while nothing changed
    state = {k: torch.randn_like(v) for k, v in attn.state_dict().items()}
    attn.load_state_dict(state)  # in-place copies: same storage, new version
    w2, b2 = attn.qkv_projection()
    assert torch.equal(w2, torch.cat([state["to_q.weight"], state["to_k.weight"], state["to_v.weight"]]))
    assert torch.equal(b2, torch.cat([state["to_q.bias"], state["to_k.bias"], state["to_v.bias"]]))


def _reference_forward(dit: DiT, x_in, t):
    """The block order before the residual steps were chained: LN, modulate, branch, gated add,
    block by block, then the final layer's own LN and modulation."""
    mod = dit._modulation(dit.t_embedder(t).unsqueeze(1))
    x = dit.in_proj(x_in.transpose(1, 2))
    n, frames = x.shape[0], x.shape[1]
    cfg = dit.cfg
    for i, blk in enumerate(dit.blocks):
        sh_msa, sc_msa, g_msa, sh_mlp, sc_mlp, g_mlp, sh_conv, sc_conv, g_conv = mod.blocks[i]
        att_out = x.new_empty(n, cfg.num_heads, frames, 2 * cfg.head_dim)
        cnn_out = x.new_empty(n, 2 * cfg.hidden_size, 2)
        x = gated(x, g_msa, blk.attn(modulate(blk.norm1(x), sh_msa, sc_msa), None, None, att_out))
        x = gated(x, g_conv, blk.conv(modulate(blk.norm3(x), sh_conv, sc_conv), None, cnn_out))
        x = gated(x, g_mlp, blk.mlp(modulate(blk.norm2(x), sh_mlp, sc_mlp)))
    fl = dit.final_layer
    return fl.linear(modulate(fl.norm_final(x), *mod.final)).transpose(1, 2)


def test_chained_eager_blocks_are_bit_identical_to_the_old_block_order():
    dit = random_dit()
    x_in, t = torch.randn(4, 320, 7), torch.rand(4)
    with torch.no_grad():
        got = dit.forward_chunk(x_in, t, None, None).velocity
        want = _reference_forward(dit, x_in, t)
    assert torch.equal(got, want)


def test_dit_with_the_fused_norm_matches_eager_on_the_interpreter(interpret):
    dit = random_dit(seed=3)
    x_in, t = torch.randn(2, 320, 6), torch.rand(2)
    with torch.no_grad():
        want = dit.forward_chunk(x_in, t, None, None)
        assert use(dit, norm=norm_kernel(True, dit.cfg, torch.device("cpu"), torch.float32)).norm.reason.startswith("fused")
        assert dit.norm_kernel == "triton"
        got = dit.forward_chunk(x_in, t, None, None)
    torch.testing.assert_close(got.velocity, want.velocity, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.att_cache, want.att_cache, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.cnn_cache, want.cnn_cache, rtol=1e-4, atol=1e-4)


def test_select_norm_says_why_it_stays_eager(monkeypatch, caplog):
    dit = random_dit()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "code2wav_fused_norm is false" in norm_kernel(False, dit.cfg, torch.device("cpu"), torch.float32).reason
    assert "TRITON_INTERPRET" in use(dit, norm=norm_kernel(True, dit.cfg, torch.device("cpu"), torch.float32)).norm.reason
    assert dit.norm_kernel == "eager"


def test_a_kernel_that_fails_to_compile_leaves_the_eager_chain(interpret, monkeypatch, caplog):
    from stages.code2wav import dit_triton

    def broken(*args, **kwargs):
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(dit_triton, "warm_up", broken)
    dit = random_dit()
    with caplog.at_level(logging.WARNING):
        said = use(dit, norm=norm_kernel(True, dit.cfg, torch.device("cpu"), torch.float32)).norm.reason
    assert "ptxas died" in said and dit.norm_kernel == "eager"
    assert any("ptxas died" in r.getMessage() for r in caplog.records)


def test_the_flag_is_strict_and_on_by_default():
    assert Code2WavOptions.from_extra({}).fused_norm is True
    assert Code2WavOptions.from_extra({"code2wav_fused_norm": "false"}).fused_norm is False
    with pytest.raises(FlagError, match="code2wav_fused_norm"):
        Code2WavOptions.from_extra({"code2wav_fused_norm": "sometimes"})
    with pytest.raises(FlagError, match="code2wav_fused_norm"):
        Code2WavOptions.from_extra({"code2wav_fused_nrom": True})


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("per_row", [False, True], ids=["shared-rows", "per-row"])
def test_cuda_fused_matches_the_eager_chain(dtype, tol, per_row):
    from stages.code2wav.dit_triton import residual_norm_modulate

    x, y, gate, shift, scale = _inputs(4, 50, 512, per_row=per_row, device="cuda", dtype=dtype)
    want_x, want_h = residual_norm_modulate_eager(x, gate, y, shift, scale, eps=EPS)
    fused_x = x.clone()
    h = residual_norm_modulate(fused_x, gate, y, shift, scale, eps=EPS)
    torch.testing.assert_close(fused_x, want_x, rtol=tol, atol=tol)
    torch.testing.assert_close(h, want_h, rtol=tol, atol=tol)
    # Twice on the same inputs: the same bytes (no atomics, no order that can change).
    again_x = x.clone()
    assert torch.equal(residual_norm_modulate(again_x, gate, y, shift, scale, eps=EPS), h)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_cuda_qk_norm_to_cache_matches_eager(dtype, tol):
    from stages.code2wav.dit_triton import qk_norm_to_cache

    attn, x, arena = _attention_case(b=4, t=50, heads=8, d=64, cached=40, device="cuda", dtype=dtype)
    attn_in = torch.randn(4, 50, 32, device="cuda", dtype=dtype)
    want_cache = arena.clone()
    with torch.no_grad():
        want_q = _eager_qk(attn, attn_in, want_cache[1])
        qkv = torch.nn.functional.linear(attn_in, *attn.qkv_projection())
        got_q = qk_norm_to_cache(qkv, attn.q_norm, attn.k_norm, arena[1], attn.h)
    torch.testing.assert_close(got_q, want_q, rtol=tol, atol=tol)
    torch.testing.assert_close(arena, want_cache, rtol=tol, atol=tol)
    assert torch.equal(arena[1, :, :, 50:], want_cache[1, :, :, 50:])


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_with_the_fused_norm_matches_eager_and_replays_bit_identically():
    def fuse(dit):
        assert use(dit, norm=norm_kernel(True, dit.cfg, torch.device("cuda"), torch.float32)).norm.reason.startswith("fused")

    check_a_dit_path_on_cuda(fuse, rows=6)
