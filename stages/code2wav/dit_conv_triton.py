"""The middle of the DiT's causal conv block as ONE Triton launch: LayerNorm + Mish of conv1's
output, written behind conv2's two cached input frames, with both convs' new histories stored.

Frames-first, the block runs `cat([hist1, x])`, conv1, LayerNorm, Mish, `cat([hist2, h])`,
two strided copies of the last two frames into the step's conv cache, and conv2: eight launches
(with the convs), five of them memory-bound passes at the sizes code2wav serves, in each of the
160 block-steps of a chunk. `ln_mish_window` does the LayerNorm, the Mish, the second cat and
both cache writes in one: one program per frame of conv2's input window [B, 2 + T, C] reads either
a cached frame (the first two) or a frame of conv1's output (the rest: normalised, Mish'd),
writes it, and the last two programs of a row also store the new histories.

What a newcomer needs to know:
* Numerics: the same function to fp32 rounding, not bit for bit: the LayerNorm's mean and variance
  are two-pass sums in another order than torch's; Mish is torch's formula (`x * tanh(log1p(exp
  x))`, libdevice's functions on CUDA). In bfloat16 the normalised value is rounded to bfloat16
  before the Mish, as the eager chain stores it. Graph replay and eager calls both run this
  kernel, so they agree bit for bit with each other.
* Shapes: h1 [B, T, C] with dense frames, any batch stride (conv1's frames-first output, a view
  into the conv GEMM's window with `code2wav_conv_gemm`); full1 [B, 2 + T, C] contiguous
  (conv1's input window); hist2 [B, C, 2] any strides (a view into the cache); out_cache
  [B, 2C, 2] any strides, and it must not overlap hist2 (a program reads a cached frame while
  another writes the new history); the wrapper refuses an overlap.
* Never import this module at import time of anything on the hot path: it imports triton.
  `stages.code2wav.kernels` imports it when the stage flag asks for it.
* `h1` may be conv1's split k-sum left open (`dit_gemm.OpenSum`, `code2wav_open_split_sums`): the
  kernel adds its parts as it loads a frame, in `dit_gemm`'s order, bit for bit the added tensor.
* The first call per (device, dtype) compiles: make it outside any graph capture (`warm_up`).

    >>> full2 = ln_mish_window(h1, full1, hist2, norm.weight, norm.bias, norm.eps, out_cache)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from stages.code2wav.dit_conv import CONV_CACHE_FRAMES as HISTORY  # each conv's input frames kept
from stages.code2wav.dit_gemm import OpenSum, open_parts
from stages.platform import is_cpu
from stages.platform.triton_launch import launches_for
_SHAPE_ARGS = ["frames", "h1_sb", "h1_sp", "h2_sb", "h2_sc", "h2_st", "o_sb", "o_sc", "o_st"]


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _ln_mish_window_kernel(
    h1_ptr,  # [B, T, C], frames dense, batch stride h1_sb: conv1's output
    full1_ptr,  # [B, 2 + T, C] contiguous: conv1's input window
    hist2_ptr,  # [B, C, 2] strided: conv2's cached input frames
    w_ptr,  # [C] LayerNorm weight
    b_ptr,  # [C] LayerNorm bias
    out_ptr,  # [B, 2 + T, C] contiguous: conv2's input window
    cache_ptr,  # [B, 2C, 2] strided: the new histories, conv1's then conv2's channels
    h1_bias_ptr,  # [C]: added to h1's parts (ignored without H1_BIAS)
    frames,  # T
    h1_sb,  # h1's batch stride (T * C dense; (T + 2) * C from the conv GEMM's window)
    h1_sp,  # the stride between h1's k-sum parts (H1_PARTS > 1: conv1's open sum)
    h2_sb, h2_sc, h2_st,  # hist2's strides
    o_sb, o_sc, o_st,  # cache's strides
    C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    EPS: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    HIST: tl.constexpr,  # HISTORY
    H1_PARTS: tl.constexpr,
    H1_BIAS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * (HIST + T) + r
    window = frames + HIST
    b = row // window
    r = row - b * window
    cols = tl.arange(0, BLOCK_C)
    mask = cols < C
    if r < HIST:  # a cached frame of conv2's input, as it was
        v = tl.load(hist2_ptr + b * h2_sb + cols * h2_sc + r * h2_st, mask=mask, other=0.0).to(tl.float32)
    else:
        h1_at = h1_ptr + b * h1_sb + (r - HIST) * C + cols
        x = tl.load(h1_at, mask=mask, other=0.0).to(tl.float32)
        # An open sum's parts in part order, then its bias (`dit_gemm._split_sum_kernel`'s order).
        for part in range(1, H1_PARTS):
            x += tl.load(h1_at + part * h1_sp, mask=mask, other=0.0)
        if H1_BIAS:
            x += tl.load(h1_bias_ptr + cols, mask=mask, other=0.0)
        # `tl.reduce(..., tl.standard._sum_combine)`: what `tl.sum` runs, callable from the
        # interpreter twin (see dit_triton).
        mean = tl.reduce(x, 0, tl.standard._sum_combine) / C
        centred = tl.where(mask, x - mean, 0.0)
        var = tl.reduce(centred * centred, 0, tl.standard._sum_combine) / C
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        bias = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        # Rounded to the stored dtype before the Mish, as the eager LayerNorm's output is.
        y = (centred / tl.sqrt_rn(var + EPS) * w + bias).to(out_ptr.dtype.element_ty).to(tl.float32)
        if LIBDEVICE:
            soft = libdevice.log1p(libdevice.exp(y))
            v = y * libdevice.tanh(soft)
        else:  # the interpreter (CPU tests), which runs no extern functions
            soft = tl.log(1.0 + tl.exp(y))
            v = y * (2.0 / (1.0 + tl.exp(-2.0 * soft)) - 1.0)
    v = v.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * C + cols, v, mask=mask)
    if r >= frames:  # one of the window's last HIST frames: the new histories
        k = r - frames
        tl.store(cache_ptr + b * o_sb + (C + cols) * o_sc + k * o_st, v, mask=mask)
        prev = tl.load(full1_ptr + row * C + cols, mask=mask, other=0.0)
        tl.store(cache_ptr + b * o_sb + cols * o_sc + k * o_st, prev, mask=mask)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] byte addresses a strided tensor touches."""
    size = t.element_size()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * size - 1


def ln_mish_window(h1: torch.Tensor | OpenSum, full1: torch.Tensor, hist2: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor, eps: float, out_cache: torch.Tensor) -> torch.Tensor:
    """`cat([hist2ᵀ, mish(LN(h1))])` as a new contiguous [B, 2 + T, C] tensor (conv2's input),
    with out_cache[:, :C] = full1's last two frames and out_cache[:, C:] = its own last two
    (channels-first, as the eager block stores them). `h1` may be conv1's `OpenSum` (fp32): its
    parts are added as they are loaded."""
    h1_parts, h1_bias, h1_sp = open_parts(h1)
    h1 = h1_parts[0] if h1_parts is not None else h1
    if h1.dim() != 3 or h1.stride(2) != 1 or h1.stride(1) != h1.shape[2]:
        raise ValueError(f"h1 must be [B, T, C] with dense frames (any batch stride), got {tuple(h1.shape)} "
                         f"strides {h1.stride()}")
    b, frames, c = h1.shape
    if full1.shape != (b, frames + HISTORY, c) or not full1.is_contiguous():
        raise ValueError(f"full1 must be a contiguous [{b}, {frames + HISTORY}, {c}] tensor, got {tuple(full1.shape)}")
    if hist2.shape != (b, c, HISTORY) or out_cache.shape != (b, 2 * c, HISTORY):
        raise ValueError(f"hist2 must be [{b}, {c}, {HISTORY}] and out_cache [{b}, {2 * c}, {HISTORY}], got "
                         f"{tuple(hist2.shape)} and {tuple(out_cache.shape)}")
    if weight is None or bias is None or weight.shape != (c,) or bias.shape != (c,):
        raise ValueError(f"the LayerNorm must be affine over C = {c}")
    tensors = (h1, full1, hist2, weight, bias, out_cache)
    if any(t.device != h1.device or t.dtype != h1.dtype for t in tensors):
        raise ValueError("every tensor must share h1's device and dtype")
    out = h1.new_empty(b, frames + HISTORY, c)
    if out.numel() == 0:
        return out
    (a0, a1), (b0, b1) = _span(hist2), _span(out_cache)
    if a0 <= b1 and b0 <= a1:
        raise ValueError("out_cache overlaps hist2: the new histories would overwrite cached frames still to be read")
    parts = 1 if h1_parts is None else h1_parts.shape[0]
    tail = (frames, h1.stride(0), h1_sp, *hist2.stride(), *out_cache.stride(), c, triton.next_power_of_2(c), eps,
            not is_cpu(h1.device), HISTORY, parts, h1_bias is not None)
    launches_for(_ln_mish_window_kernel, h1.device).checked(
        (h1.device.index, h1.dtype, c, eps, parts, h1_bias is not None), (b * (frames + HISTORY), 1, 1),
        (h1, full1, hist2, weight, bias, out, out_cache, weight if h1_bias is None else h1_bias), tail,
    )
    return out


def warm_up(device: torch.device, dtype: torch.dtype, channels: int, eps: float) -> None:
    """Compile the kernel for `dtype` on `device` (outside any graph capture); raises what the
    compiler raises, so the caller can keep the eager ops."""
    h1 = torch.zeros(1, 1, channels, device=device, dtype=dtype)
    full1 = torch.zeros(1, 1 + HISTORY, channels, device=device, dtype=dtype)
    hist2 = torch.zeros(1, channels, HISTORY, device=device, dtype=dtype)
    weight = torch.ones(channels, device=device, dtype=dtype)
    ln_mish_window(h1, full1, hist2, weight, torch.zeros_like(weight), eps,
                   torch.zeros(1, 2 * channels, HISTORY, device=device, dtype=dtype))


def warm_up_open_sums(device: torch.device, channels: int, eps: float, parts: set[int]) -> None:
    """Compile the fp32 variants that add conv1's open sum of each count in `parts` (with a bias)."""
    weight = torch.ones(channels, device=device)
    for count in sorted(parts):
        ln_mish_window(OpenSum(torch.zeros(count, 1, 1, channels, device=device), weight),
                       torch.zeros(1, 1 + HISTORY, channels, device=device), torch.zeros(1, channels, HISTORY, device=device),
                       weight, torch.zeros_like(weight), eps, torch.zeros(1, 2 * channels, HISTORY, device=device))

