"""The DiT's launch fusions (`stages.code2wav.fusions`): split k-sums left open
(`dit_gemm.OpenSum`, `code2wav_open_split_sums`: a split GEMM hands its parts unadded to the
fused kernel after it, which adds them as it loads them in the split sum's order) and the conv
window written by the norm step (`code2wav_norm_writes_conv_window`). Both claim bit for bit, so
every comparison here is `torch.equal`, against the unfused kernels.

CPU cases run the kernels under the Triton interpreter; the `gpu` cases compile them and run a
DiT call with the full-size hidden width, eager and replayed from a device graph.

Run: python -m pytest tests/kernels/test_dit_fusions.py -q
"""

from __future__ import annotations

import pytest
import torch

from stages.code2wav import dit_gemm, kernels
from stages.code2wav.config import DiTConfig
from stages.code2wav.dit import DiT
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.kernels.cuda_graphs import replayed

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _linear(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) / k**0.5, torch.randn(n, generator=gen)


def _modulation(c: int, seed: int, device="cpu") -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 1, c, generator=gen).to(device) for _ in range(3))  # gate, shift, 1 + scale


@pytest.mark.parametrize("split", [2, 4])
def test_the_norm_step_adds_an_open_sum_bit_for_bit(interpret, split):
    from stages.code2wav.dit_triton import residual_norm_modulate

    c, hidden = 32, 512  # fc2's shape at a tiny width: K = 512 splits into 2 or 4 whole 64-deep parts
    weight, bias = _linear(c, hidden, seed=split)
    h, x = torch.randn(3, 5, hidden), torch.randn(3, 5, c)
    closed = dit_gemm.linear(h, weight, bias, split_k=split)
    opened = dit_gemm.linear(h, weight, bias, split_k=split, open_sum=True)
    assert isinstance(opened, dit_gemm.OpenSum) and opened.parts.shape == (split, 3, 5, c) and opened.shape == (3, 5, c)
    assert torch.equal(opened.close(), closed)  # the split sum's own launch, for a consumer that cannot add
    gate, shift, scale = _modulation(c, seed=1)
    x_closed, x_open = x.clone(), x.clone()
    want = residual_norm_modulate(x_closed, gate, closed, shift, scale, eps=1e-6)
    got = residual_norm_modulate(x_open, gate, opened, shift, scale, eps=1e-6)
    assert torch.equal(got, want) and torch.equal(x_open, x_closed)  # the output and the residual updated in place
    # The parts are really added: a sum missing its last part (or its bias) is another tensor.
    short = dit_gemm.OpenSum(opened.parts[:-1], bias)
    assert not torch.equal(residual_norm_modulate(x.clone(), gate, short, shift, scale, eps=1e-6), want)
    no_bias = dit_gemm.OpenSum(opened.parts, None)
    assert not torch.equal(residual_norm_modulate(x.clone(), gate, no_bias, shift, scale, eps=1e-6), want)


def test_the_conv_blocks_kernels_add_a_convs_open_sum_bit_for_bit(interpret):
    """conv1's parts into the LayerNorm + Mish window, conv2's into the norm step; both are views
    with the window's batch stride (the two straddling rows a batch row dropped)."""
    from stages.code2wav.dit_conv_triton import ln_mish_window
    from stages.code2wav.dit_triton import residual_norm_modulate

    c, rows, frames = 128, 2, 7  # K = 3C = 384: two whole 64-deep blocks in each of 3 parts
    weight, bias = _linear(c, 3 * c, seed=3)
    full1 = torch.randn(rows, frames + 2, c)
    closed = dit_gemm.causal_conv(full1, weight, bias, split_k=3)
    opened = dit_gemm.causal_conv(full1, weight, bias, split_k=3, open_sum=True)
    assert isinstance(opened, dit_gemm.OpenSum) and opened.shape == closed.shape == (rows, frames, c)
    assert opened.parts.stride()[1:] == closed.stride() == ((frames + 2) * c, c, 1)
    assert torch.equal(opened.close(), closed)
    ln_w, ln_b = torch.randn(c), torch.randn(c)
    hist2 = torch.randn(rows, c, 2)
    caches = torch.zeros(2, rows, 2 * c, 2)
    want = ln_mish_window(closed, full1, hist2, ln_w, ln_b, 1e-5, caches[0])
    got = ln_mish_window(opened, full1, hist2, ln_w, ln_b, 1e-5, caches[1])
    assert torch.equal(got, want) and torch.equal(caches[1], caches[0])
    gate, shift, scale = _modulation(c, seed=2)
    x = torch.randn(rows, frames, c)
    assert torch.equal(residual_norm_modulate(x.clone(), gate, opened, shift, scale, eps=1e-6),
                       residual_norm_modulate(x.clone(), gate, closed, shift, scale, eps=1e-6))


def test_an_unsplit_gemm_returns_its_tensor_and_an_open_sum_is_a_bt_result_without_gelu(interpret):
    weight, bias = _linear(16, 64, seed=0)
    assert isinstance(dit_gemm.linear(torch.randn(2, 3, 64), weight, bias, split_k=1, open_sum=True), torch.Tensor)
    with pytest.raises(ValueError, match="without GELU"):
        dit_gemm.linear(torch.randn(2, 3, 64), weight, bias, gelu=True, open_sum=True)
    with pytest.raises(ValueError, match=r"\[B, T, N\]"):
        dit_gemm.linear(torch.randn(6, 64), weight, bias, open_sum=True)


@pytest.mark.parametrize("k", [512, 1536, 2048], ids=["proj", "conv", "fc2"])
def test_splits_are_the_part_counts_a_gemm_can_take(k):
    """The full-size DiT's proj, convs and fc2 (N = 512): every split `split_for` gives at any
    row count, which the consumers' warm-up compiles."""
    seen = {dit_gemm.split_for(rows, 512, k, dit_gemm.tile_for(rows)) for rows in range(1, 5000)}
    assert seen - {1} == dit_gemm.splits(512, k) and len(seen) > 1


@pytest.mark.parametrize("key,field", [("code2wav_open_split_sums", "open_split_sums"),
                                       ("code2wav_norm_writes_conv_window", "norm_writes_conv_window")])
def test_flags_parse_strictly_and_default_on(key, field):
    assert getattr(Code2WavOptions.from_extra({}), field) is True
    assert getattr(Code2WavOptions.from_extra({key: "false"}), field) is False
    with pytest.raises(FlagError, match=key):
        Code2WavOptions.from_extra({key: "sometimes"})


def _dit(hidden: int, seed: int = 4, device="cpu") -> DiT:
    torch.manual_seed(seed)
    dit = DiT(DiTConfig(hidden_size=hidden, depth=2, num_heads=2, head_dim=hidden // 2)).eval()
    with torch.no_grad():
        for p in dit.parameters():
            p.normal_(0, 0.05)
    return dit.to(device)


def _cuda_choice(options: Code2WavOptions, cfg: DiTConfig, device: torch.device) -> kernels.DiTKernels:
    return kernels.resolve(options, cfg, device, torch.float32)


def test_the_norm_step_writes_a_convs_window_bit_for_bit(interpret):
    """History frames from a strided cache view first, then the modulated frames: the block's cat
    of the same two, and the residual updated alike."""
    from stages.code2wav.dit_triton import residual_norm_modulate

    c = 32
    cache = torch.randn(3, 2 * c, 2)
    x, y = torch.randn(3, 5, c), torch.randn(3, 5, c)
    gate, shift, scale = _modulation(c, seed=4)
    x_plain, x_window = x.clone(), x.clone()
    plain = residual_norm_modulate(x_plain, gate, y, shift, scale, eps=1e-6)
    window = residual_norm_modulate(x_window, gate, y, shift, scale, eps=1e-6, history=cache[:, :c])
    assert window.shape == (3, 7, c) and window.is_contiguous()
    assert torch.equal(window, torch.cat([cache[:, :c].transpose(1, 2), plain], dim=1))
    assert torch.equal(x_window, x_plain)
    with pytest.raises(ValueError, match="history must be"):
        residual_norm_modulate(x.clone(), gate, y, shift, scale, eps=1e-6, history=cache[:2, :c])


def test_resolution_fuses_only_where_every_kernel_it_joins_runs(forced_cuda):
    cfg, cpu = DiTConfig(hidden_size=32, depth=1, num_heads=2, head_dim=16), torch.device("cpu")
    on = {"code2wav_open_split_sums": True, "code2wav_norm_writes_conv_window": True}
    chosen = _cuda_choice(Code2WavOptions.from_extra(on), cfg, cpu)
    assert chosen.open_sums and "added by the next fused kernel" in chosen.reasons()["linears"]
    assert chosen.conv_window and "writes each conv's input window" in chosen.reasons()["norm"]
    default = _cuda_choice(Code2WavOptions(), cfg, cpu)  # the flags' defaults: both on
    assert default.open_sums and default.conv_window
    off = {"code2wav_open_split_sums": False, "code2wav_norm_writes_conv_window": False}
    assert not _cuda_choice(Code2WavOptions.from_extra(off), cfg, cpu).open_sums
    assert not _cuda_choice(Code2WavOptions.from_extra(off), cfg, cpu).conv_window
    for off in ({"code2wav_fused_norm": False}, {"code2wav_fused_conv_norm": False}, {"code2wav_conv_gemm": False},
                {"code2wav_dit_tf32x3": False}):
        assert not _cuda_choice(Code2WavOptions.from_extra({**on, **off}), cfg, cpu).open_sums, off
    for off in ({"code2wav_fused_norm": False}, {"code2wav_frames_first_conv": False}):
        assert not _cuda_choice(Code2WavOptions.from_extra({**on, **off}), cfg, cpu).conv_window, off
    # the CPU's own choice (no interpreter forced to CUDA): channels-first, nothing fused
    assert not kernels.DiTKernels().conv_window and not kernels.DiTKernels().open_sums


@pytest.mark.parametrize("flags", [(True, False), (False, True), (True, True)], ids=["open-sums", "window", "both"])
def test_a_dit_with_the_fusions_equals_it_without_bit_for_bit(forced_cuda, monkeypatch, flags):
    """A frames-first DiT on the Triton kernels (the interpreter) decoding from random caches,
    every proj, fc2 and conv split in two: the velocity and both new caches equal the unfused
    DiT's, and the fusions really ran (sums left open, windows written by the norm step)."""
    from stages.code2wav import dit_triton

    monkeypatch.setattr(dit_gemm, "split_for", lambda rows, n, k, tile: 2 if k % (2 * tile.block_k) == 0 else 1)
    seen = {"open": 0, "window": 0}
    real_init, real_norm = dit_gemm.OpenSum.__init__, dit_triton.residual_norm_modulate

    def counting_init(self, *args, **kw):
        seen["open"] += 1
        real_init(self, *args, **kw)

    def counting_norm(*args, history=None, **kw):
        seen["window"] += history is not None
        return real_norm(*args, history=history, **kw)

    monkeypatch.setattr(dit_gemm.OpenSum, "__init__", counting_init)
    monkeypatch.setattr(dit_triton, "residual_norm_modulate", counting_norm)
    dit = _dit(128)  # proj K = 128, conv K = 384, fc2 K = 512: each splits in two whole 64-deep blocks
    cfg, rows, frames, cached = dit.cfg, 2, 6, 4
    x_in, t = torch.randn(rows, cfg.in_channels, frames), torch.rand(rows)
    cnn = torch.randn(cfg.depth, rows, 2 * cfg.hidden_size, 2)
    att = torch.randn(cfg.depth, rows, cfg.num_heads, cached, 2 * cfg.head_dim)
    runs = []
    for open_sums, window in ((False, False), flags):
        extra = {"code2wav_open_split_sums": open_sums, "code2wav_norm_writes_conv_window": window}
        dit.use_kernels(_cuda_choice(Code2WavOptions.from_extra(extra), cfg, torch.device("cpu")))
        seen.update(open=0, window=0)
        with torch.no_grad():
            runs.append((dit.forward_chunk(x_in, t, cnn, att), dict(seen)))
    (plain, none), (fused, count) = runs
    assert none == {"open": 0, "window": 0}
    assert count == {"open": 4 * cfg.depth if flags[0] else 0, "window": cfg.depth if flags[1] else 0}
    assert torch.equal(fused.velocity, plain.velocity)
    assert torch.equal(fused.cnn_cache, plain.cnn_cache) and torch.equal(fused.att_cache, plain.att_cache)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("rows", [2, 6], ids=["one-request", "three-requests"])
def test_cuda_full_width_dit_with_the_fusions_equals_it_without_and_replays_bit_for_bit(rows):
    """512 channels (fc2 K 2,048, the convs K 1,536, proj K 512) at one and three requests (2 and
    6 rows x 50 frames), sizes where `split_for` splits (proj at three only), with random caches:
    the DiT with both fusions equals the unfused one bit for bit, eagerly and replayed from a
    device graph."""
    device = torch.device("cuda")
    dit = _dit(512, device=device)
    cfg = dit.cfg
    x_in, t = torch.randn(rows, cfg.in_channels, 50, device=device), torch.rand(rows, device=device)
    caches = (torch.randn(cfg.depth, rows, 2 * cfg.hidden_size, 2, device=device),
              torch.randn(cfg.depth, rows, cfg.num_heads, 20, 2 * cfg.head_dim, device=device))
    unfused = {"code2wav_open_split_sums": False, "code2wav_norm_writes_conv_window": False}
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False), torch.no_grad():
        dit.use_kernels(_cuda_choice(Code2WavOptions.from_extra(unfused), dit.cfg, device))
        closed = dit.forward_chunk(x_in, t, *caches).velocity.clone()
        chosen = _cuda_choice(Code2WavOptions.from_extra({"code2wav_open_split_sums": True,
                                                          "code2wav_norm_writes_conv_window": True}), dit.cfg, device)
        assert chosen.open_sums and chosen.conv_window, chosen.reasons()
        dit.use_kernels(chosen)
        eager = dit.forward_chunk(x_in, t, *caches).velocity.clone()
        assert torch.equal(eager, closed)
        assert torch.equal(replayed(lambda: dit.forward_chunk(x_in, t, *caches).velocity), closed)
