"""HiFT's Snake activation, `x + 1/(alpha + 1e-9) * sin(alpha x)^2`, as ONE Triton launch.

The vocoder runs 72 Snakes a call (12 ResBlocks x 3 dilations x 2), each over a whole
[B, C, T * upsampling] activation, and the module's eager formula is eight kernels (the add and
reciprocal on alpha, the two muls, sin, pow, mul, add), seven passes over the activation: ~570
launches of a steady chunk's ~5,000, and most of HiFT's memory traffic between its convs.

What a newcomer needs to know:
* Numerics: bit for bit the module's formula on CUDA, not merely close. Each step is the op torch
  runs, in its order and rounding: `alpha + 1e-9` in fp32, the reciprocal as a correctly rounded
  division (`div_rn`; Triton's plain `/` is an approximate one), libdevice's `sin` (the
  correctly-rounded-to-1-ulp `sinf` torch's kernel calls; `tl.sin` would be the approximate PTX
  instruction; the CPU interpreter, which runs no extern functions, takes numpy's), the square as `s * s` (torch's pow with exponent 2), and the kernel is compiled
  with `enable_fp_fusion=False`, so `x + inv * s2` is not contracted into an fma. The GPU test
  asserts `torch.equal` against the module.
* x must be fp32 and contiguous [B, C, T] (a conv's output is); alpha [C] fp32. The output is a
  fresh tensor, as the module's is.
* Never import this module at import time of anything on the hot path: it imports triton.
  `stages.code2wav.kernels` imports it when the stage flag asks for it.
* The first call per device compiles: make it outside any graph capture (`warm_up` does, at
  selection). Sizes are runtime values, never specialised, so every shape shares one binary.

    >>> y = snake(x, module.alpha)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from stages.platform import is_cpu
from stages.platform.triton_launch import launches_for

_BLOCK = 1024  # elements a program: 8 per thread at 4 warps, a 4 KiB read and write
_WARPS = 4


@triton.jit(do_not_specialize=["n", "channels", "frames"])
def _snake_kernel(x_ptr, alpha_ptr, out_ptr, n, channels, frames, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    c = (offs // frames) % channels
    alpha = tl.load(alpha_ptr + c, mask=mask, other=1.0)
    inv = tl.math.div_rn(tl.full([BLOCK], 1.0, tl.float32), alpha + 1e-9)
    if LIBDEVICE:
        s = libdevice.sin(x * alpha)
    else:  # the interpreter (CPU tests), which runs no extern functions: numpy's sin
        s = tl.sin(x * alpha)
    tl.store(out_ptr + offs, x + inv * (s * s), mask=mask)


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Snake over x [B, C, T] (fp32, contiguous) with per-channel alpha [C] (fp32)."""
    if x.dim() != 3 or not x.is_contiguous() or x.dtype != torch.float32:
        raise ValueError(f"snake needs a contiguous fp32 [B, C, T] input, got {tuple(x.shape)} {x.dtype} "
                         f"strides {x.stride()}")
    if alpha.shape != (x.shape[1],) or alpha.dtype != torch.float32 or alpha.device != x.device:
        raise ValueError(f"alpha must be fp32 [{x.shape[1]}] on {x.device}, got {tuple(alpha.shape)} "
                         f"{alpha.dtype} on {alpha.device}")
    alpha = alpha.detach()
    if not alpha.is_contiguous():
        alpha = alpha.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        libdevice_sin = not is_cpu(x.device)
        launches_for(_snake_kernel, x.device).checked(
            (x.device.index,), (triton.cdiv(n, _BLOCK), 1, 1), (x, alpha, out),
            (n, x.shape[1], x.shape[2], _BLOCK, libdevice_sin), num_warps=_WARPS, enable_fp_fusion=False,
        )
    return out


def warm_up(device: torch.device) -> None:
    """Compile the kernel on `device` (outside any graph capture); raises what the compiler raises."""
    snake(torch.zeros(1, 1, 1, device=device), torch.ones(1, device=device))
