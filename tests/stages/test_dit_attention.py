"""The DiT's attention for small chunks as batched GEMMs (`dit.attention_by_matmul`), where it
runs (`kernels.attention_kernel`, the `code2wav_matmul_attention_requests` stage flag) and what a run
record says about it.

CPU cases compare the GEMM path with `scaled_dot_product_attention` on the same inputs and check
the routing; the `gpu` cases run a whole DiT call with it on CUDA, eager and replayed.

Run: python -m pytest tests/stages/test_dit_attention.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stages.code2wav import dit as dit_module
from stages.code2wav import kernels
from stages.code2wav.dit import attention_by_matmul
from stages.code2wav.options import MATMUL_ATTENTION_DEFAULT, MATMUL_ATTENTION_KEY, Code2WavOptions
from stages.flags import FlagError
from tests.stages.code2wav_tiny import check_a_dit_path_on_cuda, random_dit, single_thread, tiny_config, use  # noqa: F401


def select_attention(dit, max_requests: int, device: torch.device, *, triton: bool = False) -> str:
    """Route `dit`'s attention as `kernels.attention_kernel` chooses for it; what it said."""
    choice = kernels.attention_kernel(max_requests, dit.cfg, device, dit.in_proj.weight.dtype, triton=triton)
    return use(dit, attention=choice).attention.reason

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _case(b=3, h=8, t=50, cached=400, d=64, dtype=torch.float32, device="cpu", seed=0):
    """q as the attention makes it (a transposed [B, T, H, D] view) and k, v as slices of a
    [B, H, T + L, 2D] K|V cache, the layout `Attention.forward` hands over."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, d, generator=gen).to(device=device, dtype=dtype).transpose(1, 2)
    cache = torch.randn(b, h, t + cached, 2 * d, generator=gen).to(device=device, dtype=dtype)
    return q, cache[..., :d], cache[..., d:]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("b, t, cached", [(1, 50, 400), (3, 50, 0), (2, 7, 13)])
def test_the_gemm_path_computes_attention(dtype, tol, b, t, cached):
    q, k, v = _case(b=b, t=t, cached=cached, dtype=dtype)
    want = F.scaled_dot_product_attention(q, k, v)
    got = attention_by_matmul(q, k, v)
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_the_gemm_path_is_a_pure_function_of_its_inputs():
    q, k, v = _case(b=2)
    before = [x.clone() for x in (q, k, v)]
    first = attention_by_matmul(q, k, v)
    assert torch.equal(attention_by_matmul(q, k, v), first)
    assert all(torch.equal(x, y) for x, y in zip((q, k, v), before))  # nothing written in place


def test_select_attention_routes_small_chunks_on_a_device_only():
    dit = random_dit()
    assert "CPU" in select_attention(dit, 8, torch.device("cpu"))
    assert dit.attention_kernel == "sdpa" and all(b.attn.matmul_rows == 0 for b in dit.blocks)
    # Only the device's type is read: no CUDA device is needed to check the routing.
    said = select_attention(dit, 8, torch.device("cuda"))
    assert "8 requests" in said and dit.attention_kernel == "matmul<=8"
    assert all(b.attn.matmul_rows == 16 for b in dit.blocks)  # 2 DiT rows a request (CFG)
    assert "is 0" in select_attention(dit, 0, torch.device("cuda"))
    assert dit.attention_kernel == "sdpa" and all(b.attn.matmul_rows == 0 for b in dit.blocks)


@pytest.mark.parametrize("rows, routed", [(4, True), (6, False)])
def test_a_chunk_takes_the_gemm_path_up_to_the_row_limit(monkeypatch, rows, routed):
    dit = random_dit(seed=1)
    x_in, t = torch.randn(rows, 320, 6), torch.rand(rows)
    with torch.no_grad():
        want = dit.forward_chunk(x_in, t, None, None)
        calls = []

        def counted(q, k, v):
            calls.append(q.shape[0])
            return attention_by_matmul(q, k, v)

        monkeypatch.setattr(dit_module, "attention_by_matmul", counted)
        for block in dit.blocks:
            block.attn.matmul_rows = 4  # what attention_kernel(2, a device) sets
        got = dit.forward_chunk(x_in, t, None, None)
    assert calls == ([rows] * len(dit.blocks) if routed else [])
    torch.testing.assert_close(got.velocity, want.velocity, rtol=1e-4, atol=1e-4)
    # Block 0's K/V are made before its attention, so the path left them alone; later blocks'
    # follow from its output.
    assert torch.equal(got.att_cache[0], want.att_cache[0])
    torch.testing.assert_close(got.att_cache, want.att_cache, rtol=1e-4, atol=1e-4)


def test_a_bf16_dit_keeps_scaled_dot_product_attention(monkeypatch):
    # In bf16 the GEMM path would round the logits before the softmax; the fused kernels do not.
    dit = random_dit(seed=2, dtype=torch.bfloat16)
    calls = []
    monkeypatch.setattr(dit_module, "attention_by_matmul", lambda q, k, v: calls.append(q.dtype))
    for block in dit.blocks:
        block.attn.matmul_rows = 64
    with torch.no_grad():
        dit.forward_chunk(torch.randn(2, 320, 6, dtype=torch.bfloat16), torch.rand(2, dtype=torch.bfloat16),
                          None, None)
    assert calls == []


def test_a_masked_call_keeps_scaled_dot_product_attention(monkeypatch):
    dit = random_dit(seed=2)
    x_in, t = torch.randn(2, 320, 6), torch.rand(2)
    mask = torch.ones(1, 6, 6, dtype=torch.bool).tril()  # the reference path's block-causal mask

    def refuse(q, k, v):
        raise AssertionError("a masked call must not take the unmasked GEMM path")

    monkeypatch.setattr(dit_module, "attention_by_matmul", refuse)
    for block in dit.blocks:
        block.attn.matmul_rows = 64
    with torch.no_grad():
        dit.forward_chunk(x_in, t, None, None, mask)


def test_the_flag_is_a_strict_request_count():
    def read(value):
        return Code2WavOptions.from_extra({MATMUL_ATTENTION_KEY: value}).matmul_attention_requests

    assert Code2WavOptions.from_extra({}).matmul_attention_requests == MATMUL_ATTENTION_DEFAULT == read(None)
    assert read(0) == 0 and read(" 16 ") == 16 and read(4096) == 4096
    for bad in (True, False, -1, 8.5, "8.5", "eight", "", 4097, "１６"):
        with pytest.raises(FlagError, match=MATMUL_ATTENTION_KEY):
            read(bad)


def test_an_engine_routes_its_dit_by_the_flag_and_says_which_attention_runs(monkeypatch, single_thread):  # noqa: F811
    from dataclasses import replace

    from stages.code2wav.token2wav import Token2Wav

    asked = []
    select = kernels.attention_kernel

    def spy(max_requests, cfg, device, dtype, *, triton):
        asked.append((max_requests, device.type, triton))
        return select(max_requests, cfg, device, dtype, triton=triton)

    monkeypatch.setattr(kernels, "attention_kernel", spy)
    cfg = tiny_config()
    t2w = Token2Wav(replace(cfg, extra={**cfg.extra, MATMUL_ATTENTION_KEY: "3", "code2wav_triton_attention": "true"}),
                    device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    assert asked == [(3, "cpu", True)]
    assert t2w.describe()["dit_attention"] == "sdpa"  # the CPU keeps SDPA whatever the flag says


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_cuda_gemm_path_computes_attention(dtype, tol):
    q, k, v = _case(b=2, dtype=dtype, device="cuda")
    torch.testing.assert_close(attention_by_matmul(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               rtol=tol, atol=tol)


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_with_gemm_attention_matches_sdpa_and_replays_bit_identically(monkeypatch):
    calls = []

    def counted(q, k, v):
        calls.append(q.shape[0])
        return attention_by_matmul(q, k, v)

    def gemms_for_two_requests(dit):
        assert select_attention(dit, 2, torch.device("cuda")).startswith("batched GEMMs")
        monkeypatch.setattr(dit_module, "attention_by_matmul", counted)

    check_a_dit_path_on_cuda(gemms_for_two_requests, rows=4)
    assert calls and set(calls) == {4}  # every block, eager and captured, took the GEMM path
