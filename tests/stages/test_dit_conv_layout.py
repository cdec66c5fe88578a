"""The DiT's causal convs frames-first (`CausalConvBlock.frames_first`, `kernels.conv_layout`,
the `code2wav_frames_first_conv` stage flag): the same function as the checkpoint's channels-first
convs, the same cache histories, the weights re-laid-out in place, and on CUDA no cuDNN layout
transforms left around the convs.

CPU cases force the layout on the CPU (the engine selects it on CUDA only) and compare both
layouts on the same inputs; the `gpu` cases run a whole DiT call with it, eager and replayed.

Run: python -m pytest tests/stages/test_dit_conv_layout.py -q
"""

from __future__ import annotations

import pytest
import torch

from stages.code2wav.dit_conv import CausalConvBlock, conv_frames_first
from stages.code2wav.kernels import conv_layout
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.stages.code2wav_tiny import check_a_dit_path_on_cuda, random_dit, single_thread, tiny_config, use  # noqa: F401


def select_conv_layout(dit, frames_first: bool, device: torch.device) -> str:
    """Lay `dit`'s convs out as `kernels.conv_layout` chooses for it; what it said."""
    return use(dit, conv=conv_layout(frames_first, device)).conv.reason

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _block(channels=24, seed=0, device="cpu") -> CausalConvBlock:
    torch.manual_seed(seed)
    block = CausalConvBlock(channels).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    return block.to(device)


def _run(block, x, cache):
    out_cache = torch.full((x.shape[0], 2 * block.channels, 2), float("nan"), device=x.device)
    with torch.no_grad():
        return block(x, cache, out_cache), out_cache


@pytest.mark.parametrize("b, t, cached", [(1, 7, True), (3, 25, True), (2, 1, True), (2, 9, False)])
def test_frames_first_convs_compute_the_block_and_its_cache(b, t, cached):
    block = _block()
    gen = torch.Generator().manual_seed(b * 100 + t)
    x = torch.randn(b, t, 24, generator=gen)
    cache = torch.randn(b, 48, 2, generator=gen) if cached else None
    want, want_cache = _run(block, x, cache)
    block.set_frames_first(True)
    got, got_cache = _run(block, x, cache)
    assert got.shape == want.shape == (b, t, 24)
    assert got.is_contiguous()  # [B, T, C] memory, what the next fused norm reads best
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # conv1's history is the input's last frames: copied, not computed, so equal bit for bit;
    # conv2's is made from conv1's output, within rounding.
    assert torch.equal(got_cache[:, :24], want_cache[:, :24])
    torch.testing.assert_close(got_cache, want_cache, rtol=1e-5, atol=1e-5)


def test_the_weights_are_re_laid_out_in_place_and_back():
    block = _block(seed=1)
    before = [block.block[i].weight.detach().clone() for i in (1, 6)]
    block.set_frames_first(True)
    for i, w0 in zip((1, 6), before):
        w = block.block[i].weight
        assert torch.equal(w, w0) and w.shape == w0.shape
        # [C_out, C_in, k] with [C_out, k, C_in] memory: as a 4-D weight, channels-last.
        assert w.unsqueeze(2).is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    block.set_frames_first(False)
    assert all(torch.equal(block.block[i].weight, w0) and block.block[i].weight.is_contiguous()
               for i, w0 in zip((1, 6), before))


def test_conv_frames_first_is_a_valid_conv1d_over_frames():
    conv = torch.nn.Conv1d(5, 7, 3)
    x = torch.randn(2, 11, 5)
    with torch.no_grad():
        got = conv_frames_first(conv, x)
        want = conv(x.transpose(1, 2)).transpose(1, 2)
    assert got.shape == (2, 9, 7)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_whole_dit_chunk_is_the_same_function_frames_first():
    dit = random_dit(seed=3)
    x_in, t = torch.randn(2, 320, 6), torch.rand(2)
    with torch.no_grad():
        want = dit.forward_chunk(x_in, t, None, None)
        for block in dit.blocks:
            block.conv.set_frames_first(True)
        got = dit.forward_chunk(x_in, t, None, None)
    torch.testing.assert_close(got.velocity, want.velocity, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.cnn_cache, want.cnn_cache, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.cnn_cache[0, :, :32], want.cnn_cache[0, :, :32])  # block 0's input frames


def test_select_conv_layout_acts_on_cuda_only():
    dit = random_dit()
    assert "not CUDA (cpu)" in select_conv_layout(dit, True, torch.device("cpu"))
    assert dit.conv_layout == "channels-first" and not any(b.conv.frames_first for b in dit.blocks)
    # Only the device's type is read for the routing (the weights move on whatever device they are).
    assert select_conv_layout(dit, True, torch.device("cuda")).startswith("frames-first")
    assert dit.conv_layout == "frames-first" and all(b.conv.frames_first for b in dit.blocks)
    assert "is false" in select_conv_layout(dit, False, torch.device("cuda"))
    assert dit.conv_layout == "channels-first" and not any(b.conv.frames_first for b in dit.blocks)


def test_the_flag_is_strict():
    assert Code2WavOptions.from_extra({}).frames_first_conv is True
    assert Code2WavOptions.from_extra({"code2wav_frames_first_conv": "false"}).frames_first_conv is False
    for bad in ("sometimes", 2):
        with pytest.raises(FlagError, match="code2wav_frames_first_conv"):
            Code2WavOptions.from_extra({"code2wav_frames_first_conv": bad})
    with pytest.raises(FlagError, match="code2wav_frames_frist_conv"):
        Code2WavOptions.from_extra({"code2wav_frames_frist_conv": True})


def test_an_engine_on_the_cpu_keeps_channels_first_and_says_so(single_thread):  # noqa: F811
    from stages.code2wav.token2wav import Token2Wav

    t2w = Token2Wav(tiny_config(), device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    assert t2w.describe()["dit_conv"] == "channels-first"


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_frames_first_matches_channels_first_and_replays_bit_identically():
    # cuDNN runs fp32 convs in TF32 by default, and two layouts' TF32 kernels round differently
    # (up to ~1e-3 here); compared in full fp32 the layouts must agree to fp32 rounding.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        check_a_dit_path_on_cuda(lambda dit: select_conv_layout(dit, True, torch.device("cuda")), rows=4)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_frames_first_convs_run_no_layout_transforms(dtype):
    from torch.profiler import ProfilerActivity, profile

    block = _block(channels=512, device="cuda").to(dtype)
    x, cache = torch.randn(4, 100, 512, device="cuda", dtype=dtype), torch.randn(4, 1024, 2, device="cuda", dtype=dtype)

    def kernels():
        out = torch.empty(4, 1024, 2, device="cuda", dtype=dtype)
        with torch.no_grad():
            block(x, cache, out)  # warm (cuDNN's heuristics), then profile one call
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                block(x, cache, out)
                torch.cuda.synchronize()
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # see the DiT test
                y = block(x, cache, out)
        return y, [e.key for e in prof.key_averages()]

    want, before = kernels()
    block.set_frames_first(True)
    got, after = kernels()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    transforms = [k for k in before if "nchwToNhwc" in k or "nhwcToNchw" in k]
    assert transforms, f"expected cuDNN layout transforms channels-first, saw {before}"
    assert not [k for k in after if "nchwToNhwc" in k or "nhwcToNchw" in k], after
