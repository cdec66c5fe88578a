"""The DiT's causal convs as one 3xTF32 Triton GEMM over the frames-first window in place
(`stages.code2wav.dit_gemm.causal_conv`, the `code2wav_conv_gemm` stage flag) and its choice.

CPU cases run the GEMM under the Triton interpreter (numpy's fp32 dot, `precision="ieee"`, is the
conv to fp32 rounding; the rows that straddle two batch rows must be dropped, not shifted in);
the `gpu` cases run it compiled in a frames-first block and a whole DiT call, eager and replayed.

Run: python -m pytest tests/kernels/test_dit_conv_gemm.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stages.code2wav import kernels
from stages.code2wav.config import DiTConfig
from stages.code2wav.kernels import conv_layout, resolve
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.stages.code2wav_tiny import check_a_dit_path_on_cuda, frames_first_block_both_ways, use

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _conv(c_in: int, c_out: int, seed: int) -> torch.nn.Conv1d:
    torch.manual_seed(seed)
    return torch.nn.Conv1d(c_in, c_out, 3)


def _flat(conv: torch.nn.Conv1d) -> torch.Tensor:
    """[C_out, 3 * C_in] with k = tap * C_in + c, as the frames-first block hands it."""
    return conv.weight.detach().permute(0, 2, 1).contiguous().view(conv.out_channels, -1)


@pytest.mark.parametrize("b,t", [(1, 1), (3, 7), (4, 50)], ids=lambda v: str(v))
def test_the_gemm_is_the_conv_on_the_interpreter(interpret, b, t):
    from stages.code2wav.dit_gemm import causal_conv

    conv = _conv(16, 12, seed=t)
    window = torch.randn(b, t + 2, 16)
    want = conv(window.transpose(1, 2)).transpose(1, 2)
    got = causal_conv(window, _flat(conv), conv.bias.detach(), precision="ieee")
    assert got.shape == (b, t, 12) and got.stride() == ((t + 2) * 12, 12, 1)  # a view of the padded rows
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    # Another batch row's frames never leak in: change only batch row 0, rows 1.. stay put.
    window[0] += 1.0
    again = causal_conv(window, _flat(conv), conv.bias.detach(), precision="ieee")
    assert torch.equal(again[1:], got[1:]) and not torch.allclose(again[0], got[0])


def test_the_gemm_without_bias_and_with_a_split_k_sum(interpret):
    from stages.code2wav.dit_gemm import causal_conv

    conv = _conv(128, 32, seed=1)  # K = 384: two whole 64-deep blocks a part
    window = torch.randn(2, 9, 128)
    want = F.conv1d(window.transpose(1, 2), conv.weight.detach()).transpose(1, 2)
    for split in (1, 2):
        got = causal_conv(window, _flat(conv), None, precision="ieee", split_k=split)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_gemm_refuses_what_it_cannot_read_in_place(interpret):
    from stages.code2wav.dit_gemm import causal_conv

    conv = _conv(16, 8, seed=0)
    window = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="contiguous fp32"):
        causal_conv(window.transpose(0, 1).contiguous().transpose(0, 1), _flat(conv), None)
    with pytest.raises(ValueError, match="not taps x 16"):
        causal_conv(window, torch.zeros(8, 40), None)
    with pytest.raises(ValueError, match="16-byte aligned"):
        causal_conv(torch.randn(2, 5, 6), torch.zeros(8, 18), None)
    with pytest.raises(ValueError, match="not taps x"):
        causal_conv(window[:, :2].contiguous(), _flat(conv), None)  # a window shorter than the taps


def test_flag_parses_strictly_and_defaults_on():
    assert Code2WavOptions.from_extra({}).conv_gemm is True
    assert Code2WavOptions.from_extra({"code2wav_conv_gemm": "false"}).conv_gemm is False
    with pytest.raises(FlagError, match="code2wav_conv_gemm"):
        Code2WavOptions.from_extra({"code2wav_conv_gemm": "2"})


@pytest.mark.parametrize("extra,why", [
    ({"code2wav_conv_gemm": False}, "code2wav_conv_gemm is false"),
    ({"token2wav_allow_tf32": "conv"}, "TF32 convs asked for"),
    ({"code2wav_dit_tf32x3": False}, "the linears are not 3xTF32 GEMMs"),
], ids=["flag-off", "tf32-conv-mode", "cublas-linears"])
def test_resolution_keeps_cudnn_where_the_gemm_is_not_wanted(interpret, monkeypatch, extra, why):
    """Forced to the CUDA branch on the CPU (the interpreter compiles nothing): each rule that
    keeps cuDNN says so, and the default takes the GEMM."""
    monkeypatch.setattr(kernels, "is_cuda", lambda device: True)
    monkeypatch.setattr(kernels, "tf32_tensor_cores", lambda device: True)
    cfg = DiTConfig(hidden_size=32, depth=1, num_heads=2, head_dim=16)
    cpu = torch.device("cpu")
    chosen = resolve(Code2WavOptions.from_extra(extra), cfg, cpu, torch.float32).conv
    assert chosen.frames_first and chosen.gemm is None and chosen.gemm_name == "cudnn" and why in chosen.reason
    default = resolve(Code2WavOptions(), cfg, cpu, torch.float32).conv
    assert default.gemm is not None and default.gemm_name == "tf32x3" and "3xTF32 Triton GEMMs" in default.reason


def test_a_block_with_the_gemm_and_the_fused_norm_matches_the_eager_block(interpret, monkeypatch):
    monkeypatch.setattr(kernels, "is_cuda", lambda device: True)
    chosen = conv_layout(True, torch.device("cpu"), fused_norm=True, channels=24, gemm_off=None)
    assert chosen.gemm is not None and chosen.ln_mish is not None
    (want, want_cache), (got, got_cache) = frames_first_block_both_ways(24, ln_mish=chosen.ln_mish,
                                                                        conv_gemm=chosen.gemm)
    # The interpreter's 3xTF32 dot is an fp32 numpy dot: fp32 rounding apart from the conv.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_cache, want_cache, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@needs_cuda
def test_cuda_block_with_conv_gemms_matches_cudnn_in_fp32():
    chosen = conv_layout(True, torch.device("cuda"), fused_norm=True, channels=512, gemm_off=None)
    assert chosen.gemm is not None, chosen.reason
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        (want, want_cache), (got, got_cache) = frames_first_block_both_ways(
            512, ln_mish=chosen.ln_mish, conv_gemm=chosen.gemm, device="cuda", std=0.05, rows=6, frames=50)
    # 3xTF32 against cuDNN's fp32: both fp32-accurate, summed in other orders.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_cache, want_cache, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_with_conv_gemms_matches_and_replays_bit_identically():
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        check_a_dit_path_on_cuda(lambda dit: use(dit, conv=conv_layout(
            True, torch.device("cuda"), fused_norm=True, channels=dit.cfg.hidden_size, gemm_off=None)), rows=4)
