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
  is launched directly (`DirectLaunches`, `direct_launch`): no Triton binder, no per-call closure
  or hook plumbing while no launch hook is registered, int pointers on NVIDIA. The steady state
  is one inline branch of identity tests in `rep_pen_temp`; the kernel is launch-bound, so every
  line there is the metric (scripts/bench_prelude.py). Triton internals this relies on, each
  verified once per compiled kernel or read from the 3.6 and 3.9 sources, are listed at
  `_raw_launch` and `_INT_POINTER_LAUNCHERS`; anything unexpected falls back to Triton's own path.
* Graph capture: the launch allocates nothing when `out=` is given, reads no tensor value on the
  host and derives the grid from shapes only, so it records into a CUDA/NPU graph as one node.
  The FIRST call in a process compiles: make it outside any capture (one eager call).

    >>> out = rep_pen_temp(logits, history, history_len, pow_table, temperature)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Hashable

import torch
import triton
import triton.language as tl

log = logging.getLogger(__name__)

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


def _closure_launch(compiled) -> Callable[..., None]:
    """Launch through `CompiledKernel[grid](*args)`: Triton's own per-call path (always right)."""

    def launch(grid0: int, grid1: int, grid2: int, *args) -> None:
        compiled[(grid0, grid1, grid2)](*args)

    return launch


def _probe_getitem_convention(compiled) -> bool:
    """True if `CompiledKernel.__getitem__` calls `run` exactly as `_raw_launch` will.

    Runs the INSTALLED `__getitem__` against a stand-in object (never the real kernel, so no
    launch can be lost and no handle is touched) and checks the positional layout it hands to
    `run`: (grid0, grid1, grid2, stream, function, packed_metadata, launch_metadata,
    enter_hook, exit_hook, *kernel_args). Identical in triton 3.6 and 3.9 (compiler.py).
    """
    from triton import knobs

    record: list[tuple] = []
    metadata = object()
    stand_in = types.SimpleNamespace(
        _init_handles=lambda: None,
        launch_metadata=lambda grid, stream, *args: metadata,
        run=lambda *call: record.append(call),
        function=object(),
        packed_metadata=object(),
    )
    args, stream = (object(), object()), object()
    type(compiled).__getitem__(stand_in, (2, 3, 1))(*args, stream=stream)
    rt = knobs.runtime
    expected = (2, 3, 1, stream, stand_in.function, stand_in.packed_metadata, metadata,
                rt.launch_enter_hook, rt.launch_exit_hook, *args)  # fmt: skip
    return len(record) == 1 and len(record[0]) == len(expected) and all(
        a is b for a, b in zip(record[0], expected, strict=True)
    )


def _current_device_fn(driver_active) -> Callable[[], int]:
    """Triton's "current device" query, minus torch's lazy-init wrapper when it is torch's.

    `torch.cuda.current_device()` is `_lazy_init(); torch._C._cuda_getDevice()`: three Python
    frames per launch. By the time a raw launch exists CUDA is initialised (the first launch
    went through Triton), so the C getter alone returns the same index.
    """
    get_device = driver_active.get_current_device
    cuda_get_device = getattr(torch._C, "_cuda_getDevice", None)
    if get_device is getattr(torch.cuda, "current_device", None) and cuda_get_device is not None:
        return cuda_get_device
    return get_device


def _raw_launch(compiled) -> Callable[..., None] | None:
    """A launch that calls `compiled.run` (the C launcher) directly, or None if unsafe here.

    What `CompiledKernel[grid](*args)` costs per call and this skips: a fresh closure, a Python
    `launch_metadata` that builds a LazyDict whenever a hook object exists (the default
    `knobs.runtime.launch_*_hook` is an EMPTY `HookChain`, never None, in triton 3.6 and 3.9),
    and the C launcher calling both empty chains back into Python. With no hook registered we
    pass None for launch_metadata and both hooks, which the launcher treats as "no hook"; with
    any hook registered (e.g. a profiler) each call takes the closure path instead, so hooks
    always fire. Constexpr args are still passed: 3.6's launcher parses one "O" per constexpr.
    Landmines: keep `compiled` referenced (3.9's CompiledKernel.__del__ unloads the module the
    raw `function` handle lives in); `run` is fixed once handles are initialised (the property
    only swaps it for a raising stub when initialisation fails, and ours already succeeded).
    """
    try:
        from triton import knobs
        from triton.runtime.driver import driver

        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        if function is None or not callable(run) or not _probe_getitem_convention(compiled):
            raise TypeError("unexpected CompiledKernel layout")
        runtime, chain = knobs.runtime, getattr(knobs, "HookChain", None)
        current_device = _current_device_fn(driver.active)
        current_stream = driver.active.get_current_stream
    except Exception as exc:  # any surprise: Triton's own per-call path, same results
        log.debug("fused prelude: direct launch unavailable (%s: %s)", type(exc).__name__, exc)
        return None
    closure = _closure_launch(compiled)

    def launch(grid0: int, grid1: int, grid2: int, *args) -> None:
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        if (enter is None or (type(enter) is chain and not enter.calls)) and (
            leave is None or (type(leave) is chain and not leave.calls)
        ):
            stream = current_stream(current_device())
            run(grid0, grid1, grid2, stream, function, packed, None, None, None, *args)
        else:
            closure(grid0, grid1, grid2, *args)

    launch.compiled = compiled  # the reference that keeps `function` loaded (see above)
    launch.pointers_as_ints = _launcher_takes_int_pointers(run)
    return launch


# Launcher classes whose C code takes a Python int as a pointer argument AS IS (read in the
# source of triton 3.6 `getPointer` and 3.9 `extractPointer`: `if (PyLong_Check(obj))` returns
# the value). A tensor instead costs a `data_ptr()` call from C plus `cuPointerGetAttribute`
# per pointer, a driver query (~1 us each by old cutorch measurements) that only validates the
# pointer is device memory. Other backends (NPU, HIP) keep receiving tensors.
_INT_POINTER_LAUNCHERS = frozenset({"triton.backends.nvidia.driver.CudaLauncher"})


def _launcher_takes_int_pointers(run) -> bool:
    cls = type(run)
    return f"{cls.__module__}.{cls.__qualname__}" in _INT_POINTER_LAUNCHERS


def direct_launch(compiled) -> Callable[..., None]:
    """`launch(grid0, grid1, grid2, *args)` for a CompiledKernel: raw if verified, else closure.

    `launch.pointers_as_ints` (default False) says the caller may pass `tensor.data_ptr()`
    ints for pointer arguments, if IT has checked that every such tensor is on the kernel's
    device (the launcher no longer asks the driver).
    """
    launch = _raw_launch(compiled) or _closure_launch(compiled)
    if not hasattr(launch, "pointers_as_ints"):
        launch.pointers_as_ints = False
    return launch


class DirectLaunches:
    """Launch a jitted kernel; after the first launch for a key, launch its compiled kernel.

    `JITFunction.__getitem__(grid)(...)` re-binds and re-specializes every argument and formats
    its options on each call: several microseconds of Python per launch, as much as the launch.
    The first call per key goes through it (compiling if needed) and keeps the CompiledKernel it
    returns as a `direct_launch`: the same C launcher on the current stream (so graph capture
    still records it). `key` must pin everything the compiled variant depends on: device,
    dtypes and constexpr values (alignment is not specialized, see `_build_launcher`).
    Never take the first launch for a key inside a graph capture: that would compile there.
    """

    def __init__(self, jit_fn):
        self.jit_fn = jit_fn
        self.compiled: dict[Hashable, Callable[..., None]] = {}  # key -> launch(g0, g1, g2, *a)

    def __call__(self, key: Hashable, grid: tuple[int, int, int], *args) -> None:
        launch = self.compiled.get(key)
        if launch is not None:
            launch(*grid, *args)
        else:
            self.first(key, grid, *args)

    def first(self, key: Hashable, grid: tuple[int, int, int], *args) -> None:
        """Launch through Triton's binder (compiling if needed); remember the compiled kernel."""
        kernel = self.jit_fn[grid](*args)
        if callable(getattr(kernel, "__getitem__", None)):  # a CompiledKernel (triton 3.x)
            self.compiled[key] = direct_launch(kernel)


# Built once at import (pure Python: no device, no compile yet).
_REP_PEN_TEMP_DEVICE = DirectLaunches(_build_launcher(_rep_pen_temp_kernel, "cuda"))
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
