"""HiFT's stride-1 convs as 3xTF32 Triton implicit GEMMs (`hift_conv_triton`,
`code2wav_hift_conv_gemm`) and their wiring.

The CPU cases run the kernel under the Triton interpreter and hold it to `F.conv1d` within fp32
rounding over HiFT's kinds of conv (dilated, 'same'-padded, biased or not, odd sizes); the `gpu`
cases hold the compiled 3xTF32 kernel to an fp64 reference no further than cuDNN's fp32 conv is,
and a full-size HiFT call with it to the cuDNN call within fp32 rounding, eagerly and replayed
from a device graph (equal bit for bit to its own eager call).

Run: python -m pytest tests/kernels/test_hift_conv.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from stages.code2wav.config import HiFTConfig
from stages.code2wav.hift import HiFTGenerator, fold_weight_norm, gemm_ready
from stages.code2wav.kernels import HiFTConvKernel, SnakeKernel, hift_conv_kernel
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.kernels.hift_graphs import decode_eager_and_replayed

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# (B, Cin, Cout, T, taps, dilation, padding, bias): HiFT's kinds of conv at small widths, and edges
# (fewer frames than the receptive field, one frame, channel counts off every tile).
SHAPES = [
    (2, 16, 16, 70, 3, 1, 1, True),
    (1, 8, 8, 33, 11, 5, 25, True),
    (3, 5, 18, 9, 7, 1, 3, False),
    (1, 80, 40, 20, 7, 1, 3, True),
    (2, 12, 12, 1, 7, 3, 9, True),
    (1, 70, 66, 130, 3, 3, 3, True),
]


def _case(b, cin, cout, t, taps, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, cin, t, generator=gen) * 2
    weight = torch.randn(cout, cin, taps, generator=gen) / (cin * taps) ** 0.5
    bias = torch.randn(cout, generator=gen)
    return x.to(device), weight.to(device), bias.to(device)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_kernel_matches_conv1d_on_the_interpreter(interpret, shape, precision):
    from stages.code2wav.hift_conv_triton import conv1d

    b, cin, cout, t, taps, dilation, padding, has_bias = shape
    x, weight, bias = _case(b, cin, cout, t, taps, seed=t)
    bias = bias if has_bias else None
    want = F.conv1d(x, weight, bias, padding=padding, dilation=dilation)
    got = conv1d(x, weight, bias, dilation=dilation, padding=padding, precision=precision)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # A wrong tap offset or lost padding is far outside that: the kernel does read the taps.
    if taps > 1:
        shifted = F.conv1d(x, weight.roll(1, dims=2), bias, padding=padding, dilation=dilation)
        assert not torch.allclose(got, shifted, rtol=1e-3, atol=1e-3)


def test_kernel_refuses_what_it_cannot_compute(interpret):
    from stages.code2wav.hift_conv_triton import conv1d

    x, weight, bias = _case(1, 4, 4, 10, 3, seed=0)
    with pytest.raises(ValueError, match="contiguous fp32"):
        conv1d(x.transpose(1, 2).contiguous().transpose(1, 2), weight, bias)
    with pytest.raises(ValueError, match="contiguous fp32"):
        conv1d(x.double(), weight, bias)
    with pytest.raises(ValueError, match="takes 4"):
        conv1d(torch.zeros(1, 5, 10), weight, bias)
    with pytest.raises(ValueError, match="bias"):
        conv1d(x, weight, torch.zeros(3))
    with pytest.raises(ValueError, match="too few"):
        conv1d(torch.zeros(1, 4, 1), weight, bias, dilation=2)
    with pytest.raises(ValueError, match="dilation"):
        conv1d(x, weight, bias, dilation=0)


def _hift() -> HiFTGenerator:
    torch.manual_seed(0)
    hift = HiFTGenerator(HiFTConfig(base_channels=16, f0_predictor_channels=16)).eval()
    with torch.no_grad():  # weights at a scale where every conv's output matters
        for p in hift.parameters():
            p.normal_(0, 0.3)
    fold_weight_norm(hift)  # as build_hift does: each conv's weight is then one tensor
    return hift


def test_the_routed_convs_are_every_stride_one_conv_of_the_generators_blocks():
    hift = _hift()
    routed = hift.gemm_convs()
    resblock_convs = sum(len(b.convs1) + len(b.convs2) for b in (*hift.resblocks, *hift.source_resblocks))
    assert len(routed) == resblock_convs + 2 and hift.conv_pre in routed and hift.conv_post in routed
    assert all(gemm_ready(c) for c in routed)
    assert not any(gemm_ready(c) for c in hift.ups)  # transposed: cuDNN's
    assert not all(gemm_ready(c) for c in hift.source_downs)  # strided downsamplers: cuDNN's


def test_use_kernels_routes_every_routed_conv_through_the_gemm():
    """A spy GEMM sees every routed conv of an inference call once, with its own weight,
    dilation and padding; with None wired back, the modules run."""
    hift, seen = _hift(), []

    def spy(x, weight, bias, *, dilation, padding):
        seen.append((weight.data_ptr(), dilation, padding))
        return F.conv1d(x, weight, bias, dilation=dilation, padding=padding)

    hift.use_kernels(SnakeKernel(), HiFTConvKernel(spy, "spy"))
    mel = torch.randn(1, 80, 6)
    with_spy, _ = hift.inference(mel, torch.zeros(1, 1, 0), generator=torch.Generator().manual_seed(1))
    want = {(c.weight.data_ptr(), c.dilation[0], c.padding[0]) for c in hift.gemm_convs()}
    assert hift.conv_kernel == "tf32x3" and set(seen) == want and len(seen) == len(hift.gemm_convs())
    hift.use_kernels(SnakeKernel(), None)
    seen.clear()
    plain, _ = hift.inference(mel, torch.zeros(1, 1, 0), generator=torch.Generator().manual_seed(1))
    assert hift.conv_kernel == "cudnn" and not seen and torch.equal(plain, with_spy)


def test_a_hift_call_with_the_kernel_matches_the_modules_on_the_interpreter(interpret):
    hift = _hift()
    mel = torch.randn(2, 80, 5, generator=torch.Generator().manual_seed(3))
    want, _ = hift.inference(mel, torch.zeros(2, 1, 0), generator=torch.Generator().manual_seed(1))
    chosen = hift_conv_kernel(True, torch.device("cpu"), "off", hift.gemm_convs())
    assert chosen.name == "tf32x3", chosen.reason
    hift.use_kernels(SnakeKernel(), chosen)
    got, _ = hift.inference(mel, torch.zeros(2, 1, 0), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_flag_parses_strictly_and_is_opt_in_until_measured():
    assert Code2WavOptions.from_extra({}).hift_conv_gemm is False
    assert Code2WavOptions.from_extra({"code2wav_hift_conv_gemm": "true"}).hift_conv_gemm is True
    with pytest.raises(FlagError, match="code2wav_hift_conv_gemm"):
        Code2WavOptions.from_extra({"code2wav_hift_conv_gemm": "maybe"})


def test_resolution_says_why_cudnn_runs(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu, convs = torch.device("cpu"), _hift().gemm_convs()
    off = hift_conv_kernel(False, cpu, "off", convs)
    assert off.fn is None and off.name == "cudnn" and "code2wav_hift_conv_gemm is false" in off.reason
    assert "TF32 convs asked for (token2wav_allow_tf32: conv)" in hift_conv_kernel(True, cpu, "conv", convs).reason
    assert "TRITON_INTERPRET" in hift_conv_kernel(True, cpu, "off", convs).reason
    assert "not CUDA (meta)" in hift_conv_kernel(True, torch.device("meta"), "off", convs).reason


def test_a_conv_gemm_that_fails_to_compile_leaves_cudnn(monkeypatch, caplog):
    """On CUDA every routed shape is compiled at resolution; a compiler failure keeps cuDNN."""
    from stages.code2wav import hift_conv_triton, kernels

    warmed = []

    def broken(device, shapes):
        warmed.append(list(shapes))
        raise RuntimeError("no ptxas")

    monkeypatch.setattr(hift_conv_triton, "warm_up", broken)
    monkeypatch.setattr(kernels, "is_cuda", lambda device: True)
    monkeypatch.setattr(kernels, "triton_unavailable_reason", lambda device: None)
    hift = _hift()
    with caplog.at_level(logging.WARNING):
        chosen = hift_conv_kernel(True, torch.device("cpu"), "off", hift.gemm_convs())
    assert chosen.fn is None and "failed to compile (RuntimeError: no ptxas)" in chosen.reason
    assert "HiFT: cuDNN's convs kept" in caplog.text
    shapes = {(c.in_channels, c.out_channels, c.kernel_size[0], True) for c in hift.gemm_convs()}
    assert warmed == [sorted(shapes)]  # each compiled variant once: dilation and padding are runtime values
    assert len(shapes) < len(hift.gemm_convs())


# ---- CUDA ------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("shape", [(1, 256, 256, 464, 11, 5, 25, True), (8, 64, 64, 6961, 7, 3, 9, True),
                                   (3, 512, 18, 20, 7, 1, 3, False)], ids=str)
def test_cuda_kernel_is_as_close_to_fp64_as_cudnns_fp32(shape):
    from stages.code2wav.hift_conv_triton import conv1d
    from stages.platform.precision import FP32, precision_scope

    b, cin, cout, t, taps, dilation, padding, has_bias = shape
    x, weight, bias = _case(b, cin, cout, t, taps, seed=7, device="cuda")
    bias = bias if has_bias else None
    exact = F.conv1d(x.double(), weight.double(), None if bias is None else bias.double(), padding=padding,
                     dilation=dilation)
    with precision_scope(torch.device("cuda"), FP32):
        cudnn = F.conv1d(x, weight, bias, padding=padding, dilation=dilation)
    got = conv1d(x, weight, bias, dilation=dilation, padding=padding)
    scale = exact.abs().max().item()
    err, cudnn_err = (got.double() - exact).abs().max().item(), (cudnn.double() - exact).abs().max().item()
    assert err <= max(2 * cudnn_err, 1e-6 * scale), (err, cudnn_err, scale)


@pytest.mark.gpu
@needs_cuda
def test_cuda_full_size_hift_with_the_kernel_matches_cudnn_and_replays_bit_for_bit(deterministic):
    """A steady streaming chunk's shapes (58 mel frames, 3840 cached source samples), 3 rows, the
    same noise, TF32 off: the audio within fp32 rounding of cuDNN's convs; the decode captured in
    a device graph replays its eager audio bit for bit. Under deterministic kernels, as every stage
    process runs (D-DET-1): with TF32 off cuDNN's remaining fp32 convs (the upsampling's transposed
    convs) differ run to run in the low bits otherwise, eager against eager too (H100, 2026-12-05:
    80,133 of 83,520 samples, with or without this kernel; the kernel alone replays bit for bit)."""
    from stages.code2wav.modules import build_hift
    from stages.platform.precision import FP32, precision_scope

    dev = torch.device("cuda")
    hift = build_hift(HiFTConfig(), seed=3, weights_dir=None).to(dev).eval()
    hift.init_buffers()
    gen = torch.Generator().manual_seed(0)
    mel = (torch.randn(3, 80, 58, generator=gen) * 2).to(dev)
    cache = (torch.randn(3, 1, 3840, generator=gen) * 0.1).to(dev)

    def run() -> torch.Tensor:
        return hift.inference(mel, cache, generator=torch.Generator(device="cuda").manual_seed(7))[0]

    with precision_scope(dev, FP32):
        want = run()
        chosen = hift_conv_kernel(True, dev, "off", hift.gemm_convs())
        assert chosen.name == "tf32x3", chosen.reason
        hift.use_kernels(SnakeKernel(), chosen)
        got = run()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        eager, captured = decode_eager_and_replayed(hift, mel, cache, seed=7)
    assert torch.equal(captured, eager)
