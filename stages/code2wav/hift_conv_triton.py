"""HiFT's stride-1 convolutions as one Triton implicit GEMM each, 3xTF32: fp32 accuracy on
tensor cores.

With TF32 off (D-PREC-1, the default) cuDNN runs HiFT's fp32 convolutions on CUDA cores, its
`nchwkcrs_nchw` fp32 kernels a tenth of a steady chunk's device time at 8 requests in the last
trace (the H200 log's code2wav-kernels part), most of them the 72 ResBlock convs (kernel 3, 7 or
11, dilations 1, 3, 5, 64-256 channels). Here a conv is the GEMM
out[b] = W [Cout, Cin * taps] @ im2col(x[b]) [Cin * taps, T] read in place: the k-index
kk = ci * taps + j is the weight's own layout, and im2col's element (kk, t) is
x[b, ci, t + j * dilation - padding], zero outside the input (the conv's zero padding), so no
padded or unfolded copy is made. Products are `tl.dot`'s 3xTF32 (each fp32 operand split into a
TF32 head and remainder; the dropped term is below fp32 rounding), as the DiT's linears
(`dit_gemm`, D-DIT-5).

What a newcomer needs to know:
* The same function as `F.conv1d` to fp32 rounding, not bit for bit (another summation order).
  Eager calls and graph replays run the same kernel with the same tile: equal bit for bit.
* Shapes: x [B, Cin, T] contiguous fp32, weight [Cout, Cin, taps] contiguous fp32 (a folded
  weight norm's, or the parametrization's output), stride 1, zero padding, one group; anything
  else is refused and `hift.Conv` keeps the module's own call.
* The tile is fixed (no autotuning: a tuning run inside a graph capture would fail), chosen for
  the shapes above without a sweep; with it a chunk was slower than with cuDNN's fp32 convs, so
  `code2wav_hift_conv_gemm` is off (D-HIFT-2) until a tuned tile beats them.
* Never import this module at import time of anything on the hot path: it imports triton.
  `stages.code2wav.kernels.hift_conv_kernel` imports it when the stage flag asks for it and
  compiles every HiFT shape there (`warm_up`), outside any graph capture.

    y = conv1d(x, conv.weight, conv.bias, dilation=3, padding=9)  # == F.conv1d(...) to fp32 rounding
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from stages.platform.triton_launch import launches_for

BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES = 64, 64, 32, 4, 3


@triton.jit(do_not_specialize=["frames_in", "frames_out", "dilation", "padding"])
def _conv1d_kernel(
    x_ptr,  # [B, CIN, frames_in] contiguous
    w_ptr,  # [COUT, CIN * TAPS] contiguous
    b_ptr,  # [COUT] (ignored without HAS_BIAS)
    out_ptr,  # [B, COUT, frames_out] contiguous
    frames_in,
    frames_out,
    dilation,  # runtime, as the frame counts: one compiled variant serves every dilation
    padding,
    CIN: tl.constexpr,
    COUT: tl.constexpr,
    TAPS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)  # a block of output channels
    pid_n = tl.program_id(1)  # a block of output frames
    b = tl.program_id(2).to(tl.int64)  # a batch row: a frame block never straddles two
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_t = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < COUT
    x_row = x_ptr + b * CIN * frames_in
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k0 in range(0, CIN * TAPS, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_mask = kk < CIN * TAPS
        ci = kk // TAPS
        src = offs_t[None, :] + ((kk - ci * TAPS) * dilation - padding)[:, None]  # [BLOCK_K, BLOCK_N] input frames
        a = tl.load(w_ptr + offs_m[:, None] * (CIN * TAPS) + kk[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)
        cols = tl.load(x_row + ci[:, None] * frames_in + src,
                       mask=k_mask[:, None] & (src >= 0) & (src < frames_in), other=0.0)  # zero padding
        acc = tl.dot(a, cols, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_m, mask=m_mask, other=0.0)[:, None]
    out = out_ptr + b * COUT * frames_out + offs_m[:, None] * frames_out + offs_t[None, :]
    tl.store(out, acc, mask=m_mask[:, None] & (offs_t < frames_out)[None, :])


def conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, dilation: int = 1,
           padding: int = 0, precision: str = "tf32x3") -> torch.Tensor:
    """`F.conv1d(x, weight, bias, stride=1, padding=padding, dilation=dilation)` as one Triton
    launch (fp32 in and out; `precision` is `tl.dot`'s input_precision: "tf32x3" fp32 accuracy
    on tensor cores, "ieee" CUDA-core fp32). Returns a new contiguous [B, Cout, T_out]."""
    if x.dim() != 3 or not x.is_contiguous() or x.dtype != torch.float32:
        raise ValueError(f"x must be a contiguous fp32 [B, Cin, T] tensor, got {tuple(x.shape)} {x.dtype} "
                         f"strides {x.stride()}")
    if weight.dim() != 3 or not weight.is_contiguous() or weight.dtype != torch.float32:
        raise ValueError(f"weight must be a contiguous fp32 [Cout, Cin, taps] tensor, got {tuple(weight.shape)} "
                         f"{weight.dtype}")
    cout, cin, taps = weight.shape
    if x.shape[1] != cin:
        raise ValueError(f"x has {x.shape[1]} channels, the weight takes {cin}")
    if bias is not None and (bias.shape != (cout,) or bias.dtype != torch.float32 or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous [{cout}] fp32 vector, got {tuple(bias.shape)} {bias.dtype}")
    if any(t.device != x.device for t in (weight, *(() if bias is None else (bias,)))):
        raise ValueError("x, weight and bias must be on one device")
    if dilation < 1 or padding < 0:
        raise ValueError(f"dilation must be >= 1 and padding >= 0, got {dilation} and {padding}")
    frames = x.shape[2] + 2 * padding - dilation * (taps - 1)
    if frames < 0:
        raise ValueError(f"{x.shape[2]} frames are too few for {taps} taps at dilation {dilation} with padding {padding}")
    out = x.new_empty(x.shape[0], cout, frames)
    if out.numel():
        grid = (triton.cdiv(cout, BLOCK_M), triton.cdiv(frames, BLOCK_N), x.shape[0])
        b_ptr = weight if bias is None else bias  # never read without a bias: any pointer
        key = (x.device.index, cin, cout, taps, bias is not None, precision)
        launches_for(_conv1d_kernel, x.device).checked(
            key, grid, (x, weight, b_ptr, out),
            (x.shape[2], frames, dilation, padding, cin, cout, taps, BLOCK_M, BLOCK_N, BLOCK_K, bias is not None,
             precision),
            num_warps=WARPS, num_stages=STAGES,
        )
    return out


def warm_up(device: torch.device, shapes: Iterable[tuple[int, int, int, bool]]) -> None:
    """Compile `conv1d` for every (Cin, Cout, taps, bias?) in `shapes` on `device` (outside any
    graph capture; frame counts, dilation and padding are runtime values); raises what the
    compiler raises."""
    for cin, cout, taps, has_bias in shapes:
        x = torch.zeros(1, cin, taps, device=device)
        weight = torch.zeros(cout, cin, taps, device=device)
        conv1d(x, weight, torch.zeros(cout, device=device) if has_bias else None)
