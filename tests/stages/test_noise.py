"""The vocoder's counter noise (stages.code2wav.noise): the hash, its streams and their laws.

The in-place tensor code is checked against the spec written out in plain Python integers and
against the same formulas composed out of place, so an optimisation cannot change a request's
audio unnoticed."""

import math

import pytest
import torch

from stages.code2wav import noise

MASK = 0xFFFFFFFF


def _mix(x: int) -> int:
    x &= MASK
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & MASK
    x = ((x ^ (x >> 15)) * 0x45D9F3B) & MASK
    return x ^ (x >> 16)


def _spec_bits(key: int, stream: int, index: int) -> int:
    base = _mix(key + stream * 0x9E3779B9)
    return _mix((_mix(index ^ base) + base) & MASK)


def _keys() -> torch.Tensor:
    return noise.row_keys(torch.tensor([0, 7, 2**40 + 3]), torch.tensor([0, 1, 95]))


def test_bits_follow_the_integer_spec():
    keys = _keys()
    bits = noise._bits(keys, 3, (5, 9))
    for row, key in enumerate(keys.tolist()):
        for index in (0, 1, 17, 44):
            assert bits[row].flatten()[index].item() == _spec_bits(key, 3, index), (row, index)


def test_row_keys_follow_the_integer_spec():
    seed, chunk = 2**40 + 3, 95
    high = _mix((seed >> 32) & MASK)
    want = _mix(_mix(seed & MASK) ^ (high + chunk * 0x9E3779B9))
    assert noise.row_keys(torch.tensor([seed]), torch.tensor([chunk])).item() == want


def test_in_place_streams_equal_the_out_of_place_formulas():
    keys, shape = _keys(), (640, 9)
    bits = lambda stream: noise._bits(keys, stream, shape)  # noqa: E731
    u = ((bits(2) >> 8).to(torch.float32) * 2.0**-24, (bits(3) >> 8).to(torch.float32) * 2.0**-24)
    assert torch.equal(noise.uniform(keys, stream=2, shape=shape), u[0])
    want = torch.sqrt(-2.0 * torch.log1p(-u[0])) * torch.cos(2.0 * math.pi * u[1])
    assert torch.equal(noise.normal(keys, stream=2, shape=shape), want)


def test_a_row_draws_the_same_whatever_its_batch_mates():
    keys = _keys()
    alone = noise.normal(keys[1:2], stream=3, shape=(100, 9))
    assert torch.equal(noise.normal(keys, stream=3, shape=(100, 9))[1], alone[0])
    assert not torch.equal(noise.normal(keys, stream=4, shape=(100, 9))[1], alone[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_streams_have_the_laws_they_claim(dtype):
    keys = _keys()
    u = noise.uniform(keys, stream=1, shape=(20000,), dtype=dtype)
    z = noise.normal(keys, stream=3, shape=(20000,), dtype=dtype)
    assert u.dtype == z.dtype == dtype
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.01  # SE of a mean of 60,000 uniforms: 0.0012
    assert abs(z.mean().item()) < 0.02 and abs(z.std().item() - 1.0) < 0.02
    assert torch.isfinite(z).all()


@pytest.mark.gpu
def test_cuda_streams_match_the_cpu_and_the_formulas_and_replay_in_a_graph():
    # Integer hashing is exact on every device: uniforms equal the CPU's bit for bit. Normals
    # go through log1p and cos, whose CUDA and CPU results may differ in the last place, so on
    # the device they are held to the out-of-place formulas instead. In a CUDA graph the
    # in-place ops replay to the same values for new keys.
    keys, shape = _keys(), (27840, 9)
    dev = keys.cuda()
    assert torch.equal(noise.uniform(dev, stream=1, shape=shape).cpu(), noise.uniform(keys, stream=1, shape=shape))
    u1, u2 = (((noise._bits(dev, s, shape) >> 8).to(torch.float32) * 2.0**-24) for s in (3, 4))
    want = torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2.0 * math.pi * u2)
    assert torch.equal(noise.normal(dev, stream=3, shape=shape), want)

    static = dev.clone()
    noise.normal(static, stream=3, shape=shape)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = noise.normal(static, stream=3, shape=shape)
    fresh = noise.row_keys(torch.tensor([11, 12, 13]), torch.tensor([2, 3, 4])).cuda()
    static.copy_(fresh)
    graph.replay()
    assert torch.equal(out, noise.normal(fresh, stream=3, shape=shape))
