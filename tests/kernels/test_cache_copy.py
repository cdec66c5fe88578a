"""The slot pool's attention-cache copies as one Triton pass each way (`cache_copy_triton`,
`code2wav_fused_cache_copy`) and their wiring into a chunk's decode.

Copies are exact, so every comparison here is `torch.equal` against torch's chains: the kernel
alone on the interpreter (CPU) and compiled (`gpu`), `PooledAttSteps` with and without it, and
whole decodes of staggered traffic whose audio, mel and slot pools must not move by a bit.

Run: python -m pytest tests/kernels/test_cache_copy.py -q
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from stages.code2wav.chunk_decode import PooledAttSteps
from stages.code2wav.flow_cache import AttKeep
from stages.code2wav.kernels import CacheCopyKernel, cache_copy_kernel
from stages.code2wav.options import Code2WavOptions
from stages.code2wav.token2wav import Token2Wav
from stages.flags import FlagError
from tests.stages.code2wav_tiny import assert_same_run, single_thread, streams_of, tiny_config  # noqa: F401

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _kernels():
    from stages.code2wav.cache_copy_triton import gather_frames, scatter_frames

    return CacheCopyKernel(gather_frames, scatter_frames, "test")


def _arena(*shape, seed, device="cpu", dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


@pytest.mark.parametrize("at,frames", [(0, 12), (5, 7), (3, 0)], ids=["front", "behind-new", "none"])
def test_gather_equals_index_select_then_copy(interpret, at, frames):
    from stages.code2wav.cache_copy_triton import gather_frames

    arena = _arena(3, 9, 2, 12, 8, seed=1)
    index = torch.tensor([7, 2, 5, 0, 8])
    buf = _arena(3, 5, 2, at + frames + 2, 8, seed=2)
    want = buf.clone()
    want[:, :, :, at : at + frames].copy_(arena[:, :, :, :frames].index_select(1, index))
    got = buf.clone()
    gather_frames(arena, index, got, at=at, frames=frames)
    assert torch.equal(got, want)
    # A strided index (a column of the chunk's meta tensor) is read as it is.
    meta = torch.stack([index, index * 0 - 1], dim=1)
    strided = buf.clone()
    gather_frames(arena, meta[:, 0], strided, at=at, frames=frames)
    assert torch.equal(strided, want)
    # The index is read: another order of the same slots gives other rows.
    other = buf.clone()
    gather_frames(arena, index.flip(0), other, at=at, frames=frames)
    assert torch.equal(other, want) == (frames == 0)


@pytest.mark.parametrize("length", [9, 15], ids=["under-the-trim", "trimmed"])
def test_scatter_of_the_kept_ranges_equals_cat_then_index_copy(interpret, length):
    """Store's two spans (prompt head and newest frames, back to back) or its one, as
    `PooledAttSteps.store` writes them with torch; rows and frames outside stay untouched."""
    from stages.code2wav.cache_copy_triton import scatter_frames

    keep = AttKeep(prompt_len=6, keep_frames=4)
    ranges = keep.ranges(length)
    buf = _arena(3, 4, 2, length, 8, seed=3)
    index = torch.tensor([6, 1, 3, 4])
    arena = _arena(3, 8, 2, 12, 8, seed=4)
    part = torch.cat([buf[:, :, :, s : s + n] for s, n in ranges], dim=3)
    want = arena.clone()
    want[:, :, :, : part.shape[3]].index_copy_(1, index, part)
    got = arena.clone()
    starts = [sum(n for _, n in ranges[:i]) for i in range(len(ranges))]
    scatter_frames(buf, index, got, [(s, at, n) for (s, n), at in zip(ranges, starts)])
    assert torch.equal(got, want)
    assert torch.equal(got[:, [0, 2, 5, 7]], arena[:, [0, 2, 5, 7]])  # slots not written


def test_pooled_steps_load_and_store_equal_torchs_with_the_kernel(interpret):
    """A stepwise cache round trip through the pool: load, write new frames, store; the arena
    and the step buffer agree bit for bit with torch's chains, bfloat16 caches too."""
    for dtype in (torch.float32, torch.bfloat16):
        arena = _arena(2, 3, 6, 2, 20, 16, seed=5, dtype=dtype)  # [n_t, depth, 2S, H, F, E]
        pairs = torch.tensor([4, 0, 5, 1])
        keep = AttKeep(prompt_len=8, keep_frames=6)
        runs = []
        for copy in (CacheCopyKernel(), _kernels()):
            a = arena.clone()
            steps = PooledAttSteps(a, pairs, 14, keep, store=True, copy=copy)
            buf = torch.zeros(3, 4, 2, 4 + 14, 16, dtype=dtype)
            buf[:, :, :, :4] = 7.0  # the step's new frames
            steps.load(1, buf)
            loaded = buf.clone()
            steps.store(1, buf)
            runs.append((loaded, a))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
        assert not torch.equal(runs[1][1], arena)  # the store did write


def test_refuses_what_it_cannot_copy(interpret):
    from stages.code2wav.cache_copy_triton import gather_frames, scatter_frames

    arena, buf, index = torch.zeros(1, 4, 2, 6, 8), torch.zeros(1, 2, 2, 8, 8), torch.tensor([1, 3])
    with pytest.raises(ValueError, match="dense"):
        gather_frames(arena.transpose(3, 4).contiguous().transpose(3, 4), index, buf, at=0, frames=6)
    with pytest.raises(ValueError, match="share memory"):
        gather_frames(arena, index, arena[:, :2], at=0, frames=6)
    with pytest.raises(ValueError, match="int64"):
        gather_frames(arena, index.int(), buf, at=0, frames=6)
    with pytest.raises(ValueError, match="2 rows, the other side 3"):
        gather_frames(arena, index, torch.zeros(1, 3, 2, 8, 8), at=0, frames=6)
    with pytest.raises(ValueError, match="outside"):
        gather_frames(arena, index, buf, at=3, frames=6)
    with pytest.raises(ValueError, match="16 bytes"):  # 3 floats a frame: no 16-byte rows
        gather_frames(torch.zeros(1, 4, 2, 6, 3), index, torch.zeros(1, 2, 2, 8, 3), at=0, frames=6)
    with pytest.raises(ValueError, match="1 to 2 spans"):
        scatter_frames(buf, index, arena, [(0, 0, 1)] * 3)
    with pytest.raises(ValueError, match="differ outside rows and frames"):
        scatter_frames(torch.zeros(1, 2, 3, 8, 8), index, arena, [(0, 0, 2)])


def test_flag_parses_strictly_and_is_opt_in_until_measured():
    assert Code2WavOptions.from_extra({}).fused_cache_copy is True  # D-C2W-4
    assert Code2WavOptions.from_extra({"code2wav_fused_cache_copy": "true"}).fused_cache_copy is True
    assert Code2WavOptions.from_extra({"code2wav_fused_cache_copy": "false"}).fused_cache_copy is False
    with pytest.raises(FlagError, match="code2wav_fused_cache_copy"):
        Code2WavOptions.from_extra({"code2wav_fused_cache_copy": "twice"})


def test_resolution_says_why_torchs_copies_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    off = cache_copy_kernel(False, cpu, [torch.float32], [8])
    assert off.gather is None and off.name == "torch" and "code2wav_fused_cache_copy is false" in off.reason
    assert "TRITON_INTERPRET" in cache_copy_kernel(True, cpu, [torch.float32], [8]).reason
    assert "not CUDA (meta)" in cache_copy_kernel(True, torch.device("meta"), [torch.float32], [8]).reason


def test_a_copy_that_fails_to_compile_leaves_torchs(interpret, monkeypatch, caplog):
    from stages.code2wav import cache_copy_triton

    widths = []

    def broken(device, dtype, width):
        widths.append((dtype, width))
        raise RuntimeError("no ptxas")

    monkeypatch.setattr(cache_copy_triton, "warm_up", broken)
    with caplog.at_level(logging.WARNING):
        chosen = cache_copy_kernel(True, torch.device("cpu"), [torch.float32, torch.float32], [32, 64])
    assert chosen.gather is None and "failed to compile (RuntimeError: no ptxas)" in chosen.reason
    assert "code2wav: torch's index_select / index_put_ kept" in caplog.text
    assert widths == [(torch.float32, 32)]  # the first failure stops the warm-up


def test_every_variant_a_chunk_launches_is_compiled_at_resolution(interpret, monkeypatch):
    from stages.code2wav import cache_copy_triton

    warmed = []
    monkeypatch.setattr(cache_copy_triton, "warm_up", lambda device, dtype, width: warmed.append((dtype, width)))
    chosen = cache_copy_kernel(True, torch.device("cpu"), [torch.float32, torch.bfloat16, torch.float32], [32, 128, 32])
    assert chosen.name == "triton"
    assert warmed == [(torch.float32, 32), (torch.float32, 128), (torch.bfloat16, 32), (torch.bfloat16, 128)]


@pytest.mark.slow  # whole tiny decodes through the interpreter (~15 s): CI's second step
def test_decodes_with_the_kernel_equal_torchs_bit_for_bit(interpret, single_thread):
    """Staggered tiny traffic (first, growing, trimmed and last chunks in one call): audio, mel
    and every slot-pool tensor equal, with the kernel in the conformer gather and every step."""
    # Every other Triton kernel off: under the interpreter they would take minutes.
    others = ("code2wav_fused_snake", "code2wav_fused_norm", "code2wav_dit_tf32x3", "code2wav_triton_attention",
              "code2wav_fused_conv_norm", "code2wav_conv_gemm")
    cfg = tiny_config(extra={**dict.fromkeys(others, False), "code2wav_fused_cache_copy": True})
    on = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True)
    off = Token2Wav(replace(cfg, extra={**cfg.extra, "code2wav_fused_cache_copy": False}),
                    device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True)
    assert on.describe()["c2w_cache_copy"] == "triton" and off.describe()["c2w_cache_copy"] == "torch"
    assert_same_run(on, off, streams_of(cfg, [130, 60, 110]))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_full_size_copies_equal_torchs(dtype):
    """The estimator's real shapes at 8 requests (16 CFG rows of a 48-slot arena) and a trimmed
    store, compiled: bit for bit torch's chains."""
    dev = torch.device("cuda")
    arena = _arena(16, 48, 8, 400, 128, seed=6, device=dev, dtype=dtype)
    pairs = torch.randperm(48, generator=torch.Generator().manual_seed(0))[:16].to(dev)
    keep = AttKeep(prompt_len=300, keep_frames=100)
    runs = []
    fused = cache_copy_kernel(True, dev, [dtype], [128])
    assert fused.name == "triton", fused.reason
    for copy in (CacheCopyKernel(), fused):
        a = arena.clone()
        steps = PooledAttSteps(a.unsqueeze(0), pairs, 400, keep, store=True, copy=copy)
        buf = torch.full((16, 16, 8, 450, 128), 3.0, device=dev, dtype=dtype)
        steps.load(0, buf)
        loaded = buf.clone()
        steps.store(0, buf)
        runs.append((loaded, a))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[1][1], arena)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.usefixtures("deterministic")
def test_cuda_full_size_decode_with_the_kernel_equals_torchs_eager_and_replayed():
    """Full-size code2wav on the GPU, staggered streams: the kernel (graphs on) against torch's
    copies (graphs off): audio, mel and pools equal bit for bit."""
    from stages.code2wav.config import Code2WavConfig

    cfg, dev = Code2WavConfig(), torch.device("cuda")
    on = Token2Wav(replace(cfg, extra={"code2wav_device_graph": True, "code2wav_fused_cache_copy": True}),
                   device=dev, dtype=torch.float32,
                   init_seed=0, keep_mel=True, slots=2)
    off = Token2Wav(replace(cfg, extra={"code2wav_device_graph": False, "code2wav_fused_cache_copy": False}),
                    device=dev, dtype=torch.float32, init_seed=0, keep_mel=True, slots=2)
    assert on.cache_copy.name == "triton" and off.cache_copy.name == "torch"
    assert_same_run(on, off, streams_of(cfg, [150, 150, 60]))
    assert on.graphs.replays > 0
