"""The DiT's fp32 linears on tensor cores at fp32 accuracy: one Triton GEMM with 3xTF32 products.

At the row counts code2wav serves (2 x rows x ~50 frames: 100 rows for one request) cuBLAS runs
the DiT's fp32 linears on CUDA cores (FFMA), a skinny split-K kernel of four launches for the
2,048-deep fc2; on an H200 those GEMMs were 18.9 of a 35.0 ms B = 1 chunk
(results/h200/code2wav_bench_frames_first_kernels_b1.json). TF32 (`token2wav_allow_tf32`) is faster but rounds every input to 10 mantissa
bits. 3xTF32 splits each fp32 operand into a TF32 "big" part and a TF32 remainder and sums
big*big + big*small + small*big on tensor cores with an fp32 accumulator: the dropped term is
below fp32's own rounding. Measured on an H200 against fp64 (`scripts/bench_dit_gemm.py`): 2-4e-7
of the output's range, cuBLAS fp32 0.3-2e-6, one-pass TF32 3e-4; per chunk, the mel moved 0.0001
dB from cuBLAS fp32 against 10.7 dB between two noise seeds (`scripts/precision_drift.py`; D-DIT-5).

`linear(x, weight, bias, gelu=False)` = `x @ weight.T + bias` (then GELU-tanh when asked): the
bias and the activation are the GEMM's epilogue, so one launch replaces cuBLAS's one to four.

What a newcomer needs to know:
* CUDA only, fp32 only (a bf16 DiT already runs cuBLAS on tensor cores); `kernels.gemm_kernel`
  decides, and the CPU keeps `F.linear` (it runs this kernel under TRITON_INTERPRET=1, in
  tests only). Never import this module on the hot path of a CPU run: it imports triton.
* The tile shape comes from `tile_for(rows)`, a table measured on an H200 per row bucket
  (no autotuning: a tuning run inside a graph capture would fail, and a table keeps eager and
  replayed chunks on the same kernel, so they agree bit for bit).
* Launch cost: after the first call per (device, N, K, tile, epilogue) the compiled kernel is
  launched directly (`stages.platform.triton_launch`), specialised on pointer alignment (the
  16-byte loads are what a GEMM lives on: unaligned inputs are copied first) and never on the
  row count. The first call compiles: make it outside any graph capture (`warm_up` does).
* A GEMM too small to fill the device (few rows, deep K: fc2 at one or two requests) splits
  its k-sum in parts added by a second launch in part order (`split_for`); the split depends on
  the shape only, so it is deterministic.
* `open_sum=True` (a DiT branch's last GEMM: proj, fc2, the convs; `code2wav_open_split_sums`):
  a split GEMM returns its parts unadded (`OpenSum`) and the consumer (the norm step, the conv
  block's LayerNorm + Mish) adds them as it loads them, in part order then the bias, as
  `_split_sum_kernel` does: bit for bit the added tensor, one launch fewer. An unsplit GEMM
  returns its tensor as ever.
* Not batch-invariant: a row's result does not depend on the other rows' values, but the tile
  and the k-split depend on the row count, and a row may round differently in a chunk of another
  size (graph replay and eager of one shape share tile and split: equal bit for bit).

    >>> y = linear(x, fc1.weight, fc1.bias, gelu=True)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from stages.platform.triton_launch import launches_for

_ALIGN_BYTES = 16  # what a vectorised load needs, and what the compiled variant assumes


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int


@dataclass(frozen=True)
class OpenSum:
    """A split GEMM's [B, T, N] result with its k-sum parts not yet added: the value is
    parts[0] + parts[1] + ... (in part order), then + bias, as `_split_sum_kernel` adds them;
    `close()` is that launch. `parts` is [S, B, T, N], any strides with a dense last dim (a conv's
    parts keep the window's batch stride)."""

    parts: torch.Tensor
    bias: torch.Tensor | None

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    def close(self) -> torch.Tensor:
        """The added [B, T, N] tensor (contiguous), by `_split_sum_kernel`: what the GEMM would
        have returned without `open_sum`, bit for bit. For a consumer that cannot add parts."""
        s, b, t, n = self.parts.shape
        parts = self.parts.contiguous().view(s, b * t, n)
        out = parts.new_empty(b * t, n)
        if out.numel():
            _sum_parts(parts, self.bias, out, gelu=False)
        return out.view(b, t, n)


def open_parts(y) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
    """(parts [S, B, T, C], bias or None, the parts' stride) of an `OpenSum`, checked for a
    kernel that adds them as it loads; (None, None, 0) for anything else."""
    if not isinstance(y, OpenSum):
        return None, None, 0
    parts, bias = y.parts, y.bias
    if parts.dim() != 4 or parts.dtype != torch.float32 or parts.stride(3) != 1:
        raise ValueError(f"an open sum's parts must be fp32 [S, B, T, C] with a dense last dim, got "
                         f"{tuple(parts.shape)} {parts.dtype} strides {parts.stride()}")
    if bias is not None and (bias.shape != parts.shape[3:] or bias.dtype != parts.dtype or bias.device != parts.device):
        raise ValueError(f"an open sum's bias must be a [{parts.shape[3]}] fp32 vector on its device")
    return parts, bias, parts.stride(0)


# (most rows, tile) in row order; the last bound is open. Each tile is the one with the least
# summed time over the block's four linears (q|k|v, proj, fc1, fc2) at its row counts in a sweep
# of tiles (`scripts/bench_dit_gemm.py`, D-DIT-5): few rows, thin tiles, so that enough programs
# fill the SMs without a split k-sum; many rows, larger tiles for reuse. One table serves every
# DiT shape: at each row count it came close to every shape's own best tile (the sweep's file).
TILES: tuple[tuple[int | None, Tile], ...] = (
    (256, Tile(16, 64, 64, 4, 4)),
    (800, Tile(64, 32, 32, 4, 3)),
    (3200, Tile(64, 64, 32, 4, 3)),
    (None, Tile(128, 64, 32, 8, 3)),
)


def tile_for(rows: int) -> Tile:
    """The tile for a GEMM of `rows` rows (`TILES`)."""
    return next(tile for most, tile in TILES if most is None or rows <= most)


# A split k-sum for GEMMs that leave the device idle: below about this many programs (two per
# SM of an H200) a deep GEMM is split along K into parts of at least `_MIN_SPLIT_STEPS` K-blocks
# each, the parts' sums written apart and added in part order by a second launch (deterministic:
# the order never depends on timing). At 100 rows fc2 (K 2,048) is 56 programs of 32 steps each.
_TARGET_PROGRAMS = 264
_MIN_SPLIT_STEPS = 8


def split_for(rows: int, n: int, k: int, tile: Tile) -> int:
    """How many parts the k-sum of a [rows, k] x [k, n] GEMM with `tile` runs in (a power of 2;
    1 = not split): doubled while the grid stays within `_TARGET_PROGRAMS` and each part keeps
    `_MIN_SPLIT_STEPS` whole K-blocks. Depends on the shape only, so eager and replay agree."""
    programs = triton.cdiv(rows, tile.block_m) * triton.cdiv(n, tile.block_n)
    split = 1
    while (programs * split * 2 <= _TARGET_PROGRAMS and k % (split * 2 * tile.block_k) == 0
           and k // (split * 2 * tile.block_k) >= _MIN_SPLIT_STEPS):
        split *= 2
    return split


@triton.jit(do_not_specialize=["rows"])
def _linear_kernel(
    x_ptr,  # [rows, K], row stride X_STRIDE (K: contiguous; less: overlapping rows, a conv's window)
    w_ptr,  # [N, K] contiguous (nn.Linear's weight)
    b_ptr,  # [N] (ignored without HAS_BIAS)
    out_ptr,  # [rows, N] contiguous; SPLIT_K > 1: the parts' sums [SPLIT_K, rows, N]
    rows,
    N: tl.constexpr,
    K: tl.constexpr,
    X_STRIDE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GELU: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    part = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < rows
    n_mask = offs_n < N
    k_first = part * (K // SPLIT_K)  # split_for only splits K into whole, equal K-blocks
    x_tile = x_ptr + offs_m[:, None] * X_STRIDE + k_first + offs_k[None, :]
    w_tile = w_ptr + offs_n[None, :] * K + k_first + offs_k[:, None]  # [BLOCK_K, BLOCK_N]: W^T
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # not tl.zeros: a jitted helper (see GELU)
    for k0 in range(0, K // SPLIT_K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(x_tile, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_tile, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    if SPLIT_K > 1:  # bias and activation after the parts are added (`_split_sum_kernel`)
        out_ptr += part * rows * N
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
        if GELU:
            # sigmoid written out: `tl.sigmoid` is a jitted helper, which the interpreter twin
            # cannot call when triton was imported without TRITON_INTERPRET (see dit_triton's
            # `tl.reduce`). GELU-tanh(x) = 0.5 x (1 + tanh(z)) = x sigmoid(2 z), z = sqrt(2 / pi)
            # (x + 0.044715 x^3); the literal is -2 sqrt(2 / pi) (a global constexpr does not
            # survive the interpreter); the split sum's epilogue repeats it.
            acc = acc / (1.0 + tl.exp((acc + 0.044715 * acc * acc * acc) * -1.5957691216057308))
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["total"])
def _split_sum_kernel(
    parts_ptr,  # [SPLIT_K, rows, N]: each part's k-sum
    b_ptr,  # [N] (ignored without HAS_BIAS)
    out_ptr,  # [rows, N] contiguous
    total,  # rows * N
    N: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GELU: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.load(parts_ptr + offs, mask=mask, other=0.0)
    for part in range(1, SPLIT_K):  # in part order: the same sums on every run
        acc += tl.load(parts_ptr + part * total + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0)
    if GELU:  # as in `_linear_kernel`
        acc = acc / (1.0 + tl.exp((acc + 0.044715 * acc * acc * acc) * -1.5957691216057308))
    tl.store(out_ptr + offs, acc, mask=mask)


_SUM_BLOCK = 1024


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % _ALIGN_BYTES == 0


def gemm_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` [..., K] as the [rows, K] operand a compiled variant assumes: contiguous and 16-byte
    aligned (it was specialised on the first call's alignment), copied when it is not, never
    read misaligned."""
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    return x2 if _aligned(x2) else x2.clone()


def parameters_aligned(*tensors: torch.Tensor | None) -> bool:
    """Whether every given weight or bias is contiguous and 16-byte aligned (parameters are)."""
    return all(t.is_contiguous() and _aligned(t) for t in tensors if t is not None)


def linear(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None,  # [N]
    *,
    gelu: bool = False,
    precision: str = "tf32x3",
    tile: Tile | None = None,
    split_k: int | None = None,
    open_sum: bool = False,
) -> torch.Tensor | OpenSum:
    """`F.linear(x, weight, bias)` (then GELU-tanh when `gelu`) as one Triton launch, fp32 in and
    out; `precision` is `tl.dot`'s input_precision ("tf32x3": fp32 accuracy on tensor cores;
    "ieee": CUDA-core fp32; "tf32"); `tile` overrides `tile_for` (the benchmark's sweep) and
    `split_k` overrides `split_for` (tests, warm-up). Returns a new contiguous [..., N] tensor, or
    with `open_sum` (a [B, T, K] x without GELU) an `OpenSum` when the k-sum is split."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dim is {x.shape[-1]}, the weight takes {k}")
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise ValueError(f"fp32 only, got x {x.dtype} and weight {weight.dtype}")
    if bias is not None and (bias.shape != (n,) or bias.dtype != torch.float32):
        raise ValueError(f"bias must be a [{n}] fp32 vector, got {tuple(bias.shape)} {bias.dtype}")
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if any(t.device != x.device for t in tensors):
        raise ValueError("x, weight and bias must be on one device")
    if open_sum and (x.dim() != 3 or gelu):
        raise ValueError(f"an open sum is a [B, T, N] result without GELU, got x {tuple(x.shape)} gelu={gelu}")
    if not parameters_aligned(weight, bias):
        raise ValueError("weight and bias must be contiguous and 16-byte aligned (parameters are)")
    lead = x.shape[:-1]
    x2 = gemm_rows(x)
    rows = x2.shape[0]
    if not rows:
        return x2.new_empty(*lead, n)
    result, opened = _gemm(x2, k, rows, weight, bias, out_rows=rows, gelu=gelu, precision=precision, tile=tile,
                           split_k=split_k, open_sum=open_sum)
    return OpenSum(result.view(-1, *lead, n), bias) if opened else result.view(*lead, n)


def _gemm(x: torch.Tensor, x_stride: int, rows: int, weight: torch.Tensor, bias: torch.Tensor | None, *,
          out_rows: int, gelu: bool, precision: str, tile: Tile | None, split_k: int | None,
          open_sum: bool = False) -> tuple[torch.Tensor, bool]:
    """Rows of x (row r at x's start + r * x_stride, K wide) @ weight.T + bias: the launch(es)
    behind `linear` and `causal_conv`, every operand checked by them. Returns (a new
    [out_rows, N] tensor holding the rows, False), or with `open_sum` and a split k-sum
    (the parts [S, rows, N] unadded, True), no output tensor made."""
    n, k = weight.shape
    tile = tile or tile_for(rows)
    if split_k is None:
        split_k = split_for(rows, n, k, tile)
    if split_k < 1 or (split_k > 1 and k % (split_k * tile.block_k)):
        raise ValueError(f"split_k {split_k} does not cut K {k} into whole {tile.block_k}-deep blocks")
    grid = (triton.cdiv(rows, tile.block_m), triton.cdiv(n, tile.block_n), split_k)
    key = (x.device.index, n, k, x_stride, tile, bias is not None, gelu, precision, split_k)
    tail = (rows, n, k, x_stride, tile.block_m, tile.block_n, tile.block_k, bias is not None, gelu, precision,
            split_k)
    # Without a bias the kernels never read b_ptr: the weight stands in (any aligned pointer).
    b_ptr = weight if bias is None else bias
    out = None if open_sum and split_k > 1 else x.new_empty(out_rows, n)
    sums = out if split_k == 1 else x.new_empty(split_k, rows, n)
    launches_for(_linear_kernel, x.device, aligned=True).checked(key, grid, (x, weight, b_ptr, sums), tail,
                                                                 num_warps=tile.warps, num_stages=tile.stages)
    if out is None:
        return sums, True
    if split_k > 1:
        _sum_parts(sums, bias, out[:rows], gelu=gelu)
    return out, False


def _sum_parts(parts: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, *, gelu: bool) -> None:
    """out = the parts [S, R, N] (contiguous) added in part order, + bias, GELU'd when asked."""
    split_k, rows, n = parts.shape
    b_ptr = parts if bias is None else bias  # never read without a bias
    launches_for(_split_sum_kernel, parts.device, aligned=True).checked(
        (parts.device.index, n, split_k, bias is not None, gelu), (triton.cdiv(rows * n, _SUM_BLOCK), 1, 1),
        (parts, b_ptr, out), (rows * n, n, split_k, bias is not None, gelu, _SUM_BLOCK))


def causal_conv(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *,
                precision: str = "tf32x3", tile: Tile | None = None, split_k: int | None = None,
                open_sum: bool = False) -> torch.Tensor | OpenSum:
    """A valid 1-D conv over a frames-first window [B, taps - 1 + T, C] (contiguous, fp32) as ONE
    GEMM: im2col row (b, t) is the `taps` frames window[b, t : t + taps], which in a contiguous
    window are taps * C adjacent floats, so the kernel reads the window in place with a row stride
    of C (overlapping rows, no unfold copy). `weight` is [N, taps * C] with k = tap * C + c (the
    frames-first conv's channels-last [N, taps, C] weight, flattened). The taps - 1 rows a batch
    row that would straddle two batch rows are computed and dropped. Returns [B, T, N] as a view
    with batch stride (taps - 1 + T) * N (the DiT's consumers take strided input); with `open_sum`
    and a split k-sum, an `OpenSum` whose parts are such views."""
    if window.dim() != 3 or not window.is_contiguous() or window.dtype != torch.float32:
        raise ValueError(f"the window must be a contiguous fp32 [B, L, C] tensor, got {tuple(window.shape)} "
                         f"{window.dtype} strides {window.stride()}")
    b, length, c = window.shape
    n, k = weight.shape
    taps = k // c if c else 0
    if taps < 1 or taps * c != k or length < taps:
        raise ValueError(f"the weight [{n}, {k}] is not taps x {c} channels for a window of {length} frames")
    if weight.dtype != torch.float32 or not weight.is_contiguous() or not _aligned(weight) or window.device != weight.device:
        raise ValueError("the weight must be a contiguous, 16-byte aligned fp32 tensor on the window's device")
    if bias is not None and (bias.shape != (n,) or bias.dtype != torch.float32 or not _aligned(bias)
                             or bias.device != window.device):
        raise ValueError(f"bias must be an aligned [{n}] fp32 vector on the window's device")
    if (c * window.element_size()) % _ALIGN_BYTES:
        raise ValueError(f"{c} channels do not keep the window's rows 16-byte aligned")
    if not _aligned(window):  # the compiled variant assumes aligned operands (see `linear`)
        window = window.clone()
    rows = b * length - (taps - 1)  # every row start whose taps frames lie inside the buffer
    frames = length - taps + 1
    if rows <= 0:
        return window.new_empty(b, frames, n)
    result, opened = _gemm(window, c, rows, weight, bias, out_rows=b * length, gelu=False, precision=precision,
                           tile=tile, split_k=split_k, open_sum=open_sum)
    if opened:  # [S, rows, N] seen as the output's [B, T, N] view is: batch stride length * N
        return OpenSum(result.as_strided((result.shape[0], b, frames, n), (rows * n, length * n, n, 1)), bias)
    return result.view(b, length, n)[:, :frames]


def _every_tile_and_split(n: int, k: int) -> Iterator[tuple[Tile, int]]:
    """Every (tile, k-split) a GEMM of N = n, K = k can be launched with: each tile of `TILES`
    with the most parts its bucket's fewest rows give, halving down to 1 as rows grow."""
    fewest = 1
    for most, tile in TILES:
        split = split_for(fewest, n, k, tile)
        while split >= 1:
            yield tile, split
            split //= 2
        fewest = (most or fewest) + 1


def splits(n: int, k: int) -> set[int]:
    """Every k-split above 1 a GEMM of N = n, K = k can be launched with (the part counts an
    `OpenSum` of it can have)."""
    return {split for _, split in _every_tile_and_split(n, k) if split > 1}


def warm_up_conv(device: torch.device, channels: int, taps: int = 3) -> None:
    """Compile `causal_conv` for a DiT of `channels` (N = C, K = taps * C, biased) with every tile
    and k-split it can be given; raises what the compiler raises."""
    weight, bias = torch.zeros(channels, taps * channels, device=device), torch.zeros(channels, device=device)
    window = torch.zeros(1, taps, channels, device=device)  # one im2col row
    for tile, split in _every_tile_and_split(channels, taps * channels):
        causal_conv(window, weight, bias, tile=tile, split_k=split)


def warm_up(device: torch.device, shapes: list[tuple[int, int, bool, bool]]) -> None:
    """Compile every (N, K, bias?, gelu?) in `shapes` with every tile of `TILES` and every k-split
    that tile can be given, now (outside any graph capture: a first launch compiles); raises
    what the compiler raises, so the caller can fall back. One row suffices: the row count is
    never specialised."""
    for n, k, has_bias, gelu in shapes:
        weight = torch.zeros(n, k, device=device)
        bias = torch.zeros(n, device=device) if has_bias else None
        for tile, split in _every_tile_and_split(n, k):
            linear(torch.zeros(1, k, device=device), weight, bias, gelu=gelu, tile=tile, split_k=split)
