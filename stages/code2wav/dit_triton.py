"""Fused Triton kernels for the DiT's norm steps: residual + LayerNorm + adaLN modulation in ONE
launch for three, and the attention's q/k head norms with the K|V cache write in one for four.

Between two branches of a DiT block the eager path runs `x = x + gate * y` (addcmul), a
non-affine LayerNorm, and `LN(x) * (1 + scale) + shift` (addcmul): three launches, each reading
and writing the whole [rows, T, C] activation. At the sizes code2wav serves (2B rows of ~50 frames
x 512 channels) every one of them is launch-bound, and a steady chunk runs 160 block-steps of
three such triples (16 blocks x 10 Euler steps). `residual_norm_modulate` does the triple in one
kernel: one program per (row, frame) reads x, the branch output and the three modulation rows,
writes the new residual in place and the modulated, normalised activation to `out`.

What a newcomer needs to know:
* `qk_norm_to_cache` reads one q|k|v projection (the DiT fuses the three GEMMs, which at these
  sizes are each a split-K cuBLAS call of four kernels), LayerNorms q and k per head and writes
  K | V into the step's attention cache: two LayerNorms and two strided copies before.
* Never import this module at import time of anything on the hot path: it imports triton.
  `stages.code2wav.kernels` imports it when the flag asks for it.
* Numerics: the same function as the eager chain to fp32 rounding, not bit for bit (a
  two-pass mean/variance in fp32, the residual's fma may contract); in bfloat16 the residual is
  rounded to bfloat16 before it is normalised, as the eager chain stores it. Graph replay and
  eager calls both run this kernel, so they still agree bit for bit with each other.
* Shapes: x [B, T, C] contiguous (updated in place); y any [B, T, C] strides (the conv branch
  hands a transposed view); gate/shift/scale [B | 1, 1, C] with unit channel stride (views into
  the adaLN output, one row shared by all rows when the modulation is per step).
* Launch cost: after the first call per (device, dtype, residual?) the compiled kernel is launched
  directly (`stages.platform.triton_launch`); its int arguments are not specialised, so frame
  counts and strides never trigger a compile. The first call compiles: make it outside any graph
  capture (`warm_up` does, at selection).

    >>> out = residual_norm_modulate(x, gate, y, shift, scale, eps=1e-6)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stages.code2wav.dit_gemm import OpenSum, open_parts
from stages.platform.triton_launch import launches_for

# The int arguments that vary with the chunk's shape: not specialised (=1, %16), so one
# compiled variant serves every shape.
_SHAPE_ARGS = ["frames", "y_sb", "y_st", "y_sc", "y_sp", "gate_sb", "shift_sb", "scale_sb", "h_sb", "h_sc", "h_st"]


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _residual_norm_modulate_kernel(
    x_ptr,  # [B, T, C] contiguous: the residual stream, updated in place when HAS_RESIDUAL
    y_ptr,  # [B, T, C] strided: the branch output (ignored without HAS_RESIDUAL)
    gate_ptr,  # [B | 1, 1, C]
    shift_ptr,  # [B | 1, 1, C]
    scale_ptr,  # [B | 1, 1, C], already 1 + scale
    out_ptr,  # [B, HIST + T, C] contiguous: HIST cached frames (a conv's input window), then the result
    y_bias_ptr,  # [C]: added to y's parts (ignored without Y_BIAS)
    hist_ptr,  # [B, C, HIST] strided: the frames ahead of the result (ignored when HIST is 0)
    frames,  # T
    y_sb,
    y_st,
    y_sc,  # y's strides
    y_sp,  # the stride between y's k-sum parts (Y_PARTS > 1: a split GEMM's open sum)
    gate_sb,
    shift_sb,
    scale_sb,  # the modulation rows' batch strides (0: one row for every batch row)
    h_sb,
    h_sc,
    h_st,  # hist's strides
    C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    EPS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    Y_PARTS: tl.constexpr,
    Y_BIAS: tl.constexpr,
    HIST: tl.constexpr,
):
    program = tl.program_id(0).to(tl.int64)  # b * (HIST + T) + r
    b = program // (frames + HIST)
    t = program - b * (frames + HIST) - HIST  # negative: one of the HIST cached frames
    cols = tl.arange(0, BLOCK_C)
    mask = cols < C
    if t < 0:  # one of the HIST cached frames ahead of the result, as it was (a conv's window)
        cached = tl.load(hist_ptr + b * h_sb + cols * h_sc + (t + HIST) * h_st, mask=mask, other=0.0)
        tl.store(out_ptr + program * C + cols, cached, mask=mask)
    else:
        row = b * frames + t
        x = tl.load(x_ptr + row * C + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            y_at = y_ptr + b * y_sb + t * y_st + cols * y_sc
            y = tl.load(y_at, mask=mask, other=0.0)
            # An open sum's parts in part order, then its bias: `dit_gemm._split_sum_kernel`'s order.
            for part in range(1, Y_PARTS):
                y += tl.load(y_at + part * y_sp, mask=mask, other=0.0)
            if Y_BIAS:
                y += tl.load(y_bias_ptr + cols, mask=mask, other=0.0)
            gate = tl.load(gate_ptr + b * gate_sb + cols, mask=mask, other=0.0)
            # In the stored dtype, as the eager addcmul rounds it, then normalised in fp32.
            x = (x.to(tl.float32) + gate.to(tl.float32) * y.to(tl.float32)).to(x.dtype)
            tl.store(x_ptr + row * C + cols, x, mask=mask)
        xf = x.to(tl.float32)
        # `tl.reduce(..., tl.standard._sum_combine)` is what `tl.sum` runs; written out because
        # `tl.sum` is itself a jitted helper, which the interpreter twin cannot call when triton was
        # imported without TRITON_INTERPRET, while the interpreter patches `tl.reduce` and
        # recognises this combine function (triton 3.6 and 3.9).
        mean = tl.reduce(xf, 0, tl.standard._sum_combine) / C
        centred = tl.where(mask, xf - mean, 0.0)
        var = tl.reduce(centred * centred, 0, tl.standard._sum_combine) / C
        normed = centred / tl.sqrt_rn(var + EPS)
        shift = tl.load(shift_ptr + b * shift_sb + cols, mask=mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr + b * scale_sb + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + program * C + cols, (normed * scale + shift).to(x.dtype), mask=mask)


def _launch(kernel, device: torch.device, key: tuple, rows: int, tensors: tuple, tail: tuple) -> None:
    """One program per (row, frame) of `kernel` on `device`, every tensor already checked to be
    on it (so the compiled launch may take raw addresses: `DirectLaunches.checked`)."""
    launches_for(kernel, device).checked(key, (rows, 1, 1), tensors, tail)


def _mod_stride(row: torch.Tensor, x: torch.Tensor) -> int:
    """Batch stride of a [B | 1, 1, C] modulation row (0 when one row serves every batch row)."""
    b, _, c = x.shape
    if row.dim() != 3 or row.shape[1] != 1 or row.shape[2] != c or row.shape[0] not in (1, b) or row.stride(2) != 1:
        raise ValueError(f"modulation row must be [1 or {b}, 1, {c}] with unit channel stride, got "
                         f"{tuple(row.shape)} strides {row.stride()}")
    if row.dtype != x.dtype or row.device != x.device:
        raise ValueError(f"modulation row is {row.dtype} on {row.device}, activations {x.dtype} on {x.device}")
    return 0 if row.shape[0] == 1 else row.stride(0)


def residual_norm_modulate(
    x: torch.Tensor,
    gate: torch.Tensor | None,
    y: torch.Tensor | OpenSum | None,
    shift: torch.Tensor,
    scale: torch.Tensor,
    *,
    eps: float,
    history: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x += gate * y` (in place, skipped when gate is None), then `LN(x) * scale + shift`.

    Returns the modulated activation, a new contiguous [B, T, C] tensor. `scale` is 1 + scale.
    `y` may be a split GEMM's `OpenSum` (fp32): its parts are added as they are loaded.
    With `history` [B, C, H] (a causal conv's cached input frames, any strides) the result is
    that conv's input window instead, [B, H + T, C]: `cat([historyᵀ, activation])`, one launch.
    """
    if x.dim() != 3 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous [B, T, C] tensor, got {tuple(x.shape)} strides {x.stride()}")
    b, frames, c = x.shape
    shift_sb, scale_sb = _mod_stride(shift, x), _mod_stride(scale, x)
    has_residual = gate is not None
    y_parts, y_bias, y_sp = open_parts(y)
    y = y_parts[0] if y_parts is not None else y
    if has_residual:
        if y is None or y.shape != x.shape or y.dtype != x.dtype or y.device != x.device:
            raise ValueError(f"branch output must match x {tuple(x.shape)} {x.dtype}, got "
                             f"{None if y is None else (tuple(y.shape), y.dtype)}")
        gate_sb = _mod_stride(gate, x)
        y_sb, y_st, y_sc = y.stride()
    else:
        y, gate, (y_sb, y_st, y_sc), gate_sb = x, shift, (0, 0, 0), 0  # unused by the kernel
    hist = 0 if history is None else history.shape[2]
    if history is not None and (history.shape[:2] != (b, c) or history.dtype != x.dtype or history.device != x.device):
        raise ValueError(f"history must be [{b}, {c}, H] {x.dtype} on {x.device}, got {tuple(history.shape)} "
                         f"{history.dtype} on {history.device}")
    out = x.new_empty(b, hist + frames, c)
    if out.numel() == 0:
        return out
    parts = 1 if y_parts is None else y_parts.shape[0]
    h_strides = (0, 0, 0) if history is None else history.stride()
    tail = (frames, y_sb, y_st, y_sc, y_sp, gate_sb, shift_sb, scale_sb, *h_strides, c, triton.next_power_of_2(c),
            eps, has_residual, parts, y_bias is not None, hist)
    _launch(_residual_norm_modulate_kernel, x.device,
            (x.device.index, x.dtype, c, has_residual, eps, parts, y_bias is not None, hist), b * (hist + frames),
            (x, y, gate, shift, scale, out, x if y_bias is None else y_bias, x if history is None else history), tail)
    return out


@triton.jit(do_not_specialize=["frames", "c_sb", "c_sh", "c_st"])
def _qk_norm_to_cache_kernel(
    qkv_ptr,  # [B, T, 3, H, D] contiguous: one GEMM's q | k | v
    q_weight_ptr,
    q_bias_ptr,
    k_weight_ptr,
    k_bias_ptr,  # [D] each: the per-head LayerNorms' affine terms
    q_ptr,  # [B, T, H, D] contiguous: normalised queries
    cache_ptr,  # [B, H, T + L, 2D] strided, unit last stride: normalised K | V land at t < T
    frames,  # T
    c_sb,
    c_sh,
    c_st,  # the cache's strides
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EPS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * T + t
    b = row // frames
    t = row - b * frames
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < H) & (dims < D)
    src = qkv_ptr + row * 3 * H * D + heads * D + dims
    q = tl.load(src, mask=mask, other=0.0)
    k = tl.load(src + H * D, mask=mask, other=0.0)
    v = tl.load(src + 2 * H * D, mask=mask, other=0.0)
    dim_mask = dims < D
    q_w = tl.load(q_weight_ptr + dims, mask=dim_mask, other=0.0).to(tl.float32)
    q_b = tl.load(q_bias_ptr + dims, mask=dim_mask, other=0.0).to(tl.float32)
    k_w = tl.load(k_weight_ptr + dims, mask=dim_mask, other=0.0).to(tl.float32)
    k_b = tl.load(k_bias_ptr + dims, mask=dim_mask, other=0.0).to(tl.float32)
    # LayerNorm over D per head (axis 1), as `_residual_norm_modulate_kernel` does over C.
    qf = q.to(tl.float32)
    q_mean = tl.reduce(qf, 1, tl.standard._sum_combine) / D
    q_c = tl.where(mask, qf - q_mean[:, None], 0.0)
    q_var = tl.reduce(q_c * q_c, 1, tl.standard._sum_combine) / D
    q_n = q_c / tl.sqrt_rn(q_var + EPS)[:, None] * q_w + q_b
    kf = k.to(tl.float32)
    k_mean = tl.reduce(kf, 1, tl.standard._sum_combine) / D
    k_c = tl.where(mask, kf - k_mean[:, None], 0.0)
    k_var = tl.reduce(k_c * k_c, 1, tl.standard._sum_combine) / D
    k_n = k_c / tl.sqrt_rn(k_var + EPS)[:, None] * k_w + k_b
    tl.store(q_ptr + row * H * D + heads * D + dims, q_n.to(q.dtype), mask=mask)
    dst = cache_ptr + b * c_sb + heads * c_sh + t * c_st + dims
    tl.store(dst, k_n.to(q.dtype), mask=mask)
    tl.store(dst + D, v, mask=mask)


def qk_norm_to_cache(
    qkv: torch.Tensor,  # [B, T, 3 * H * D] contiguous
    q_norm: torch.nn.LayerNorm,
    k_norm: torch.nn.LayerNorm,
    out_cache: torch.Tensor,  # [B, H, >= T, 2D], unit last stride
    heads: int,
) -> torch.Tensor:
    """Per-head LayerNorm of q and k from one q|k|v projection; normalised K and raw V are
    written into `out_cache[:, :, :T]` (K | V on the last dim), the queries returned as a new
    contiguous [B, T, H, D] tensor. One launch for what the eager attention does in four
    (two LayerNorms, two strided cache writes)."""
    b, frames, width = qkv.shape
    d = width // (3 * heads)
    if not qkv.is_contiguous() or width != 3 * heads * d:
        raise ValueError(f"qkv must be a contiguous [B, T, 3*{heads}*D] tensor, got {tuple(qkv.shape)}")
    if (out_cache.dim() != 4 or out_cache.shape[0] != b or out_cache.shape[1] != heads
            or out_cache.shape[2] < frames or out_cache.shape[3] != 2 * d or out_cache.stride(3) != 1):
        raise ValueError(f"cache must be [{b}, {heads}, >= {frames}, {2 * d}] with unit last stride, got "
                         f"{tuple(out_cache.shape)} strides {out_cache.stride()}")
    norms = (q_norm.weight, q_norm.bias, k_norm.weight, k_norm.bias)
    if any(p is None or p.shape != (d,) or p.device != qkv.device or p.dtype != qkv.dtype for p in norms):
        raise ValueError(f"q/k LayerNorms must be affine over D = {d}, on {qkv.device} in {qkv.dtype}")
    if out_cache.device != qkv.device or out_cache.dtype != qkv.dtype:
        raise ValueError("cache and qkv must share device and dtype")
    q = qkv.new_empty(b, frames, heads, d)
    if qkv.numel() == 0:
        return q
    c_sb, c_sh, c_st, _ = out_cache.stride()
    eps = q_norm.eps
    if k_norm.eps != eps:
        raise ValueError("q and k LayerNorms must share eps")
    tail = (frames, c_sb, c_sh, c_st, heads, d, triton.next_power_of_2(heads), triton.next_power_of_2(d), eps)
    _launch(_qk_norm_to_cache_kernel, qkv.device, (qkv.device.index, qkv.dtype, heads, d, eps), b * frames,
            (qkv, *norms, q, out_cache), tail)
    return q


def warm_up(device: torch.device, dtype: torch.dtype, channels: int, eps: float, attention) -> None:
    """Compile every variant the DiT will launch now (outside any graph capture) on tiny inputs;
    raises what the compiler raises, so the caller can fall back before serving. `attention` is
    one of the DiT's attention modules (its heads and q/k LayerNorms)."""
    x = torch.zeros(1, 2, channels, device=device, dtype=dtype)
    row = torch.ones(1, 1, channels, device=device, dtype=dtype)
    residual_norm_modulate(x, None, None, row, row, eps=eps)
    residual_norm_modulate(x, row, x.clone(), row, row, eps=eps)
    h, d = attention.h, attention.d
    qkv = torch.zeros(1, 2, 3 * h * d, device=device, dtype=dtype)
    qk_norm_to_cache(qkv, attention.q_norm, attention.k_norm, torch.zeros(1, h, 2, 2 * d, device=device, dtype=dtype), h)


def warm_up_open_sums(device: torch.device, channels: int, eps: float, parts: set[int]) -> None:
    """Compile the norm step's variants that add an fp32 open sum of each count in `parts` (with a
    bias), now, outside any graph capture."""
    x = torch.zeros(1, 2, channels, device=device)
    row = torch.ones(1, 1, channels, device=device)
    for count in sorted(parts):
        residual_norm_modulate(x, row, OpenSum(torch.zeros(count, 1, 2, channels, device=device), row[0, 0]), row,
                               row, eps=eps)


def warm_up_window(device: torch.device, channels: int, eps: float) -> None:
    """Compile the fp32 norm step's variant that writes a conv's input window (two cached frames)."""
    x = torch.zeros(1, 2, channels, device=device)
    row = torch.ones(1, 1, channels, device=device)
    residual_norm_modulate(x, row, x.clone(), row, row, eps=eps, history=torch.zeros(1, channels, 2, device=device))

