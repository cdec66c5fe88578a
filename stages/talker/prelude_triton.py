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
  is launched directly (`stages.platform.triton_launch`): no Triton binder, no per-call closure or
  hook plumbing while no launch hook is registered, int pointers on NVIDIA. The sampler calls
  `RepPenTempStep`, the kernel bound to its static row state: per step only the logits are
  checked and passed, the other five pointers were resolved at binding. The kernel is
  launch-bound, so every line on that path is the metric (scripts/bench_prelude.py).
* Graph capture: the launch allocates nothing when `out=` is given, reads no tensor value on the
  host and derives the grid from shapes only, so it records into a CUDA/NPU graph as one node.
  The FIRST call in a process compiles: make it outside any capture (one eager call).

    >>> out = rep_pen_temp(logits, history, history_len, pow_table, temperature)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stages.platform.triton_launch import DirectLaunches, build_launcher, kernel_for

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


# Built once at import (pure Python: no device, no compile yet).
_REP_PEN_TEMP_DEVICE = DirectLaunches(build_launcher(_rep_pen_temp_kernel, "cuda"))
_F32, _I32 = torch.float32, torch.int32  # dtype objects are singletons: `is` tests are exact


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
    not even that with `out=`); the grid comes from shapes only. The steady state (device
    tensors, canonical dtypes, a kernel already compiled for this device, V and W) is the
    inline branch below: identity tests and one dict lookup, then the raw launch. Everything
    else (first call, CPU, other dtypes, strided logits, errors) goes through `_rep_pen_temp_slow`.
    """
    batch, vocab = logits.shape
    window = history.shape[1]
    # get_device(): an int (-1 on CPU, never a key here), unlike `.device`, which builds an object.
    device = logits.get_device()
    launch = _REP_PEN_TEMP_DEVICE.compiled.get((device, vocab, window))
    if (
        launch is not None
        and batch
        and logits.dtype is _F32
        and history.dtype is _I32
        and history_len.dtype is _I32
        and pow_table.dtype is _F32
        and temperature.dtype is _F32
        and pow_table.shape[1] == window + 1
        and logits.is_contiguous()
    ):
        if out is None:
            out = torch.empty_like(logits)
        elif not (
            out.dtype is _F32
            and out.shape == logits.shape
            and out.is_contiguous()
            and out.get_device() == device
        ):
            raise _out_error(out, logits)
        blocks = (vocab + BLOCK_V - 1) // BLOCK_V
        if (
            launch.pointers_as_ints
            # Int pointers skip the launcher's own check that each one is device memory: a
            # host pointer would fault on the device and poison the context instead of
            # raising. Same device for all six is what makes them safe; else pass tensors.
            and history.get_device() == device
            and history_len.get_device() == device
            and pow_table.get_device() == device
            and temperature.get_device() == device
        ):
            launch(batch, blocks, 1, logits.data_ptr(), history.data_ptr(),
                   history_len.data_ptr(), pow_table.data_ptr(), temperature.data_ptr(),
                   out.data_ptr(), vocab, window, BLOCK_V)  # fmt: skip
        else:  # tensors: the launcher checks each pointer itself
            launch(batch, blocks, 1, logits, history, history_len, pow_table, temperature, out,
                   vocab, window, BLOCK_V)  # fmt: skip
        return out
    return _rep_pen_temp_slow(logits, history, history_len, pow_table, temperature, out=out)


def _out_error(out: torch.Tensor, logits: torch.Tensor) -> ValueError:
    return ValueError(
        f"error: out buffer {tuple(out.shape)} {out.dtype} on {out.device} must be contiguous "
        f"and shaped like logits {tuple(logits.shape)} {logits.dtype} on {logits.device} "
        f"(rep_pen_temp); allocate it with torch.empty_like(logits)"
    )


def _rep_pen_temp_slow(
    logits: torch.Tensor,
    history: torch.Tensor,
    history_len: torch.Tensor,
    pow_table: torch.Tensor,
    temperature: torch.Tensor,
    *,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Checked path: validation, CPU interpreter, first (compiling) launch, unusual dtypes."""
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
    elif (
        out.shape != logits.shape
        or out.dtype != logits.dtype
        or not out.is_contiguous()
        or out.device != logits.device
    ):
        raise _out_error(out, logits)
    if batch == 0:  # no active rows: nothing to launch (a zero grid is an error on some drivers)
        return out
    # Plain integer ceil-div: triton.cdiv is a constexpr-aware wrapper costing microseconds.
    # Always three dimensions: CompiledKernel[grid] in triton 3.6 indexes grid[0..2] directly.
    grid = (batch, (vocab + BLOCK_V - 1) // BLOCK_V, 1)
    args = (logits, history, history_len, pow_table, temperature, out, vocab, window, BLOCK_V)
    if logits.is_cpu:
        kernel_for(_rep_pen_temp_kernel, logits.device)[grid](*args)
    elif _canonical_dtypes(history, history_len, pow_table, temperature):
        # The fast path's key: its dtype tests stand in for dtypes in the key.
        _REP_PEN_TEMP_DEVICE((logits.get_device(), vocab, window), grid, *args)
    else:  # e.g. int64 history: correct through Triton's binder, just not the fast path
        _REP_PEN_TEMP_DEVICE.jit_fn[grid](*args)
    return out


def _canonical_dtypes(history, history_len, pow_table, temperature) -> bool:
    return (history.dtype, history_len.dtype, pow_table.dtype, temperature.dtype) == (
        _I32, _I32, _F32, _F32,
    )  # fmt: skip


class RepPenTempStep:
    """`rep_pen_temp` bound to a sampler's static row state: `step(logits)` per decode step.

    history [S, W] int32, history_len [S] int32, pow_table [S, W + 1] fp32, temperature [S]
    fp32 and out [S, V] fp32 are the sampler's slot buffers, allocated once and only ever
    written in place, so their pointers hold for the life of this object (which keeps them
    referenced). `step(logits [R, V])` with R <= S computes rows [:R] into `out[:R]` and
    returns that view: exactly `rep_pen_temp(logits, history[:R], ..., out=out[:R])`.

    Why bind: the per-call form checks six tensors and slices five state buffers per step, about
    as much host time as the launch itself; bound, one branch checks the logits and launches.
    Anything else (first, compiling call; CPU; odd logits) takes `rep_pen_temp` itself.
    """

    def __init__(self, history, history_len, pow_table, temperature, out):
        slots, self._vocab = out.shape
        self._window = history.shape[1]
        self._slots, self._device = slots, out.get_device()
        self._blocks = (self._vocab + BLOCK_V - 1) // BLOCK_V
        self._state = (history, history_len, pow_table, temperature, out)
        self._rows: dict[int, torch.Tensor] = {}  # R -> out[:R], made once per R
        self._launch = None  # set after the first launch compiled for this device
        self._pointers: tuple = ()
        self._ints = False
        shapes_ok = (
            tuple(history.shape) == (slots, self._window)
            and tuple(history_len.shape) == (slots,)
            and tuple(pow_table.shape) == (slots, self._window + 1)
            and tuple(temperature.shape) == (slots,)
        )
        if not shapes_ok:
            raise ValueError(
                f"error: sampler state shapes history {tuple(history.shape)}, history_len "
                f"{tuple(history_len.shape)}, pow_table {tuple(pow_table.shape)}, temperature "
                f"{tuple(temperature.shape)} do not match out {tuple(out.shape)} "
                f"(RepPenTempStep); allocate them together (SamplerState.allocate)"
            )
        self._bindable = _canonical_dtypes(history, history_len, pow_table, temperature) and all(
            t.is_contiguous() and t.get_device() == self._device for t in self._state
        ) and out.dtype is _F32  # fmt: skip

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        rows, vocab = logits.shape
        launch = self._launch
        if (
            launch is not None
            and 0 < rows <= self._slots
            and vocab == self._vocab
            and logits.dtype is _F32
            and logits.get_device() == self._device
            and logits.is_contiguous()
        ):
            out = self._rows.get(rows)
            if out is None:
                out = self._rows[rows] = self._state[4][:rows]
            # Int pointers are safe: logits were just checked to live on the state's device.
            launch(rows, self._blocks, 1, logits.data_ptr() if self._ints else logits,
                   *self._pointers)  # fmt: skip
            return out
        return self._checked(logits)

    def _checked(self, logits: torch.Tensor) -> torch.Tensor:
        """The per-call form (validation, compile, interpreter); arms the bound launch."""
        rows = logits.shape[0]
        if rows > self._slots:
            raise ValueError(
                f"error: {rows} logit rows for a sampler state of {self._slots} slots "
                f"(RepPenTempStep); a step samples at most max_batch rows"
            )
        history, history_len, pow_table, temperature, out = (t[:rows] for t in self._state)
        result = rep_pen_temp(logits, history, history_len, pow_table, temperature, out=out)
        if self._launch is None and self._bindable:
            key = (self._device, self._vocab, self._window)
            self._arm(_REP_PEN_TEMP_DEVICE.compiled.get(key))
        return result

    def _arm(self, launch) -> None:
        if launch is None:  # not compiled for this device (CPU, or the binder path was taken)
            return
        self._ints = launch.pointers_as_ints
        state = tuple(t.data_ptr() for t in self._state) if self._ints else self._state
        self._pointers = (*state, self._vocab, self._window, BLOCK_V)
        self._launch = launch
