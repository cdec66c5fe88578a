"""The DiT's attention for small chunks as one Triton kernel: online softmax, 3xTF32 dots.

For chunks of few requests `Attention` runs softmax(q k^T / sqrt(D)) v as two batched cuBLAS
GEMMs and a softmax (`dit.attention_by_matmul`, chosen over the fused SDPA kernel because a
one-request chunk gives a fused kernel 16 blocks on 132 SMs). On an H200 those GEMMs were still
CUDA-core fp32 kernels: 4.4 of 27.5 device ms of a B = 1 chunk (results/h200/code2wav_bench_tf32x3_kernels_b1.json),
plus q's scaled copy, the softmax and the output's transposing copy: five launches a block-step.
`attention(q, kv, frames)` is one launch: one program per (row, head, block of 16 queries) walks
the K|V cache in blocks with a running max and sum (flash attention's online softmax), its dots
3xTF32 (fp32 accuracy on tensor cores, as `dit_gemm`), and writes [B, T, H, D] directly, so the
projection reads it without a copy.

What a newcomer needs to know:
* CUDA only, fp32, unmasked (the streaming path: every query sees the whole cache); the CPU runs
  it only under TRITON_INTERPRET=1, in tests. `kernels.attention_kernel(..., triton=True)` decides.
* Numerics: the same function to fp32 rounding, not bit for bit: the softmax is normalised once
  at the end and the sum runs blockwise. Graph replay and eager both run this kernel: equal.
* Shapes: q [B, T, H, D] with unit last stride (the q/k norm kernel's output); kv [B, H, L, 2D]
  with unit last stride (the step's cache, K | V on the last dim, current frames first);
  D <= 128. Strides and lengths are never specialised (DirectLaunches: one variant per D).

    >>> out = attention(q, kv, heads=8)  # doctest: +SKIP   # [B, T, H, D]
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from stages.platform.triton_launch import launches_for

_BLOCK_T = 16  # queries a program: 4 programs a (row, head) for a 50-frame chunk
_BLOCK_L = 64  # cache frames a step of the walk


@triton.jit(do_not_specialize=["frames", "length", "q_sb", "q_st", "q_sh", "kv_sb", "kv_sh", "kv_sl",
                               "o_sb", "o_st", "o_sh"])
def _attention_kernel(
    q_ptr,  # [B, T, H, D], unit last stride
    kv_ptr,  # [B, H, L, 2D], unit last stride: K | V
    out_ptr,  # [B, T, H, D] contiguous
    frames,  # T
    length,  # L
    q_sb,
    q_st,
    q_sh,
    kv_sb,
    kv_sh,
    kv_sl,
    o_sb,
    o_st,
    o_sh,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_L: tl.constexpr,
    SCALE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    h = bh - b * H
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_mask = offs_t < frames
    d_mask = offs_d < D
    q = tl.load(q_ptr + b * q_sb + h * q_sh + offs_t[:, None] * q_st + offs_d[None, :],
                mask=t_mask[:, None] & d_mask[None, :], other=0.0)
    q = q * SCALE
    kv_row = kv_ptr + b * kv_sb + h * kv_sh
    # Running max, sum and output; every block holds at least one valid frame (l0 < length), so
    # the max is finite after the first block. Reductions through `tl.reduce` (see dit_triton).
    m = tl.full((BLOCK_T,), float("-inf"), tl.float32)
    s_sum = tl.full((BLOCK_T,), 0.0, tl.float32)
    acc = tl.full((BLOCK_T, BLOCK_D), 0.0, tl.float32)
    for l0 in range(0, length, BLOCK_L):
        offs_l = l0 + tl.arange(0, BLOCK_L)
        l_mask = offs_l < length
        k = tl.load(kv_row + offs_l[None, :] * kv_sl + offs_d[:, None],  # [BLOCK_D, BLOCK_L]: K^T
                    mask=d_mask[:, None] & l_mask[None, :], other=0.0)
        scores = tl.dot(q, k, input_precision=PRECISION)
        scores = tl.where(l_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.reduce(scores, 1, tl.standard._elementwise_max))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        s_sum = s_sum * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        v = tl.load(kv_row + offs_l[:, None] * kv_sl + D + offs_d[None, :],  # [BLOCK_L, BLOCK_D]
                    mask=l_mask[:, None] & d_mask[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m = m_new
    out = acc / s_sum[:, None]
    tl.store(out_ptr + b * o_sb + h * o_sh + offs_t[:, None] * o_st + offs_d[None, :], out,
             mask=t_mask[:, None] & d_mask[None, :])


def attention(q: torch.Tensor, kv: torch.Tensor, *, precision: str = "tf32x3") -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for q [B, T, H, D] against kv [B, H, L, 2D] (K | V), unmasked;
    returns a new contiguous [B, T, H, D] tensor (what the projection reads as [B, T, H * D])."""
    if q.dim() != 4 or kv.dim() != 4:
        raise ValueError(f"q must be [B, T, H, D] and kv [B, H, L, 2D], got {tuple(q.shape)} and {tuple(kv.shape)}")
    b, frames, heads, d = q.shape
    if kv.shape[0] != b or kv.shape[1] != heads or kv.shape[3] != 2 * d or kv.shape[2] < 1:
        raise ValueError(f"kv must be [{b}, {heads}, L >= 1, {2 * d}] for q {tuple(q.shape)}, got {tuple(kv.shape)}")
    if q.stride(3) != 1 or kv.stride(3) != 1:
        raise ValueError("q and kv need a unit last stride")
    if q.dtype != torch.float32 or kv.dtype != torch.float32 or q.device != kv.device:
        raise ValueError(f"fp32 on one device only, got q {q.dtype} on {q.device}, kv {kv.dtype} on {kv.device}")
    if d > 128:
        raise ValueError(f"head dim {d} > 128")
    out = q.new_empty(b, frames, heads, d)
    if out.numel() == 0:
        return out
    block_d = max(16, triton.next_power_of_2(d))
    scale = 1.0 / math.sqrt(d)
    grid = (b * heads, triton.cdiv(frames, _BLOCK_T), 1)
    tail = (frames, kv.shape[2], q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.stride(1), kv.stride(2),
            out.stride(0), out.stride(1), out.stride(2), heads, d, block_d, _BLOCK_T, _BLOCK_L, scale, precision)
    launches_for(_attention_kernel, q.device).checked((q.device.index, heads, d, precision), grid, (q, kv, out), tail)
    return out
