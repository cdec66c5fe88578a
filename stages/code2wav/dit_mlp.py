"""The DiT's MLP branch (fc1 + GELU-tanh + fc2) as ONE Triton launch for small chunks.

Why: at one or two requests (100-200 DiT rows) the MLP is two 3xTF32 GEMM launches
(`dit_gemm.linear`: fc1 with its GELU epilogue, then fc2, whose 2,048-deep k-sum `split_for`
splits), and the [rows, 2,048] hidden activation goes out to memory and back between them. The
launches, not the arithmetic, are what a replayed small chunk waits on (a B = 1 chunk is ~3,000
kernels; fc1 and fc2 are 320 of them, 2 in each of the 160 block-steps). Here one program owns a block of rows and a slice of the
hidden units: it computes its slice of GELU(x W1ᵀ + b1) in registers and multiplies it straight
by fc2's matching columns. fc2's k-sum over the hidden units is thereby split by slice: each
program's product is one part of it, and the parts go to the fused norm step after the branch
as a `dit_gemm.OpenSum` (parts in slice order, then fc2's bias), as a split fc2 hands its parts
today (`code2wav_open_split_sums`). So the branch is one launch instead of two (three with fc2's
own split sum) and the hidden activation never leaves the chip.

What a newcomer needs to know:
* Not bit for bit the unfused MLP: fc2's k-sum splits at slice boundaries (16 parts of 128 hidden
  units at full size) where `split_for` splits it in 4 (one request) or 2 (two), so the sum is
  added in another order. fp32 accuracy stays (3xTF32 products, fp32 accumulation); the tests
  bound the difference against the unfused MLP and torch's fp32 MLP. Eager and replayed chunks
  run the same kernel: those agree bit for bit.
* Used only where the consumer adds parts (open split sums on) and only up to `MAX_ROWS` rows
  (the GEMM tile table's thinnest bucket): past that a program's full-width fp32 accumulator
  ([BLOCK_M, C]) leaves too few programs per row block to pay, and the unfused GEMMs' larger
  tiles win. Larger chunks keep the two GEMMs.
* The tile (`MLP_TILE`, cut to a DiT's dims by `tile_for`) is a first choice, not a measured one
  (no GPU sweep yet): block_h 16 keeps fc2's [block_h, C] operand and the [block_m, C]
  accumulator in registers at C = 512. C must be a power of two (the DiT's 512 is).
* CUDA only, fp32 only (the CPU runs it under TRITON_INTERPRET=1 in tests); the first call per
  (device, shape, tile) compiles: `warm_up` does it outside any graph capture.
* Opt-in (`code2wav_fused_mlp`) and off: slower than the two GEMMs it replaces (D-DIT-10: a
  replayed chunk +57.5 % at one request, +92.1 % at two, H100). The likely cause, not profiled:
  to hold the [block_m, C] accumulator in registers its dots are 16 x 16 x 64 and 16 x 512 x 16,
  a long chain of small 3xTF32 products per program, where the split GEMMs run wide tiles.

    >>> parts = mlp(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias)  # doctest: +SKIP
    >>> y = parts.close()  # the [B, T, C] fc2 output, for a consumer that cannot add parts
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from stages.code2wav.dit_gemm import TILES, OpenSum, gemm_rows, parameters_aligned
from stages.platform.triton_launch import launches_for

# Rows (2 x requests x frames) up to which the fused MLP runs: the GEMM tile table's first
# bucket, where the unfused GEMMs run their thinnest tile and split fc2's k-sum.
MAX_ROWS = TILES[0][0]


@dataclass(frozen=True)
class MlpTile:
    block_m: int  # rows a program
    block_h: int  # hidden units a step of a program's slice
    block_k: int  # fc1's k-step (over C)
    slice: int  # hidden units a program (a part of fc2's k-sum)
    warps: int
    stages: int


MLP_TILE = MlpTile(block_m=16, block_h=16, block_k=64, slice=128, warps=8, stages=2)


def tile_for(channels: int, hidden: int) -> MlpTile | None:
    """`MLP_TILE` cut to a DiT's dims (k-steps and slices no wider than C and hidden), or None
    where the kernel cannot run: C must be a power of two of at least 16 (the accumulator is
    [block_m, C] and `tl.dot` wants 16-wide operands) and hidden whole slices of whole steps."""
    tile = MLP_TILE
    cut = MlpTile(tile.block_m, tile.block_h, min(tile.block_k, channels), min(tile.slice, hidden), tile.warps,
                  tile.stages)
    return cut if fits(cut, channels, hidden) else None


def fits(tile: MlpTile, channels: int, hidden: int) -> bool:
    """Whether the kernel runs `tile` at these dims: C a power of two >= 16 in whole k-steps,
    hidden in whole slices of whole steps."""
    return (channels >= 16 and not channels & (channels - 1) and not channels % tile.block_k
            and not hidden % tile.slice and not tile.slice % tile.block_h)


def parts_for(channels: int, hidden: int) -> int:
    """How many parts fc2's k-sum comes in (one per slice of hidden units); 0 where no tile fits."""
    tile = tile_for(channels, hidden)
    return hidden // tile.slice if tile else 0


@triton.jit(do_not_specialize=["rows"])
def _mlp_kernel(
    x_ptr,  # [rows, C] contiguous
    w1_ptr,  # [HID, C] contiguous (fc1.weight)
    b1_ptr,  # [HID]
    w2_ptr,  # [C, HID] contiguous (fc2.weight)
    parts_ptr,  # [HID // SLICE, rows, C]: each slice's product, fc2's k-sum parts
    rows,
    C: tl.constexpr,
    HID: tl.constexpr,
    SLICE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < rows
    offs_k = tl.arange(0, BLOCK_K)
    offs_h = tl.arange(0, BLOCK_H)
    offs_c = tl.arange(0, C)
    out = tl.full((BLOCK_M, C), 0.0, tl.float32)  # this slice's part of fc2's sum
    for h0 in range(0, SLICE, BLOCK_H):
        hid = part * SLICE + h0 + offs_h  # [BLOCK_H] hidden units
        acc = tl.full((BLOCK_M, BLOCK_H), 0.0, tl.float32)
        for k0 in range(0, C, BLOCK_K):
            a = tl.load(x_ptr + offs_m[:, None] * C + k0 + offs_k[None, :], mask=m_mask[:, None], other=0.0)
            w1 = tl.load(w1_ptr + hid[None, :] * C + k0 + offs_k[:, None])  # [BLOCK_K, BLOCK_H]: W1ᵀ
            acc = tl.dot(a, w1, acc, input_precision=PRECISION)
        acc += tl.load(b1_ptr + hid)[None, :]
        # GELU-tanh as `dit_gemm._linear_kernel` writes it (x sigmoid(2 z), the sigmoid spelled
        # out for the interpreter; the literal is -2 sqrt(2 / pi)).
        acc = acc / (1.0 + tl.exp((acc + 0.044715 * acc * acc * acc) * -1.5957691216057308))
        w2 = tl.load(w2_ptr + offs_c[None, :] * HID + hid[:, None])  # [BLOCK_H, C]: W2[:, hid]ᵀ
        out = tl.dot(acc, w2, out, input_precision=PRECISION)
    # Rows past `rows` computed GELU(b1) products: never stored.
    tl.store(parts_ptr + part * rows * C + offs_m[:, None] * C + offs_c[None, :], out, mask=m_mask[:, None])


def _check(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor | None,
           tile: MlpTile | None) -> tuple[int, int]:
    """(C, hidden), every operand checked: what the kernel's constexprs and loads assume."""
    hidden, c = w1.shape
    if x.dim() != 3 or x.shape[-1] != c:
        raise ValueError(f"x must be [B, T, {c}], got {tuple(x.shape)}")
    if w2.shape != (c, hidden) or b1.shape != (hidden,) or (b2 is not None and b2.shape != (c,)):
        raise ValueError(f"fc1 [{hidden}, {c}] + [{hidden}] and fc2 [{c}, {hidden}] + [{c}] expected, got "
                         f"{tuple(w1.shape)}, {tuple(b1.shape)}, {tuple(w2.shape)}, "
                         f"{None if b2 is None else tuple(b2.shape)}")
    tensors = [x, w1, b1, w2] + ([] if b2 is None else [b2])
    if any(t.dtype != torch.float32 for t in tensors) or any(t.device != x.device for t in tensors):
        raise ValueError("fp32 operands on one device only")
    if not parameters_aligned(*tensors[1:]):
        raise ValueError("the weights and biases must be contiguous and 16-byte aligned (parameters are)")
    if tile is None or not fits(tile, c, hidden):
        raise ValueError(f"no tile fits C {c} and hidden {hidden} ({tile}): C must be a power of two >= 16 and "
                         f"whole k-steps, hidden whole slices of whole steps")
    return c, hidden


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor | None, *,
        precision: str = "tf32x3", tile: MlpTile | None = None) -> OpenSum:
    """fc2(GELU-tanh(fc1(x))) of x [B, T, C] as one launch: fc2's k-sum parts, one per slice of
    hidden units, unadded, with fc2's bias (`OpenSum`; `.close()` adds them). `precision` is
    `tl.dot`'s input_precision ("tf32x3": fp32 accuracy on tensor cores; "ieee"; "tf32"); `tile`
    overrides `tile_for` (tests)."""
    tile = tile or tile_for(w1.shape[1], w1.shape[0])
    c, hidden = _check(x, w1, b1, w2, b2, tile)
    b, t, _ = x.shape
    x2 = gemm_rows(x)
    width = tile.slice
    count = hidden // width
    rows = b * t
    parts = x2.new_empty(count, rows, c)
    if rows:
        grid = (triton.cdiv(rows, tile.block_m), count, 1)
        key = (x.device.index, c, hidden, tile, precision)
        tail = (rows, c, hidden, width, tile.block_m, tile.block_h, tile.block_k, precision)
        launches_for(_mlp_kernel, x.device, aligned=True).checked(key, grid, (x2, w1, b1, w2, parts), tail,
                                                                  num_warps=tile.warps, num_stages=tile.stages)
    return OpenSum(parts.view(count, b, t, c), b2)


def mlp_reference(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor | None,
                  *, tile: MlpTile | None = None) -> OpenSum:
    """`mlp` in torch (`F.linear` in x's dtype): the same parts, each slice's GELU(x W1ᵀ + b1) W2ᵀ."""
    hidden = w1.shape[0]
    width = (tile or tile_for(w1.shape[1], hidden) or MLP_TILE).slice
    parts = []
    for start in range(0, hidden, width):
        units = slice(start, start + width)
        g = F.gelu(F.linear(x, w1[units], b1[units]), approximate="tanh")
        parts.append(F.linear(g, w2[:, units]))
    return OpenSum(torch.stack(parts), b2)


def warm_up(device: torch.device, channels: int, hidden: int) -> None:
    """Compile `mlp` for a DiT of `channels` and `hidden` MLP units now (outside any graph
    capture); raises what the compiler raises. One row suffices: rows are never specialised."""
    w1, b1 = torch.zeros(hidden, channels, device=device), torch.zeros(hidden, device=device)
    w2, b2 = torch.zeros(channels, hidden, device=device), torch.zeros(channels, device=device)
    mlp(torch.zeros(1, 1, channels, device=device), w1, b1, w2, b2)
