"""Small-chunk attention as one Triton kernel (`stages.code2wav.dit_flash`) and its selection.

CPU cases run the kernel under the Triton interpreter against `attention_by_matmul` (the path it
replaces) and an fp64 softmax; the `gpu` cases run it compiled in a DiT, against the GEMMs, and
replay a captured graph bit for bit.

Run: python -m pytest tests/kernels/test_dit_flash.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch

from stages.code2wav.dit import attention_by_matmul
from stages.code2wav.kernels import attention_kernel
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.stages.code2wav_tiny import check_a_dit_path_on_cuda, random_dit, use


def select_attention(dit, max_requests: int, device: torch.device, *, triton: bool = False) -> str:
    """Route `dit`'s attention as `kernels.attention_kernel` chooses for it; what it said."""
    dtype = dit.in_proj.weight.dtype
    return use(dit, attention=attention_kernel(max_requests, dit.cfg, device, dtype, triton=triton)).attention.reason

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _case(b, t, h, d, length, *, device="cpu", seed=0):
    """q as the q/k norm kernel leaves it ([B, T, H, D] memory) and the step's K|V cache
    [B, H, L, 2D], scaled so that the softmax is far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    q = (3 * torch.randn(b, t, h, d, generator=gen)).to(device)
    kv = (3 * torch.randn(b, h, length, 2 * d, generator=gen)).to(device)
    return q, kv


def _fp64(q, kv):
    d = q.shape[-1]
    qh = q.double().transpose(1, 2)
    k, v = kv[..., :d].double(), kv[..., d:].double()
    p = torch.softmax(qh @ k.transpose(-1, -2) / d**0.5, dim=-1)
    return (p @ v).transpose(1, 2)  # [B, T, H, D]


@pytest.mark.parametrize(
    "b, t, h, d, length",
    [(2, 5, 2, 16, 5), (4, 50, 2, 16, 130), (1, 17, 3, 12, 64), (2, 3, 1, 32, 1)],
    ids=["first-chunk", "cache-over-two-blocks", "odd-head-dim", "one-frame"],
)
def test_matches_the_gemms_and_fp64_on_the_interpreter(interpret, b, t, h, d, length):
    from stages.code2wav import dit_flash

    q, kv = _case(b, t, h, d, length)
    out = dit_flash.attention(q, kv)
    assert out.shape == (b, t, h, d) and out.is_contiguous()
    torch.testing.assert_close(out.double(), _fp64(q, kv), rtol=1e-5, atol=1e-5)
    gemms = attention_by_matmul(q.transpose(1, 2), kv[..., :d], kv[..., d:]).transpose(1, 2)
    torch.testing.assert_close(out, gemms, rtol=1e-5, atol=1e-5)


def test_reads_a_cache_slice_and_a_transposed_q_in_place(interpret):
    """The DiT hands q as a [B, H, T, D] view of [B, T, H, D] memory and the cache as a slice of
    the CFM's step buffer: strides are read, nothing is copied first."""
    from stages.code2wav import dit_flash

    q, arena = _case(2, 6, 2, 16, 40)
    kv = arena[:, :, 4:30]  # a window of the arena: non-zero offset, strided rows
    out = dit_flash.attention(q.transpose(1, 2).transpose(1, 2), kv)
    torch.testing.assert_close(out.double(), _fp64(q, kv.contiguous()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case, message", [("bf16", "fp32"), ("wrong-heads", "kv must be"), ("empty-cache", "kv must be"),
                                           ("strided-d", "unit last stride")])
def test_refuses_what_it_cannot_read(interpret, case, message):
    from stages.code2wav import dit_flash

    q, kv = _case(1, 4, 2, 16, 8)
    if case == "bf16":
        q, kv = q.bfloat16(), kv.bfloat16()
    elif case == "wrong-heads":
        kv = kv[:, :1]
    elif case == "empty-cache":
        kv = kv[:, :, :0]
    elif case == "strided-d":
        q = q.transpose(2, 3).contiguous().transpose(2, 3)  # D strided by H
    with pytest.raises(ValueError, match=message):
        dit_flash.attention(q, kv)


@pytest.mark.parametrize("cached", [9, 70], ids=["one-block", "two-blocks"])
def test_a_dit_with_it_matches_the_gemms_on_the_interpreter(interpret, cached):
    dit = random_dit(seed=3)
    x_in, t = torch.randn(4, 320, 6), torch.rand(4)
    cache = torch.randn(2, 4, 2, cached, 32)  # [depth, N, H, L, 2D] of the tiny DiT
    with torch.no_grad():
        assert "batched GEMMs" not in select_attention(dit, 2, torch.device("cpu"), triton=True)
        assert dit.attention_kernel == "triton<=2" and all(b.attn.flash for b in dit.blocks)
        got = dit.forward_chunk(x_in, t, None, cache)
        for block in dit.blocks:  # the same rows through the GEMMs it replaces
            block.attn.flash = None
        want = dit.forward_chunk(x_in, t, None, cache)
    torch.testing.assert_close(got.velocity, want.velocity, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.att_cache, want.att_cache, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.att_cache[0], want.att_cache[0])  # block 0's K|V: written before any attention


def test_select_attention_says_why_the_gemms_stay(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    dit = random_dit()
    cpu = torch.device("cpu")
    assert select_attention(dit, 4, cpu, triton=False).startswith("scaled_dot_product_attention (the CPU)")
    assert dit.attention_kernel == "sdpa" and not dit.blocks[0].attn.flash
    monkeypatch.setattr("stages.code2wav.kernels.is_cpu", lambda device: False)  # a device, not the CPU
    said = select_attention(dit, 4, torch.device("meta"), triton=True)
    assert "not CUDA (meta)" in said and dit.attention_kernel == "matmul<=4"
    assert select_attention(dit, 4, torch.device("meta"), triton=False).endswith("scaled_dot_product_attention above")
    assert "bfloat16" in select_attention(random_dit(dtype=torch.bfloat16), 4, torch.device("meta"), triton=True)


def test_a_kernel_that_fails_to_compile_leaves_the_gemms(interpret, monkeypatch, caplog):
    from stages.code2wav import dit_flash

    def broken(*args, **kwargs):
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(dit_flash, "attention", broken)
    dit = random_dit()
    with caplog.at_level(logging.WARNING):
        said = select_attention(dit, 4, torch.device("cpu"), triton=True)
    assert "ptxas died" in said and not dit.blocks[0].attn.flash
    assert any("ptxas died" in r.getMessage() for r in caplog.records)


def test_the_flag_is_strict_and_on_by_default():
    assert Code2WavOptions.from_extra({}).triton_attention is True
    assert Code2WavOptions.from_extra({"code2wav_triton_attention": False}).triton_attention is False
    assert Code2WavOptions.from_extra({"code2wav_triton_attention": "true"}).triton_attention is True
    with pytest.raises(FlagError, match="code2wav_triton_attention"):
        Code2WavOptions.from_extra({"code2wav_triton_attention": "often"})


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("b, length", [(2, 50), (2, 400), (8, 250)],
                         ids=["one-request-first-chunk", "one-request-steady", "four-requests-cached"])
def test_cuda_matches_fp64_as_closely_as_the_gemms(b, length):
    from stages.code2wav import dit_flash

    q, kv = _case(b, 50, 8, 64, length, device="cuda")
    ref = _fp64(q, kv)
    out = dit_flash.attention(q, kv)
    gemms = attention_by_matmul(q.transpose(1, 2), kv[..., :64], kv[..., 64:]).transpose(1, 2)
    err, err_gemms = (out.double() - ref).abs().max().item(), (gemms.double() - ref).abs().max().item()
    assert err < 4 * max(err_gemms, 1e-6), (err, err_gemms)
    assert torch.equal(dit_flash.attention(q, kv), out)


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_with_it_matches_the_gemms_and_replays_bit_identically():
    def switch(dit):
        select_attention(dit, 4, torch.device("cuda"))  # the GEMMs first: `want` is theirs
        assert select_attention(dit, 4, torch.device("cuda"), triton=True).startswith("one Triton kernel")

    check_a_dit_path_on_cuda(switch, rows=6)
