"""Tiny code2wav config for CPU tests: small widths/depths; real vocab, chunking, step count."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from stages.code2wav.config import Code2WavConfig, DiTConfig, FlowEncoderConfig, HiFTConfig
from stages.code2wav.dit import DiT
from stages.code2wav.dit_conv import CausalConvBlock
from stages.code2wav.kernels import DiTKernels
from stages.code2wav.streaming import Chunker
from stages.code2wav.token2wav import Token2Wav


def tiny_config(**overrides) -> Code2WavConfig:
    flow = FlowEncoderConfig(input_size=32, attention_heads=2, linear_units=64, num_blocks=2, num_up_blocks=1)
    dit = DiTConfig(hidden_size=32, depth=2, num_heads=2, head_dim=16)
    hift = HiFTConfig(base_channels=16, f0_predictor_channels=16)
    cfg = Code2WavConfig(flow=flow, dit=dit, hift=hift)
    return replace(cfg, **overrides)


@pytest.fixture(autouse=False)
def single_thread():
    """Run intra-op on one thread: on a shared 2-core box, 2 spinning threads under load are
    10-50x slower than one (measured 0.1 s vs 2-8 s per tiny chunk). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_dit(seed: int = 0, dtype=torch.float32, device="cpu") -> DiT:
    """A tiny DiT with every parameter drawn at random: adaLN-zero initialises its rows at zero
    upstream, and random rows exercise every term of the blocks."""
    torch.manual_seed(seed)
    dit = DiT(tiny_config().dit).eval()
    with torch.no_grad():
        for p in dit.parameters():
            p.normal_(0, 0.2)
    return dit.to(device=device, dtype=dtype)


def use(dit: DiT, **parts) -> DiTKernels:
    """Wire `parts` (`norm=kernels.norm_kernel(...)`, `gemm=...`) into `dit`, keeping the kernels
    it runs already for the others; returns what it runs now."""
    kernels = replace(dit.kernels or DiTKernels(), **parts)
    dit.use_kernels(kernels)
    return kernels


def check_a_dit_path_on_cuda(switch_on, rows: int) -> None:
    """A random tiny DiT on CUDA: one call, `switch_on(dit)`, the same call again (equal to the
    first within fp32 rounding), then that call captured as a CUDA graph (after a warm-up call
    on the capture stream) and replayed once, which must equal the eager call bit for bit."""
    dit = random_dit(seed=5, device="cuda")
    x_in, t = torch.randn(rows, 320, 50, device="cuda"), torch.rand(rows, device="cuda")
    with torch.no_grad():
        want = dit.forward_chunk(x_in, t, None, None).velocity
        switch_on(dit)
        eager = dit.forward_chunk(x_in, t, None, None).velocity
    torch.testing.assert_close(eager, want, rtol=1e-4, atol=1e-4)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.stream(stream):
        dit.forward_chunk(x_in, t, None, None)  # warm the stream's allocator
        with torch.cuda.graph(graph, stream=stream):
            captured = dit.forward_chunk(x_in, t, None, None).velocity
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def frames_first_block_both_ways(channels: int, *, ln_mish=None, conv_gemm=None, device="cpu",
                                 dtype=torch.float32, std=0.3, rows=2, frames=9):
    """One random frames-first CausalConvBlock run twice on the same input: with the modules' ops,
    then with `ln_mish` / `conv_gemm` wired in. ((out, cache) eager, (out, cache) wired)."""
    torch.manual_seed(0)
    block = CausalConvBlock(channels).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, std)
    block = block.to(device, dtype)
    block.set_frames_first(True)
    x = torch.randn(rows, frames, channels, device=device, dtype=dtype)
    cache = torch.randn(rows, 2 * channels, 2, device=device, dtype=dtype)
    runs = []
    with torch.no_grad():
        for wired in (False, True):
            if wired:
                block.ln_mish, block.conv_gemm = ln_mish, conv_gemm
            out_cache = torch.empty(rows, 2 * channels, 2, device=device, dtype=dtype)
            runs.append((block(x, cache, out_cache), out_cache))
    return runs[0], runs[1]


def streams_of(cfg, lengths, seed=0):
    """One stream of chunk payloads a request, of random codes (`lengths` codes each)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ch = Chunker(cfg, f"r{i}", seed=i)
        codes = torch.randint(0, cfg.flow.vocab_size, (n,), generator=gen).tolist()
        out.append([*ch.push(codes), ch.finish()])
    return out


def staggered(streams):
    """Staggered starts: steps mix first, growing, steady and last chunks."""
    pending = {i: list(s) for i, s in enumerate(streams)}
    step = 0
    while pending:
        batch = [q.pop(0) for i, q in pending.items() if i // 2 <= step]
        pending = {i: q for i, q in pending.items() if q}
        yield batch
        step += 1


def assert_same_run(on: Token2Wav, off: Token2Wav, streams, *, pools: bool = True) -> None:
    """Equal outputs (and, unless one side was warmed, equal slot pools) over staggered traffic."""
    for batch in staggered(streams):
        for x, y in zip(on.decode(batch), off.decode(batch)):
            assert (x.request_id, x.chunk_seq) == (y.request_id, y.chunk_seq)
            assert torch.equal(torch.from_numpy(x.audio), torch.from_numpy(y.audio)), x.request_id
            assert torch.equal(x.mel, y.mel)
        if pools:
            for name, t in on.pool.tensors.items():
                assert torch.equal(t, off.pool[name]), name
