"""The DiT's attention for small chunks as batched GEMMs (`dit.attention_by_matmul`), where it
runs (`DiT.select_attention`, the `code2wav_matmul_attention_requests` stage flag) and what a run
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
from stages.code2wav.dit import DiT, attention_by_matmul
from stages.code2wav.options import MATMUL_ATTENTION_DEFAULT, MATMUL_ATTENTION_KEY, Code2WavOptions
from stages.flags import FlagError
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

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


def _dit(seed=0, device="cpu") -> DiT:
    torch.manual_seed(seed)
    dit = DiT(tiny_config().dit).eval()
    with torch.no_grad():  # random adaLN rows, so every term of the blocks matters
        for p in dit.parameters():
            p.normal_(0, 0.2)
    return dit.to(device)


def test_select_attention_routes_small_chunks_on_a_device_only():
    dit = _dit()
    assert "CPU" in dit.select_attention(8, torch.device("cpu"))
    assert dit.attention_kernel == "sdpa" and all(b.attn.matmul_rows == 0 for b in dit.blocks)
    # Only the device's type is read: no CUDA device is needed to check the routing.
    said = dit.select_attention(8, torch.device("cuda"))
    assert "8 requests" in said and dit.attention_kernel == "matmul<=8"
    assert all(b.attn.matmul_rows == 16 for b in dit.blocks)  # 2 DiT rows a request (CFG)
    assert "is 0" in dit.select_attention(0, torch.device("cuda"))
    assert dit.attention_kernel == "sdpa" and all(b.attn.matmul_rows == 0 for b in dit.blocks)


@pytest.mark.parametrize("rows, routed", [(4, True), (6, False)])
def test_a_chunk_takes_the_gemm_path_up_to_the_row_limit(monkeypatch, rows, routed):
    dit = _dit(seed=1)
    x_in, t = torch.randn(rows, 320, 6), torch.rand(rows)
    with torch.no_grad():
        want = dit.forward_chunk(x_in, t, None, None)
        calls = []

        def counted(q, k, v):
            calls.append(q.shape[0])
            return attention_by_matmul(q, k, v)

        monkeypatch.setattr(dit_module, "attention_by_matmul", counted)
        for block in dit.blocks:
            block.attn.matmul_rows = 4  # what select_attention(2, a device) sets
        got = dit.forward_chunk(x_in, t, None, None)
    assert calls == ([rows] * len(dit.blocks) if routed else [])
    torch.testing.assert_close(got.velocity, want.velocity, rtol=1e-4, atol=1e-4)
    # Block 0's K/V are made before its attention, so the path left them alone; later blocks'
    # follow from its output.
    assert torch.equal(got.att_cache[0], want.att_cache[0])
    torch.testing.assert_close(got.att_cache, want.att_cache, rtol=1e-4, atol=1e-4)


def test_a_masked_call_keeps_scaled_dot_product_attention(monkeypatch):
    dit = _dit(seed=2)
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


def test_a_cpu_engine_says_which_attention_runs(single_thread):  # noqa: F811
    from stages.code2wav.token2wav import Token2Wav

    t2w = Token2Wav(tiny_config(), device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    assert t2w.describe()["dit_attention"] == "sdpa"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_cuda_gemm_path_computes_attention(dtype, tol):
    q, k, v = _case(b=2, dtype=dtype, device="cuda")
    torch.testing.assert_close(attention_by_matmul(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               rtol=tol, atol=tol)


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_with_gemm_attention_matches_sdpa_and_replays_bit_identically():
    dit = _dit(seed=5, device="cuda")
    x_in, t = torch.randn(4, 320, 50, device="cuda"), torch.rand(4, device="cuda")
    with torch.no_grad():
        want = dit.forward_chunk(x_in, t, None, None).velocity
        assert dit.select_attention(2, torch.device("cuda")).startswith("batched GEMMs")
        eager = dit.forward_chunk(x_in, t, None, None).velocity
        torch.testing.assert_close(eager, want, rtol=1e-4, atol=1e-4)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            dit.forward_chunk(x_in, t, None, None)  # warm the stream's allocator
            with torch.cuda.graph(graph, stream=stream):
                captured = dit.forward_chunk(x_in, t, None, None).velocity
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(captured, eager)
