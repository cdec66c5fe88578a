"""HiFT's Snake as one Triton launch (`stages.code2wav.hift_triton`) and its wiring.

The CPU cases run the kernel under the Triton interpreter, whose sine is numpy's (an ulp from
torch's), so they hold it to fp32 rounding; the `gpu` cases hold the compiled kernel to the
module's formula bit for bit (`torch.equal`), alone over awkward shapes and values, and as every
Snake of a full-size HiFT call, eagerly and in a captured device graph.

Run: python -m pytest tests/kernels/test_hift_snake.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch

from stages.code2wav.config import HiFTConfig
from stages.code2wav.hift import HiFTGenerator, Snake
from stages.code2wav.kernels import snake_kernel
from stages.code2wav.modules import build_hift
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.kernels.hift_graphs import decode_eager_and_replayed

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _snake(channels: int, seed: int, device="cpu") -> Snake:
    """A Snake with alphas spread as trained ones are (some near zero, where 1/alpha is large)."""
    gen = torch.Generator().manual_seed(seed)
    module = Snake(channels)
    alpha = torch.rand(channels, generator=gen) * 4
    alpha[0] = 1e-4  # the 1e-9 in the formula matters only near zero: keep one there
    module.alpha.data = alpha
    return module.to(device)


def _input(b: int, c: int, t: int, seed: int, device="cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, c, t, generator=gen) * 3
    special = torch.tensor([0.0, -0.0, 1e-30, -60.0])  # zero, a tiny value, a large phase
    x.view(-1)[: min(4, x.numel())] = special[: min(4, x.numel())]
    return x.to(device)


@pytest.mark.parametrize("shape", [(1, 3, 7), (2, 5, 1025), (3, 16, 333)], ids=str)
def test_kernel_matches_the_module_on_the_interpreter(interpret, shape):
    from stages.code2wav.hift_triton import snake

    b, c, t = shape
    module = _snake(c, seed=t)
    x = _input(b, c, t, seed=c)
    want = module(x)
    got = snake(x, module.alpha)
    assert got.shape == x.shape and got.dtype == x.dtype and got.data_ptr() != x.data_ptr()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=2e-6)  # numpy's sine, an ulp from torch's
    # A wrong channel index or a lost term is far outside that: the kernel does read alpha per channel.
    other = _snake(c, seed=t + 1)
    assert not torch.allclose(snake(x, other.alpha), want, rtol=1e-4, atol=1e-4)


def test_kernel_refuses_what_it_cannot_index(interpret):
    from stages.code2wav.hift_triton import snake

    x = torch.zeros(2, 4, 6)
    with pytest.raises(ValueError, match="contiguous fp32"):
        snake(x.transpose(1, 2).contiguous().transpose(1, 2), torch.ones(4))
    with pytest.raises(ValueError, match="contiguous fp32"):
        snake(x.double(), torch.ones(4))
    with pytest.raises(ValueError, match="alpha must be fp32"):
        snake(x, torch.ones(3))


def test_the_module_falls_back_where_the_kernel_cannot_go():
    """A non-contiguous or non-fp32 input takes the formula even with a kernel wired in."""
    module = _snake(4, seed=0)
    calls = []
    module.fused = lambda x, alpha: calls.append(x) or torch.zeros_like(x)
    x = _input(1, 4, 9, seed=0)
    module(x)
    assert len(calls) == 1
    want = _snake(4, seed=0)(x.transpose(1, 2).contiguous().transpose(1, 2))
    assert torch.equal(module(x.transpose(1, 2).contiguous().transpose(1, 2)), want)
    assert len(calls) == 1


def test_flag_parses_strictly_and_defaults_on():
    assert Code2WavOptions.from_extra({}).fused_snake is True
    assert Code2WavOptions.from_extra({"code2wav_fused_snake": "false"}).fused_snake is False
    with pytest.raises(FlagError, match="code2wav_fused_snake"):
        Code2WavOptions.from_extra({"code2wav_fused_snake": "sometimes"})


def test_resolution_says_why_the_module_runs(monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    off = snake_kernel(False, torch.device("cpu"))
    assert off.fn is None and off.name == "eager" and "code2wav_fused_snake is false" in off.reason
    cpu = snake_kernel(True, torch.device("cpu"))
    assert cpu.fn is None and "TRITON_INTERPRET" in cpu.reason
    npu = snake_kernel(True, torch.device("meta"))
    assert npu.fn is None and "not CUDA (meta)" in npu.reason


def test_a_kernel_that_fails_to_compile_leaves_the_module(interpret, monkeypatch, caplog):
    from stages.code2wav import hift_triton

    def broken(device):
        raise RuntimeError("no ptxas")

    monkeypatch.setattr(hift_triton, "warm_up", broken)
    with caplog.at_level(logging.WARNING):
        chosen = snake_kernel(True, torch.device("cpu"))
    assert chosen.fn is None and "failed to compile (RuntimeError: no ptxas)" in chosen.reason
    assert "HiFT: the module's Snake kept" in caplog.text


def test_use_kernels_wires_every_snake(interpret):
    hift = HiFTGenerator(HiFTConfig(base_channels=16, f0_predictor_channels=16))
    snakes = [m for m in hift.modules() if isinstance(m, Snake)]
    assert len(snakes) == 2 * 3 * (3 * 3 + 3)  # 12 ResBlocks x 3 dilations x 2, as the docstring counts
    chosen = snake_kernel(True, torch.device("cpu"))
    hift.use_kernels(chosen)
    assert hift.snake_kernel == "triton" and all(m.fused is chosen.fn for m in snakes)
    hift.use_kernels(snake_kernel(False, torch.device("cpu")))
    assert hift.snake_kernel == "eager" and all(m.fused is None for m in snakes)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 64, 27840), (3, 256, 2321), (8, 128, 4641)], ids=str)
def test_kernel_is_the_module_bit_for_bit_on_cuda(shape):
    from stages.code2wav.hift_triton import snake

    b, c, t = shape
    module = _snake(c, seed=t, device="cuda")
    x = _input(b, c, t, seed=c, device="cuda")
    want = module(x)
    assert torch.equal(snake(x, module.alpha), want)


@pytest.mark.gpu
@needs_cuda
def test_full_size_hift_with_the_kernel_is_the_module_bit_for_bit_on_cuda():
    """A steady streaming chunk's shapes (58 mel frames, 8 cached, 3840 cached source samples),
    3 rows, the same noise: audio and source equal eagerly and replayed from a device graph."""
    cfg = HiFTConfig()
    hift = build_hift(cfg, seed=3, weights_dir=None).to("cuda").eval()
    hift.init_buffers()
    gen = torch.Generator().manual_seed(0)
    for module in (m for m in hift.modules() if isinstance(m, Snake)):
        module.alpha.data = (torch.rand(module.alpha.shape, generator=gen) * 2 + 0.05).cuda()
    mel = (torch.randn(3, cfg.in_channels, 58, generator=gen) * 2).cuda()
    cache = (torch.randn(3, 1, 3840, generator=gen) * 0.1).cuda()

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return hift.inference(mel, cache, generator=torch.Generator(device="cuda").manual_seed(7))

    want_speech, want_source = run()
    hift.use_kernels(snake_kernel(True, torch.device("cuda")))
    assert hift.snake_kernel == "triton"
    speech, source = run()
    assert torch.equal(source, want_source) and torch.equal(speech, want_speech)

    # Captured: the launches replay into the same audio (inputs fixed, noise drawn outside).
    eager, captured = decode_eager_and_replayed(hift, mel, cache, seed=7)
    assert torch.equal(captured, eager)
