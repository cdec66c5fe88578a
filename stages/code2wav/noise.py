"""Counter-based noise for the vocoder: a pure function of (request seed, chunk, element index).

The NSF source of HiFT draws random initial phases and additive noise every chunk. Drawing them
from a per-request `torch.Generator` (one launch per row, host-side generator state) keeps a
request's audio independent of its batch mates, but it cannot live inside a device graph: a
replayed graph bakes one generator's state. Hashing counters instead gives the same guarantees
with plain integer tensor ops, so a whole code2wav chunk can be captured and replayed:

* a row's draws depend only on its seed, its chunk number and the element's position, never on
  which other rows share the batch or in what order (audio is a function of codes and seed);
* every op is shape-static and sync-free (no `.item()`, no host RNG), so graph capture is safe;
* the stream is identical on every device (integer arithmetic, then one float conversion).

The hash is a 32-bit integer mixer (two xorshift-multiply rounds, constants below 2**31 so the
products of 32-bit values stay inside int64 on every backend: no reliance on overflow).
Uniforms take the top 24 bits; normals come from Box-Muller over two uniform streams.

A chunk draws ~250,000 normals a row (27,840 samples x 9 harmonics), so the element-wise ops run
in place on one scratch buffer. Out of place, each of the ~60 ops allocated a fresh multi-MB
tensor; on one CPU thread a draw took 12-15 ms for one row and ~26 ms for two, against 9-10 ms
and ~11 ms in place. The values are the same either way (tests/stages/test_noise.py).

    keys = row_keys(seeds, chunks)                     # [B] int64, from per-row seed and chunk
    u = uniform(keys, stream=1, shape=(9,))            # [B, 9] in [0, 1)
    z = normal(keys, stream=2, shape=(24000, 9))       # [B, 24000, 9] ~ N(0, 1)
"""

from __future__ import annotations

import math

import torch

_MASK32 = 0xFFFFFFFF
_M1 = 0x7FEB352D  # < 2**31: x (< 2**32) * _M1 < 2**63
_M2 = 0x45D9F3B
_GOLDEN = 0x9E3779B9


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix of int64 values in [0, 2**32); returns values in the same range."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * _M1) & _MASK32
    x = ((x ^ (x >> 15)) * _M2) & _MASK32
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
    """[B] int64 key per row from its request seed and chunk number (both int64 tensors)."""
    high = mix32((seeds >> 32) & _MASK32)
    return mix32(mix32(seeds & _MASK32) ^ (high + chunks * _GOLDEN))


def _mix32_(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """`mix32` in place on int64 values already in [0, 2**32); `scratch` is a buffer like `x`."""
    for shift, multiplier in ((16, _M1), (15, _M2)):
        torch.bitwise_right_shift(x, shift, out=scratch)
        x.bitwise_xor_(scratch).mul_(multiplier).bitwise_and_(_MASK32)
    torch.bitwise_right_shift(x, 16, out=scratch)
    return x.bitwise_xor_(scratch)


def _bits(keys: torch.Tensor, stream: int, shape: tuple[int, ...]) -> torch.Tensor:
    # keys: [B] -> [B, *shape] hashed 32-bit values, element index as the counter:
    # mix32(mix32(index ^ base) + base), in place.
    count = math.prod(shape)
    index = torch.arange(count, device=keys.device, dtype=torch.int64).view(1, *shape)
    base = mix32(keys + stream * _GOLDEN).view(-1, *([1] * len(shape)))
    bits = torch.bitwise_xor(index, base)
    scratch = torch.empty_like(bits)
    _mix32_(bits, scratch).add_(base).bitwise_and_(_MASK32)
    return _mix32_(bits, scratch)


def uniform(keys: torch.Tensor, *, stream: int, shape: tuple[int, ...], dtype=torch.float32) -> torch.Tensor:
    """[B, *shape] uniforms in [0, 1) (24-bit resolution)."""
    # Values below 2**24 are exact in float32.
    return _bits(keys, stream, shape).bitwise_right_shift_(8).to(torch.float32).mul_(2.0**-24).to(dtype)


def normal(keys: torch.Tensor, *, stream: int, shape: tuple[int, ...], dtype=torch.float32) -> torch.Tensor:
    """[B, *shape] standard normals (Box-Muller over streams `stream` and `stream + 1`)."""
    u1 = uniform(keys, stream=stream, shape=shape, dtype=torch.float32)
    u2 = uniform(keys, stream=stream + 1, shape=shape, dtype=torch.float32)
    radius = u1.neg_().log1p_().mul_(-2.0).sqrt_()  # log(1 - u1), 1 - u1 in (0, 1]: never log 0
    return radius.mul_(u2.mul_(2.0 * math.pi).cos_()).to(dtype)
