"""The DiT conv block's LayerNorm + Mish + conv2 window + cache writes as one Triton launch
(`stages.code2wav.dit_conv_triton`, the `code2wav_fused_conv_norm` stage flag) and its use.

CPU cases run the kernel under the Triton interpreter against the eager ops (LayerNorm, Mish, the
cat, the two history copies); the `gpu` cases run it compiled inside a frames-first block and a
whole DiT call, eager and replayed from a device graph.

Run: python -m pytest tests/kernels/test_dit_conv_norm.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from stages.code2wav import kernels
from stages.code2wav.kernels import conv_layout
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.stages.code2wav_tiny import check_a_dit_path_on_cuda, frames_first_block_both_ways, use

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(b: int, t: int, c: int, *, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    cache = rand(b, 2 * c, 2)
    return rand(b, t, c, scale=3.0), rand(b, t + 2, c), cache, rand(c), rand(c, scale=0.5)


def _eager(h1, full1, cache, weight, bias, eps=1e-5):
    """What the frames-first block runs between its convs: (conv2's window, the new cache)."""
    c = h1.shape[2]
    h = F.mish(F.layer_norm(h1, (c,), weight, bias, eps))
    full2 = torch.cat([cache[:, c:].transpose(1, 2), h], dim=1)
    out_cache = torch.cat([full1[:, -2:].transpose(1, 2), full2[:, -2:].transpose(1, 2)], dim=1)
    return full2, out_cache


@pytest.mark.parametrize("t", [1, 2, 7], ids=lambda t: f"T{t}")  # a window shorter than the history too
@pytest.mark.parametrize("c", [48, 64], ids=["C48-masked", "C64"])
def test_kernel_matches_the_eager_ops_on_the_interpreter(interpret, t, c):
    from stages.code2wav.dit_conv_triton import ln_mish_window

    h1, full1, cache, weight, bias = _inputs(2, t, c)
    want_window, want_cache = _eager(h1, full1, cache, weight, bias)
    out_cache = torch.full((2, 2 * c, 2), float("nan"))
    window = ln_mish_window(h1, full1, cache[:, c:], weight, bias, 1e-5, out_cache)
    assert window.shape == (2, t + 2, c) and window.is_contiguous()
    torch.testing.assert_close(window, want_window, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_cache, want_cache, rtol=1e-5, atol=1e-5)  # every entry written
    assert torch.equal(window[:, :2], cache[:, c:].transpose(1, 2))  # cached frames copied as they were


def test_kernel_in_bfloat16_rounds_as_the_eager_ops_store(interpret):
    from stages.code2wav.dit_conv_triton import ln_mish_window

    h1, full1, cache, weight, bias = _inputs(2, 5, 64, dtype=torch.bfloat16)
    want_window, _ = _eager(h1, full1, cache, weight, bias)
    window = ln_mish_window(h1, full1, cache[:, 64:], weight, bias, 1e-5, torch.empty(2, 128, 2, dtype=torch.bfloat16))
    assert window.dtype == torch.bfloat16
    torch.testing.assert_close(window.float(), want_window.float(), rtol=2e-2, atol=2e-2)


def test_kernel_refuses_a_cache_that_overlaps_the_frames_it_reads(interpret):
    from stages.code2wav.dit_conv_triton import ln_mish_window

    h1, full1, cache, weight, bias = _inputs(1, 4, 16)
    with pytest.raises(ValueError, match="overlaps"):
        ln_mish_window(h1, full1, cache[:, 16:], weight, bias, 1e-5, cache)  # the history's own buffer
    with pytest.raises(ValueError, match="full1 must be"):
        ln_mish_window(h1, full1[:, 1:], cache[:, 16:], weight, bias, 1e-5, torch.empty(1, 32, 2))
    with pytest.raises(ValueError, match="affine"):
        ln_mish_window(h1, full1, cache[:, 16:], None, bias, 1e-5, torch.empty(1, 32, 2))


def test_flag_parses_strictly_and_defaults_on():
    assert Code2WavOptions.from_extra({}).fused_conv_norm is True
    assert Code2WavOptions.from_extra({"code2wav_fused_conv_norm": False}).fused_conv_norm is False
    with pytest.raises(FlagError, match="code2wav_fused_conv_norm"):
        Code2WavOptions.from_extra({"code2wav_fused_conv_norm": "maybe"})


def test_resolution_on_the_cpu_keeps_the_modules_ops():
    chosen = conv_layout(True, torch.device("cpu"), fused_norm=True)
    assert not chosen.frames_first and chosen.ln_mish is None and chosen.norm_name == "eager"


def test_a_block_wired_with_the_kernel_matches_the_eager_block(interpret, monkeypatch, caplog):
    """The frames-first block with the kernel (forced on the CPU, where the engine would not pick
    frames-first) gives the eager block's output and cache; a kernel that fails to compile leaves
    the eager ops, and says why."""
    monkeypatch.setattr(kernels, "is_cuda", lambda device: True)
    chosen = conv_layout(True, torch.device("cpu"), fused_norm=True, channels=24)
    assert chosen.frames_first and chosen.ln_mish is not None and chosen.norm_name == "triton"
    (want, want_cache), (got, got_cache) = frames_first_block_both_ways(24, ln_mish=chosen.ln_mish)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_cache, want_cache, rtol=1e-5, atol=1e-5)

    from stages.code2wav import dit_conv_triton

    monkeypatch.setattr(dit_conv_triton, "warm_up", lambda *a: (_ for _ in ()).throw(RuntimeError("no ptxas")))
    with caplog.at_level(logging.WARNING):
        broken = conv_layout(True, torch.device("cpu"), fused_norm=True, channels=24)
    assert broken.frames_first and broken.ln_mish is None and "no ptxas" in broken.reason
    off = conv_layout(True, torch.device("cpu"), fused_norm=False, channels=24)
    assert off.ln_mish is None and "code2wav_fused_conv_norm is false" in off.reason


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_block_with_the_kernel_matches_the_eager_block(dtype):
    ln_mish = conv_layout(True, torch.device("cuda"), fused_norm=True, dtype=dtype).ln_mish
    assert ln_mish is not None
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        (want, want_cache), (got, got_cache) = frames_first_block_both_ways(
            512, ln_mish=ln_mish, device="cuda", dtype=dtype, std=0.05, rows=6, frames=50)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(got_cache, want_cache, rtol=tol, atol=tol)
    assert torch.equal(got_cache[:, :512], want_cache[:, :512])  # conv1's history: copied, not computed


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_with_the_kernel_matches_and_replays_bit_identically():
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        check_a_dit_path_on_cuda(lambda dit: use(dit, conv=conv_layout(
            True, torch.device("cuda"), fused_norm=True, channels=dit.cfg.hidden_size)), rows=4)
