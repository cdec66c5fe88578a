"""The estimator's attention-cache traffic of an Euler step as one Triton copy each way.

Each of a chunk's 10 Euler steps moves its rows' estimator attention caches twice
(`chunk_decode.PooledAttSteps`): `load` brings the rows' cached K|V from the slot pool's arena
behind the step's new frames, `store` writes the kept ranges (prompt head and newest frames) back
to the rows' slots. In torch that is `index_select` into a temporary, a copy into the step buffer,
a `cat` of the kept ranges and an `index_put_` (the deterministic, sort-based one): four passes
over ~52 MB a request and step, plus the small launches that build the indices. Here each way is
one pass: every program copies one dense span of frames of one (block, row, head) between the
arena and the step buffer, the slot read from the index on the device.

What a newcomer needs to know:
* Layout: both sides are [outer, rows, heads, frames, E] with dense [frames, E] (E = 2 x head
  dim, K|V); outer, rows and heads may have any strides (arena[step] and the step buffer are
  plain contiguous tensors). Frames are addressed in whole rows of E, so a span is one dense
  run of n * E elements on both sides.
* Bit for bit torch's copies (a copy converts nothing unless the dtypes differ, then it casts
  as `.to` does). Source and destination must not share memory; the index must hold valid,
  distinct rows of the indexed side (the pool's slots are): nothing checks it on the device.
* 16-byte loads and stores: launched `aligned` (`stages.platform.triton_launch`), so the
  wrapper refuses pointers or strides that are not multiples of 16 bytes instead of letting the
  compiled variant read them misaligned.
* Never import this module at import time of anything on the hot path: it imports triton.
  `stages.code2wav.kernels.cache_copy_kernel` imports it when the stage flag asks for it, and
  compiles both directions there (`warm_up`), outside any graph capture.

    gather_frames(arena[step], pairs, buf, at=t, frames=length)        # load
    scatter_frames(buf, pairs, arena[step], [(0, 0, 300), (n - 100, 300, 100)])  # store
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from stages.platform.triton_launch import launches_for

_BLOCK = 4096  # elements a program: 32 a thread at 4 warps, eight 16-byte accesses each way
_WARPS = 4
_ALIGN_BYTES = 16
MAX_SPANS = 2  # the trim keeps at most two ranges (flow_cache.AttKeep.ranges)


@triton.jit
def _copy_frames_kernel(
    src_ptr,  # [outer, rows_s, heads, frames_s, E], dense [frames, E]
    dst_ptr,  # [outer, rows_d, heads, frames_d, E], dense [frames, E]
    index_ptr,  # [rows] int64, any stride: the indexed side's row of each of the other side's rows
    i_stride,  # (a column of the chunk's meta tensor is a strided view)
    s_outer, s_row, s_head,  # src strides (elements)
    d_outer, d_row, d_head,  # dst strides
    rows,  # rows of the side that is not indexed
    heads,
    a_src, a_dst, a_n,  # span 0: source frame, destination frame, frames
    b_src, b_dst, b_n,  # span 1 (b_n = 0: none)
    E: tl.constexpr,
    ALIGN: tl.constexpr,  # elements every base offset is a multiple of (16 bytes' worth)
    GATHER: tl.constexpr,  # the index picks source rows (True) or destination rows (False)
    BLOCK: tl.constexpr,
):
    blk = tl.program_id(0).to(tl.int64)  # (o * rows + r) * heads + h
    h = blk % heads
    rest = blk // heads
    r = rest % rows
    o = rest // rows
    if tl.program_id(2) == 0:
        src_f = a_src
        dst_f = a_dst
        n = a_n
    else:
        src_f = b_src
        dst_f = b_dst
        n = b_n
    chosen = tl.load(index_ptr + r * i_stride)
    if GATHER:
        src_row = chosen
        dst_row = r
    else:
        src_row = r
        dst_row = chosen
    src_base = o * s_outer + src_row * s_row + h * s_head + src_f.to(tl.int64) * E
    dst_base = o * d_outer + dst_row * d_row + h * d_head + dst_f.to(tl.int64) * E
    src_base = tl.multiple_of(src_base, ALIGN)
    dst_base = tl.multiple_of(dst_base, ALIGN)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n.to(tl.int64) * E
    v = tl.load(src_ptr + src_base + offs, mask=mask)
    tl.store(dst_ptr + dst_base + offs, v.to(dst_ptr.dtype.element_ty), mask=mask)


def _check(src: torch.Tensor, dst: torch.Tensor, index: torch.Tensor, *, indexed: torch.Tensor) -> None:
    for name, t in (("source", src), ("destination", dst)):
        if t.dim() != 5:
            raise ValueError(f"{name} must be [outer, rows, heads, frames, E], got {tuple(t.shape)}")
        if t.stride(4) != 1 or t.stride(3) != t.shape[4]:
            raise ValueError(f"{name} needs dense [frames, E], got strides {t.stride()}")
        if t.device != index.device:
            raise ValueError(f"{name} on {t.device}, index on {index.device}")
        bytes_per = t.element_size()
        if t.data_ptr() % _ALIGN_BYTES or any(s * bytes_per % _ALIGN_BYTES for s in t.stride()[:4]):
            raise ValueError(f"{name} pointer and strides must be multiples of {_ALIGN_BYTES} bytes, "
                             f"got strides {t.stride()} ({t.dtype})")
    if src.shape[0] != dst.shape[0] or src.shape[2] != dst.shape[2] or src.shape[4] != dst.shape[4]:
        raise ValueError(f"source {tuple(src.shape)} and destination {tuple(dst.shape)} differ outside rows and frames")
    if index.dim() != 1 or index.dtype != torch.int64:
        raise ValueError(f"index must be 1-D int64, got {tuple(index.shape)} {index.dtype}")
    other = dst if indexed is src else src
    if index.shape[0] != other.shape[1]:
        raise ValueError(f"index has {index.shape[0]} rows, the other side {other.shape[1]}")
    if src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
        raise ValueError("source and destination share memory (one program would read what another writes)")


def _launch(src, dst, index, spans: Sequence[tuple[int, int, int]], *, gather: bool) -> None:
    if not 1 <= len(spans) <= MAX_SPANS:
        raise ValueError(f"1 to {MAX_SPANS} spans, got {len(spans)}")
    for s, d, n in spans:
        if n < 0 or s < 0 or d < 0 or s + n > src.shape[3] or d + n > dst.shape[3]:
            raise ValueError(f"span (from {s}, to {d}, {n} frames) outside source frames {src.shape[3]} "
                             f"or destination frames {dst.shape[3]}")
    (a_src, a_dst, a_n), (b_src, b_dst, b_n) = (*spans, (0, 0, 0))[:2]
    rows = dst.shape[1] if gather else src.shape[1]
    blocks = src.shape[0] * rows * src.shape[2]
    e = src.shape[4]
    longest = max(a_n, b_n) * e
    if not blocks or not longest:
        return
    align = min(_ALIGN_BYTES // src.element_size(), _ALIGN_BYTES // dst.element_size())
    grid = (blocks, triton.cdiv(longest, _BLOCK), 1 if b_n == 0 else 2)
    launches_for(_copy_frames_kernel, src.device, aligned=True).checked(
        (src.device.index, src.dtype, dst.dtype, e, align, gather), grid, (src, dst, index),
        (index.stride(0), *src.stride()[:3], *dst.stride()[:3], rows, src.shape[2], a_src, a_dst, a_n, b_src, b_dst, b_n,
         e, align, gather, _BLOCK),
        num_warps=_WARPS,
    )


def gather_frames(src: torch.Tensor, index: torch.Tensor, dst: torch.Tensor, *, at: int, frames: int) -> None:
    """dst[:, r, :, at : at + frames] = src[:, index[r], :, :frames] for every row r of dst:
    what `dst[:, :, :, at:at + frames].copy_(src[:, :, :, :frames].index_select(1, index))` does,
    in one pass."""
    _check(src, dst, index, indexed=src)
    _launch(src, dst, index, [(0, at, frames)], gather=True)


def scatter_frames(src: torch.Tensor, index: torch.Tensor, dst: torch.Tensor,
                   spans: Sequence[tuple[int, int, int]]) -> None:
    """For each span (source frame, destination frame, frames):
    dst[:, index[r], :, to : to + n] = src[:, r, :, start : start + n] for every row r of src, in
    one pass (at most two spans: the trim's kept ranges, written back to back)."""
    _check(src, dst, index, indexed=dst)
    _launch(src, dst, index, list(spans), gather=False)


def warm_up(device: torch.device, dtype: torch.dtype, width: int) -> None:
    """Compile both directions for caches of `dtype` and K|V width `width` (E, a constexpr) on
    `device`, outside any graph capture; raises what the compiler raises."""
    arena = torch.zeros(1, 2, 1, 4, width, device=device, dtype=dtype)
    buf = torch.zeros(1, 1, 1, 6, width, device=device, dtype=dtype)
    index = torch.ones(1, device=device, dtype=torch.int64)
    gather_frames(arena, index, buf, at=2, frames=4)
    scatter_frames(buf, index, arena, [(0, 0, 2), (4, 2, 2)])
