"""Fused Triton twin of the sampling prelude: repetition penalty + temperature in ONE launch.

`rep_pen_temp` computes exactly what `stages.talker.prelude.penalty_temperature_eager` computes,
bit for bit, for a whole [B, V] batch in a single kernel (grid = rows x vocab blocks). The eager
chain costs 14 small kernels per decode step (measured on an H200); this costs one, which is the
point (seed item 1).

What a newcomer needs to know:
* Never import this module at import time of anything on the hot path: it imports triton.
  `stages.talker.prelude.select_prelude` imports it lazily and latches to eager if it fails.
* CPU tensors run through the Triton interpreter (slow, for correctness tests: the dispatcher only
  offers the fused path on CPU under TRITON_INTERPRET=1); device tensors always run compiled. The
  choice is made per launch from the tensor's device, not from the environment at import time,
  so one process can test both (the kernel tests run CPU and CUDA cases side by side).
* Launch cost: only pointers are runtime arguments, and after the first call the compiled kernel
  is launched directly (`DirectLaunches`), skipping Triton's per-call Python binder.
* Graph capture: the launch allocates nothing when `out=` is given, reads no tensor value on the
  host and derives the grid from shapes only, so it records into a CUDA/NPU graph as one node.
  The FIRST call in a process compiles: make it outside any capture (one eager call).

    >>> out = rep_pen_temp(logits, history, history_len, pow_table, temperature)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Vocab elements per program. 1024 fp32 = 4 KiB per row block; V = 6562 -> 7 programs per row.
# The kernel is launch-bound at every B we serve (<= 128 rows), so the block size barely matters
# (Triton's default of 4 warps is used: passing num_warps would cost launch time too).
BLOCK_V = 1024

# Landmine (numerics): Triton's fp32 `/` lowers on NVIDIA to `div.full.f32`, an APPROXIMATE
# division (<= 2 ulp), while torch's CUDA and CPU kernels divide with IEEE round-to-nearest.
# `div_rn` (PreciseDivFOp -> `div.rn.f32`) is the IEEE division; both triton 3.6 and 3.9 expose
# it as `tl.math.div_rn` (and `tl.fdiv(..., ieee_rounding=True)` lowers to the same op); on both
# it emits `div.rn.f32` without `.ftz` (older releases went through libdevice with FTZ on and
# flushed subnormals). tests/kernels reads the sm_90 PTX to keep it that way, no GPU needed.
# Call it as `tl.math.div_rn` inside the kernel (no module-level alias): the interpreter
# patches the attribute on tl.math.


@triton.jit
def _rep_pen_temp_kernel(
    logits_ptr,  # [B, V] fp32, contiguous
    history_ptr,  # [B, W] int32, contiguous; slots >= history_len hold garbage
    history_len_ptr,  # [B] int32
    pow_table_ptr,  # [B, W + 1] fp32, contiguous: penalty**k, k = 0..W (built at admission)
    temperature_ptr,  # [B] fp32
    out_ptr,  # [B, V] fp32, contiguous
    VOCAB: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Only pointers are runtime arguments: every extra argument costs host time in Triton's
    # launcher, and this kernel exists to cost one launch. V and W are fixed per model.
    row = tl.program_id(0).to(tl.int64)  # int64 offsets: B * V never wraps
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < VOCAB

    # Integer counts of each code among the VALID history slots (slot < history_len), the same
    # integers `history_counts` produces with scatter_add; invalid slots never match.
    history_len = tl.load(history_len_ptr + row)
    # `cols * 0`, not tl.zeros: tl.zeros is itself a jitted helper, which the interpreter twin
    # cannot call when triton was imported without TRITON_INTERPRET; builtins work in both modes.
    count = cols * 0
    for slot in tl.static_range(WINDOW):
        code = tl.load(history_ptr + row * WINDOW + slot)
        count += ((cols == code) & (slot < history_len)).to(tl.int32)

    # Exact by construction: alpha is READ from the per-request fp32 table penalty**k computed
    # once at admission, exactly like the eager path's torch.gather. Evaluating
    # exp2(count * log2(penalty)) here instead would lower to the hardware `ex2.approx` /
    # `lg2.approx` (~2 ulp, flush-to-zero) on NVIDIA, while torch.pow/exp2 on the eager side go
    # through libdevice/SLEEF with different rounding: the two alphas would differ in the last
    # bit for some counts and the "bit-for-bit twin" claim would be false.
    alpha = tl.load(pow_table_ptr + row * (WINDOW + 1) + count, mask=in_vocab, other=1.0)
    logit = tl.load(logits_ptr + row * VOCAB + cols, mask=in_vocab, other=0.0)
    temperature = tl.load(temperature_ptr + row)

    # Same op order as eager: where(x < 0, x * alpha, x / alpha), then / temperature. -0.0 < 0
    # is false, so -0.0 takes the division and stays -0.0 in both paths; -inf * alpha = -inf.
    x = tl.where(logit < 0, logit * alpha, tl.math.div_rn(logit, alpha))
    y = tl.math.div_rn(x, temperature)
    tl.store(out_ptr + row * VOCAB + cols, y, mask=in_vocab)


@triton.jit
def _empty_kernel(x_ptr):
    """Does nothing: its launch cost is the floor the fused prelude is judged against."""
    pass


# (id(kernel), device type) -> launchable: interpreted twin for "cpu", compiled otherwise.
_launchers: dict[tuple[int, str], object] = {}


def _build_launcher(kernel, device_type: str):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if device_type == "cpu":
        return kernel if isinstance(kernel, InterpretedFunction) else InterpretedFunction(kernel.fn)
    # No pointer-alignment specialization: then a compiled variant depends only on dtypes and
    # constexprs, which is what lets `DirectLaunches` reuse it without re-running Triton's
    # binder (scalar instead of 16-byte loads costs nothing measurable: launch-bound kernel).
    pointers = [name for name in kernel.arg_names if name.endswith("_ptr")]
    return JITFunction(kernel.fn, do_not_specialize_on_alignment=pointers)


def kernel_for(kernel, device: torch.device):
    """`kernel` as it must run on `device`: interpreted on CPU, compiled elsewhere (cached)."""
    key = (id(kernel), device.type)
    launcher = _launchers.get(key)
    if launcher is None:
        launcher = _launchers[key] = _build_launcher(kernel, device.type)
    return launcher


class DirectLaunches:
    """Launch a jitted kernel; after the first launch for a key, call its compiled kernel.

    `JITFunction.__getitem__(grid)(...)` re-binds and re-specializes every argument and formats
    its options on each call: several microseconds of Python per launch, as much as the launch.
    The first call per key goes through it (compiling if needed) and keeps the CompiledKernel it
    returns; later calls use `CompiledKernel[grid](*args)`, the same C launcher on the current
    stream (so graph capture still records it). `key` must pin everything the compiled variant
    depends on: device, dtypes and constexpr values (alignment is not specialized, see above).
    Never take the first launch for a key inside a graph capture: that would compile there.
    """

    def __init__(self, jit_fn):
        self.jit_fn = jit_fn
        self.compiled: dict[tuple, object] = {}

    def __call__(self, key: tuple, grid: tuple[int, ...], *args) -> None:
        kernel = self.compiled.get(key)
        if kernel is not None:
            kernel[grid](*args)
            return
        kernel = self.jit_fn[grid](*args)
        if callable(getattr(kernel, "__getitem__", None)):  # a CompiledKernel (triton 3.x)
            self.compiled[key] = kernel


# Built once at import (pure Python: no device, no compile yet); the hot path reaches it with
# one attribute test, not a cache lookup: every microsecond here is launch overhead, the very
# quantity this kernel exists to remove.
_REP_PEN_TEMP_DEVICE = DirectLaunches(_build_launcher(_rep_pen_temp_kernel, "cuda"))


def rep_pen_temp(
    logits: torch.Tensor,
    history: torch.Tensor,
    history_len: torch.Tensor,
    pow_table: torch.Tensor,
    temperature: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused penalty + temperature; same contract as `penalty_temperature_eager`.

    logits: [B, V] fp32, history: [B, W] int32, history_len: [B] int32, pow_table: [B, W + 1]
    fp32, temperature: [B] fp32 -> [B, V] fp32. `out` (a contiguous static buffer, for graph
    capture) is written and returned if given. The sampler's row state (history, pow_table, ...)
    is contiguous by construction and not re-checked here; strided logits are copied first.

    Host cost is the point: no .item(), no host sync, no tensor created except the output (and
    not even that with `out=`); the grid comes from shapes only.
    """
    batch, vocab = logits.shape
    window = history.shape[1]
    if logits.dtype != torch.float32:
        raise ValueError(
            f"error: logits are {logits.dtype} (rep_pen_temp); the prelude contract is fp32 "
            f"logits, pass logits.float()"
        )
    if pow_table.shape[1] != window + 1:
        raise ValueError(
            f"error: pow_table has {pow_table.shape[1]} columns for a history window of {window} "
            f"(rep_pen_temp); build rows with penalty_pow_table(penalty, window)"
        )
    if not logits.is_contiguous():
        logits = logits.contiguous()  # correct, one extra copy; the sampler passes contiguous
    if out is None:
        out = torch.empty_like(logits)
    elif out.shape != logits.shape or out.dtype != logits.dtype or not out.is_contiguous():
        raise ValueError(
            f"error: out buffer {tuple(out.shape)} {out.dtype} must be contiguous and shaped like "
            f"logits {tuple(logits.shape)} {logits.dtype} (rep_pen_temp); allocate it with "
            f"torch.empty_like(logits)"
        )
    if batch == 0:  # no active rows: nothing to launch (a zero grid is an error on some drivers)
        return out
    # Plain integer ceil-div: triton.cdiv is a constexpr-aware wrapper costing microseconds.
    # Always three dimensions: CompiledKernel[grid] in triton 3.6 indexes grid[0..2] directly.
    grid = (batch, (vocab + BLOCK_V - 1) // BLOCK_V, 1)
    args = (logits, history, history_len, pow_table, temperature, out, vocab, window, BLOCK_V)
    if logits.is_cpu:
        kernel_for(_rep_pen_temp_kernel, logits.device)[grid](*args)
    else:
        key = (logits.device, vocab, window, logits.dtype, history.dtype, history_len.dtype,
               pow_table.dtype, temperature.dtype)  # fmt: skip
        _REP_PEN_TEMP_DEVICE(key, grid, *args)
    return out

