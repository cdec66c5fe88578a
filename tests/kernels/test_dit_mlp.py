"""The DiT's MLP branch as one launch (`stages.code2wav.dit_mlp`, `code2wav_fused_mlp`): fc1 +
GELU-tanh + fc2 with fc2's k-sum split by slices of hidden units, handed to the norm step as
an `OpenSum`. It claims fp32 accuracy against the unfused MLP, not bit for bit (its sum splits
at other boundaries), so the comparisons here are bounded differences, reported; eager against
a replayed graph is `torch.equal` (the GPU case).

CPU cases run the kernel under the Triton interpreter; the `gpu` cases compile it at full width.

Run: python -m pytest tests/kernels/test_dit_mlp.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stages.code2wav import dit_gemm, dit_mlp, kernels
from stages.code2wav.config import DiTConfig
from stages.code2wav.dit import DiT
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.kernels.cuda_graphs import replayed

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SMALL = dit_mlp.MlpTile(block_m=16, block_h=16, block_k=16, slice=32, warps=4, stages=1)  # 4 parts of 128


def _weights(c: int, hidden: int, seed: int, device="cpu") -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    w1, b1 = torch.randn(hidden, c, generator=gen) / c**0.5, torch.randn(hidden, generator=gen) * 0.1
    w2, b2 = torch.randn(c, hidden, generator=gen) / hidden**0.5, torch.randn(c, generator=gen) * 0.1
    return tuple(t.to(device) for t in (w1, b1, w2, b2))


def _torch_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


@pytest.mark.parametrize("shape", [(3, 5), (2, 13)], ids=["one-row-block", "two-row-blocks"])
def test_each_part_is_its_slices_product_and_the_parts_add_to_the_mlp(interpret, shape):
    c, hidden = 32, 128
    w1, b1, w2, b2 = _weights(c, hidden, seed=1)
    x = torch.randn(*shape, c)
    got = dit_mlp.mlp(x, w1, b1, w2, b2, tile=SMALL)
    want = dit_mlp.mlp_reference(x, w1, b1, w2, b2, tile=SMALL)
    assert isinstance(got, dit_gemm.OpenSum) and got.parts.shape == (4, *shape, c) and got.shape == (*shape, c)
    assert got.bias is b2
    scale = want.parts.abs().max().item()
    assert (got.parts - want.parts).abs().max().item() <= 1e-5 * scale  # every part is its own slice's
    closed = got.close()  # parts in order, then the bias: the split sum's launch
    full = _torch_mlp(x, w1, b1, w2, b2)
    assert (closed - full).abs().max().item() <= 1e-5 * full.abs().max().item()
    # The parts are four different sums: one missing leaves another tensor.
    short = dit_gemm.OpenSum(got.parts[:-1], b2).close()
    assert (short - full).abs().max().item() > 1e-3


def test_tiles_fit_the_dits_dims_or_the_mlp_stays_two_gemms():
    full = dit_mlp.tile_for(512, 2048)
    assert full == dit_mlp.MLP_TILE and dit_mlp.parts_for(512, 2048) == 16
    tiny = dit_mlp.tile_for(32, 128)  # the tiny test DiT: k-steps and the slice cut to fit
    assert tiny.block_k == 32 and tiny.slice == 128 and dit_mlp.parts_for(32, 128) == 1
    for c, hidden in ((48, 192), (8, 32), (512, 2056)):
        assert dit_mlp.tile_for(c, hidden) is None and dit_mlp.parts_for(c, hidden) == 0


def test_bad_operands_are_refused_with_what_was_given(interpret):
    c, hidden = 32, 128
    w1, b1, w2, b2 = _weights(c, hidden, seed=2)
    x = torch.randn(2, 3, c)
    with pytest.raises(ValueError, match=r"x must be \[B, T, 32\]"):
        dit_mlp.mlp(x[0], w1, b1, w2, b2)
    with pytest.raises(ValueError, match="fc1 .* and fc2 .* expected"):
        dit_mlp.mlp(x, w1, b1, w2.t().contiguous(), b2)
    with pytest.raises(ValueError, match="fp32 operands"):
        dit_mlp.mlp(x.double(), w1, b1, w2, b2)
    with pytest.raises(ValueError, match="16-byte aligned"):
        dit_mlp.mlp(x, w1.t().contiguous().t(), b1, w2, b2)
    with pytest.raises(ValueError, match="no tile fits C 24"):
        w = _weights(24, 96, seed=3)
        dit_mlp.mlp(torch.randn(1, 2, 24), *w)


def test_the_flag_parses_strictly_and_defaults_off():
    assert Code2WavOptions.from_extra({}).fused_mlp is False
    assert Code2WavOptions.from_extra({"code2wav_fused_mlp": "true"}).fused_mlp is True
    with pytest.raises(FlagError, match="code2wav_fused_mlp"):
        Code2WavOptions.from_extra({"code2wav_fused_mlp": "sometimes"})


def _choice(extra: dict, cfg: DiTConfig) -> kernels.DiTKernels:
    return kernels.resolve(Code2WavOptions.from_extra(extra), cfg, torch.device("cpu"), torch.float32)


def test_resolution_runs_it_only_with_the_open_sums_it_hands_its_parts_to(forced_cuda):
    cfg = DiTConfig(hidden_size=32, depth=1, num_heads=2, head_dim=16)
    on = _choice({"code2wav_fused_mlp": True}, cfg)
    assert on.fused_mlp is dit_mlp.mlp and on.fused_mlp_rows == dit_mlp.MAX_ROWS == 256
    assert "fc1 + GELU + fc2 as one launch up to 256 rows" in on.reasons()["linears"]
    assert _choice({}, cfg).fused_mlp is None  # off by default
    closed = _choice({"code2wav_fused_mlp": True, "code2wav_open_split_sums": False}, cfg)
    assert closed.fused_mlp is None and closed.fused_mlp_rows == 0
    odd = DiTConfig(hidden_size=48, depth=1, num_heads=2, head_dim=24)  # no power-of-two width
    assert _choice({"code2wav_fused_mlp": True}, odd).fused_mlp is None
    assert kernels.DiTKernels().fused_mlp is None  # an unresolved DiT (the CPU's own choice)


def _dit(hidden: int, device="cpu") -> DiT:
    torch.manual_seed(5)
    dit = DiT(DiTConfig(hidden_size=hidden, depth=2, num_heads=2, head_dim=hidden // 2)).eval()
    with torch.no_grad():
        for p in dit.parameters():
            p.normal_(0, 0.05)
    return dit.to(device)


def test_a_dit_with_the_fused_mlp_stays_within_fp32_of_it_without(forced_cuda, monkeypatch):
    """A frames-first DiT on the Triton kernels (the interpreter) from random caches: with the
    fused MLP (4 parts a block at hidden 128) the velocity and caches stay within fp32 rounding
    of the unfused DiT's, the fused branch ran in every block, and a chunk above its row bound
    runs the two GEMMs again (bit for bit the unfused DiT)."""
    calls = []
    real = dit_mlp.mlp
    monkeypatch.setattr(dit_mlp, "mlp", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    dit = _dit(128)
    cfg, rows, frames = dit.cfg, 2, 6
    x_in, t = torch.randn(rows, cfg.in_channels, frames), torch.rand(rows)
    caches = (torch.randn(cfg.depth, rows, 2 * cfg.hidden_size, 2),
              torch.randn(cfg.depth, rows, cfg.num_heads, 4, 2 * cfg.head_dim))
    with torch.no_grad():
        dit.use_kernels(_choice({}, cfg))
        plain = dit.forward_chunk(x_in, t, *caches)
        chosen = _choice({"code2wav_fused_mlp": True}, cfg)
        dit.use_kernels(chosen)
        fused = dit.forward_chunk(x_in, t, *caches)
        assert len(calls) == cfg.depth and all(s == (rows, frames, cfg.hidden_size) for s in calls)
        for got, want in ((fused.velocity, plain.velocity), (fused.cnn_cache, plain.cnn_cache),
                          (fused.att_cache, plain.att_cache)):
            assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
        dit.use_kernels(chosen.__class__(**{**chosen.__dict__, "fused_mlp_rows": rows * frames - 1}))
        above = dit.forward_chunk(x_in, t, *caches)
    assert len(calls) == cfg.depth  # not called again
    assert torch.equal(above.velocity, plain.velocity)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("rows", [100, 200], ids=["one-request", "two-requests"])
def test_cuda_full_width_mlp_is_as_accurate_as_the_unfused_gemms(rows):
    """C 512, hidden 2,048 at one and two requests' rows: against an fp64 MLP the fused branch's
    error stays within twice the unfused 3xTF32 GEMMs' (fp32 accuracy), and every part is its
    slice's product."""
    device = torch.device("cuda")
    w1, b1, w2, b2 = _weights(512, 2048, seed=6, device=device)
    x = torch.randn(2, rows // 2, 512, device=device)
    exact = _torch_mlp(*(t.double() for t in (x, w1, b1, w2, b2)))
    fused = dit_mlp.mlp(x, w1, b1, w2, b2)
    assert fused.parts.shape[0] == 16
    h = dit_gemm.linear(x, w1, b1, gelu=True)
    unfused = dit_gemm.linear(h, w2, b2)
    err_fused = (fused.close().double() - exact).abs().max().item()
    err_unfused = (unfused.double() - exact).abs().max().item()
    print(f"rows {rows}: max |error| vs fp64, fused {err_fused:.3e}, unfused {err_unfused:.3e}")
    assert err_fused <= 2 * err_unfused + 1e-6
    ref = dit_mlp.mlp_reference(*(t.double() for t in (x, w1, b1, w2, b2)))
    assert (fused.parts.double() - ref.parts).abs().max().item() <= 1e-4


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_with_the_fused_mlp_replays_bit_for_bit():
    """A full-width DiT call at one request with the fused MLP (compiled at resolution): within
    fp32 of the unfused DiT, and a device graph replays it bit for bit."""
    device = torch.device("cuda")
    dit = _dit(512, device=device)
    cfg = dit.cfg
    x_in, t = torch.randn(2, cfg.in_channels, 50, device=device), torch.rand(2, device=device)
    caches = (torch.randn(cfg.depth, 2, 2 * cfg.hidden_size, 2, device=device),
              torch.randn(cfg.depth, 2, cfg.num_heads, 20, 2 * cfg.head_dim, device=device))
    resolve = lambda extra: kernels.resolve(Code2WavOptions.from_extra(extra), cfg, device, torch.float32)  # noqa: E731
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False), torch.no_grad():
        dit.use_kernels(resolve({}))
        plain = dit.forward_chunk(x_in, t, *caches).velocity.clone()
        chosen = resolve({"code2wav_fused_mlp": True})
        assert chosen.fused_mlp is not None, chosen.reasons()
        dit.use_kernels(chosen)
        eager = dit.forward_chunk(x_in, t, *caches).velocity.clone()
        assert (eager - plain).abs().max().item() <= 1e-4 * plain.abs().max().item()
        assert torch.equal(replayed(lambda: dit.forward_chunk(x_in, t, *caches).velocity), eager)
