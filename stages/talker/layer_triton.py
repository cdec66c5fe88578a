"""Fused Triton kernels for the talker's decode layers: residual + RMSNorm in ONE launch for
seven, and RoPE of q and k with the K and V cache writes in one launch for about thirty.

Why: a decode step's forward replays as one device graph, but the graph still runs every kernel
in it, and at the batch sizes served (<= 128 rows of 768 channels) each kernel is a few
microseconds of mostly fixed cost. An H200 ran ~1,650 kernels a step (B = 128, fp32; D-TALKER-2
has the fused count and times): per layer 22 for the two deterministic cache writes
(`index_put_` sorts its indices, checks bounds, and scatters), 10 for RoPE, 12 for two RMSNorms
with their residual adds, and 14 for seven split-K GEMMs. Beside the code2wav replicas on the
same GPU each kernel also waits for SMs, so the step's kernel count is what its time scales with.

* `add_rms_norm(x, delta, norm)`: `s = x + delta` (in the stored dtype, as torch adds), then
  `norm.weight * (s * rsqrt(mean(s^2) + eps)).to(dtype)` in fp32, HF Llama's order. One program
  per row. Returns (s, normed); without delta, s is x itself.
* `rope_to_cache(qkv, positions, cos, sin, k_cache, v_cache, heads)`: one row of the fused q|k|v
  projection per decode row r (cache slot r). q and k get HF's half-split RoPE at `positions[r]`
  (cos/sin rows gathered in the kernel from the model's tables), k and v land in
  `cache[r, :, positions[r]]`, and the rotated q is returned as [R, H, 1, hd]. One program per
  (row, head of q|k|v). Each written position is unique per launch, so plain stores are
  deterministic without the sort the torch write needs.

What a newcomer needs to know:
* Numerics: RoPE and the cache write are bit for bit what `Attention.forward` computes
  (`x * cos + rotate_half(x) * sin`, each product rounded to the stored dtype): the kernel is
  compiled with `enable_fp_fusion=False`, so the sum of the two products is not contracted into
  an fma. The RMSNorm's mean reduces in another order than torch's: fp32 noise, not bit for bit.
  Graph replay and eager calls run the same kernels, so they agree with each other bit for bit.
* Never import this module at import time of anything on the hot path: it imports triton.
  `stages.talker.kernels` imports it when the stage flag asks for it.
* The first call per (device, dtype, variant) compiles: make it outside any graph capture
  (`warm_up` does, at selection). Shapes and positions are runtime values, never specialised.

    >>> s, h = add_rms_norm(x, attn_out, layer.post_attention_layernorm)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stages.platform.triton_launch import launches_for


@triton.jit(do_not_specialize=["eps"])
def _add_rms_norm_kernel(
    x_ptr,  # [R, D] contiguous: the residual stream
    delta_ptr,  # [R, D] contiguous: the branch output (ignored without HAS_DELTA)
    weight_ptr,  # [D]
    sum_ptr,  # [R, D] contiguous: x + delta (ignored without HAS_DELTA); may be x itself
    out_ptr,  # [R, D] contiguous: the normalised row
    eps,  # fp32
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_DELTA: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row * D + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(x.dtype)  # rounded as torch's add stores it
        tl.store(sum_ptr + row * D + cols, x, mask=mask)
    xf = x.to(tl.float32)
    # `tl.reduce(..., tl.standard._sum_combine)` is what `tl.sum` runs, written out for the
    # interpreter twin (see stages.code2wav.dit_triton).
    mean_square = tl.reduce(xf * xf, 0, tl.standard._sum_combine) / D
    normed = (xf * tl.math.rsqrt(mean_square + eps)).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * D + cols, (weight.to(tl.float32) * normed.to(tl.float32)).to(x.dtype), mask=mask)


@triton.jit(do_not_specialize=["qkv_stride", "max_seq"])
def _rope_to_cache_kernel(
    qkv_ptr,  # [R, (H + 2 KVH) * HD], unit last stride: q heads, then k heads, then v heads
    pos_ptr,  # [R] int64: the position row r writes (its cache slot is r)
    cos_ptr,  # [max_seq, HD] contiguous, the stored dtype
    sin_ptr,  # [max_seq, HD]
    q_ptr,  # [R, H, HD] contiguous: rotated queries
    k_cache_ptr,  # [slots, KVH, max_seq, HD] contiguous
    v_cache_ptr,  # [slots, KVH, max_seq, HD] contiguous
    qkv_stride,  # row stride of qkv
    max_seq,
    H: tl.constexpr,
    KVH: tl.constexpr,
    HD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # 0..H-1: q, H..H+KVH-1: k, then v
    d = tl.arange(0, HD)
    x = tl.load(qkv_ptr + row * qkv_stride + head * HD + d)
    pos = tl.load(pos_ptr + row)
    # A position outside the cache reads no table row and writes nothing (the torch write would
    # raise on the device); the engine never passes one, a wrong caller must not corrupt memory.
    at_pos = pos + d * 0  # the position on every lane: a block-shaped mask
    in_cache = (at_pos >= 0) & (at_pos < max_seq)
    if head < H + KVH:
        # rotate_half: [-x2, x1] over the two halves of the head.
        half = HD // 2
        # Negated in fp32 (exact for any stored dtype): the interpreter holds bfloat16 as raw
        # 16-bit integers, which a negation in the stored dtype would scramble.
        partner = tl.load(qkv_ptr + row * qkv_stride + head * HD + (d + half) % HD).to(tl.float32)
        rotated = tl.where(d < half, -partner, partner)
        cos = tl.load(cos_ptr + pos * HD + d, mask=in_cache, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + pos * HD + d, mask=in_cache, other=0.0).to(tl.float32)
        # Each product rounded to the stored dtype, then their sum: torch's three ops.
        a = (x.to(tl.float32) * cos).to(x.dtype).to(tl.float32)
        b = (rotated * sin).to(x.dtype).to(tl.float32)
        x = (a + b).to(x.dtype)
    if head < H:
        tl.store(q_ptr + (row * H + head) * HD + d, x)
    else:
        is_v = head >= H + KVH
        kv_head = head - H - tl.where(is_v, KVH, 0)
        at = ((row * KVH + kv_head) * max_seq + pos) * HD + d
        if is_v:
            tl.store(v_cache_ptr + at, x, mask=in_cache)
        else:
            tl.store(k_cache_ptr + at, x, mask=in_cache)


def _check(t: torch.Tensor, like: torch.Tensor, what: str) -> None:
    if t.device != like.device or t.dtype != like.dtype:
        raise ValueError(f"{what} is {t.dtype} on {t.device}, the activations {like.dtype} on {like.device}")


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm(x + delta)) for contiguous [R, D] rows; `norm` is an RMSNorm module
    (weight [D], eps). Without delta: (x, RMSNorm(x)). Both outputs are new tensors but x."""
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"x must be contiguous [R, D], got {tuple(x.shape)} strides {x.stride()}")
    rows, d = x.shape
    weight = norm.weight
    if weight.shape != (d,):
        raise ValueError(f"norm weight {tuple(weight.shape)} does not fit rows of {d}")
    _check(weight, x, "the norm weight")
    has_delta = delta is not None
    if has_delta:
        if delta.shape != x.shape or not delta.is_contiguous():
            raise ValueError(f"delta must be contiguous like x {tuple(x.shape)}, got {tuple(delta.shape)}")
        _check(delta, x, "delta")
        total = torch.empty_like(x)
    else:
        delta = total = x  # unused by the kernel
    out = torch.empty_like(x)
    if rows:
        eps = float(norm.eps)
        tail = (eps, d, triton.next_power_of_2(d), has_delta)
        launches_for(_add_rms_norm_kernel, x.device).checked(
            (x.device.index, x.dtype, d, has_delta), (rows, 1, 1), (x, delta, weight, total, out), tail
        )
    return total, out


def rope_to_cache(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """RoPE'd q [R, H, 1, hd] from qkv [R, (H + 2 KVH) * hd]; k (rotated) and v written into
    `k_cache` / `v_cache` [slots, KVH, max_seq, hd] at (slot r, position positions[r]).
    cos/sin: the model's [max_seq, hd] tables. positions must be in [0, max_seq) (the engine
    keeps them there; a free row writes at its own position 0): a row outside writes no cache
    row and its q is garbage, instead of a write out of bounds."""
    rows = qkv.shape[0]
    slots, kv_heads, max_seq, hd = k_cache.shape
    if qkv.dim() != 2 or qkv.stride(1) != 1 or qkv.shape[1] != (heads + 2 * kv_heads) * hd:
        raise ValueError(f"qkv must be [R, {(heads + 2 * kv_heads) * hd}] with unit last stride, "
                         f"got {tuple(qkv.shape)} strides {qkv.stride()}")
    if v_cache.shape != k_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k and v caches must be contiguous and of one shape")
    if rows > slots or positions.shape != (rows,) or positions.dtype != torch.long:
        raise ValueError(f"positions must be [R] int64 with R <= {slots} slots, got "
                         f"{tuple(positions.shape)} {positions.dtype}")
    if cos.shape != (max_seq, hd) or sin.shape != cos.shape or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"rope tables must be contiguous [{max_seq}, {hd}], got {tuple(cos.shape)}")
    for t, what in ((k_cache, "the k cache"), (v_cache, "the v cache"), (cos, "cos"), (sin, "sin")):
        _check(t, qkv, what)
    if positions.device != qkv.device:
        raise ValueError(f"positions are on {positions.device}, qkv on {qkv.device}")
    q = torch.empty(rows, heads, 1, hd, device=qkv.device, dtype=qkv.dtype)
    if rows:
        tail = (qkv.stride(0), max_seq, heads, kv_heads, hd)
        # One warp per 64-element head; no fma contraction, so RoPE rounds as torch does.
        launches_for(_rope_to_cache_kernel, qkv.device).checked(
            (qkv.device.index, qkv.dtype, heads, kv_heads, hd), (rows, heads + 2 * kv_heads, 1),
            (qkv, positions, cos, sin, q, k_cache, v_cache), tail, num_warps=1, enable_fp_fusion=False,
        )
    return q


def warm_up(model) -> None:
    """Compile every variant the talker's fused decode will launch (outside any graph capture) on
    one row of the model's own shapes, into scratch tensors (the model's caches are untouched);
    raises what the compiler raises, so the caller can keep the unfused layers."""
    cfg, layer = model.cfg, model.model.layers[0]
    weight = layer.input_layernorm.weight
    device, dtype = weight.device, weight.dtype
    x = torch.zeros(1, cfg.hidden_size, device=device, dtype=dtype)
    add_rms_norm(x, None, layer.input_layernorm)
    add_rms_norm(x, x.clone(), layer.input_layernorm)
    heads, kv_heads, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qkv = torch.zeros(1, (heads + 2 * kv_heads) * hd, device=device, dtype=dtype)
    cache = torch.zeros(2, 1, kv_heads, 1, hd, device=device, dtype=dtype)
    table = torch.zeros(1, hd, device=device, dtype=dtype)
    rope_to_cache(qkv, torch.zeros(1, dtype=torch.long, device=device), table, table, cache[0], cache[1], heads)
