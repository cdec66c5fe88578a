"""Launching a compiled Triton kernel for the price of the launch, not of Triton's Python.

`JITFunction[grid](*args)` re-binds and re-specializes every argument and formats its options on
each call; `CompiledKernel[grid](*args)` still builds a closure and launch metadata per call; the
launcher object behind it (`CompiledKernel.run`, triton's `CudaLauncher`) is itself Python that
allocates scratch before calling the C function. For a kernel that exists to cost one launch
(the sampling prelude, `stages.talker.prelude_triton`) each of those layers is a visible share
of the step (scripts/bench_prelude.py measures them: `empty`, `empty_direct`, `empty_raw`).

What a newcomer needs to know:
* `DirectLaunches(jit_fn)`: the first launch per key goes through Triton (compiling if needed);
  later ones call `direct_launch(compiled)`: the C launcher itself, on the current stream, so a
  graph capture still records it.
* Every shortcut is taken only after checking, once per compiled kernel and against the
  INSTALLED triton, that it does exactly what Triton's own path does: `CompiledKernel.__getitem__`
  is run on a stand-in and its call to `run` compared (`_probe_getitem_convention`); the
  launcher's `__call__` likewise (`_probe_launcher_call`). Anything unexpected, or any launch hook
  registered (a profiler), means Triton's own path, with the same results.
* Triton internals relied on (read in the 3.6 and 3.9 sources) are named at each function.
* `kernel_for(kernel, device)`: the interpreted twin on CPU (TRITON_INTERPRET tests), a compiled
  variant specialised on neither pointer alignment nor scalar values elsewhere;
  `launches_for(kernel, device)`: its one cached `DirectLaunches`.

    >>> launches = DirectLaunches(kernel_for(my_kernel, torch.device("cuda")))  # doctest: +SKIP
    >>> launches((device_index, vocab), (rows, blocks, 1), x_ptr, out_ptr, VOCAB)  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import logging
import threading
import types
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from stages.platform.device import unwrapped_current_device

log = logging.getLogger(__name__)

# (id(kernel), device type, aligned) -> launchable: interpreted twin for "cpu", compiled otherwise.
_launchers: dict[tuple[int, str, bool], object] = {}
# The same key -> its DirectLaunches (`launches_for`).
_direct: dict[tuple[int, str, bool], DirectLaunches] = {}
# Guards filling both caches. Why: replica threads (runner.execution threads, replica hosts)
# reach a kernel's first call side by side, and two threads each building a DirectLaunches
# would leave one thread with an object that was warmed up and the others with one that was
# not, whose first launch for a key may then fall inside a graph capture.
_fill = threading.Lock()


def build_launcher(kernel, device_type: str, *, aligned: bool = False):
    """A fresh launchable for `kernel` on `device_type` (uncached; `kernel_for` caches it).
    `aligned`: specialise on pointer alignment after all (a GEMM's vectorised loads need it);
    the caller then guarantees 16-byte aligned pointers on every launch of a key, since the
    first launch's alignment is compiled in."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if device_type == "cpu":
        return kernel if isinstance(kernel, InterpretedFunction) else InterpretedFunction(kernel.fn)
    pointers, scalars = runtime_arguments(kernel.fn)
    # No specialization on pointer alignment nor on the values of scalar arguments (Triton
    # otherwise compiles a variant for ints equal to 1 or divisible by 16): then a compiled
    # variant depends only on dtypes and constexprs, which is what lets `DirectLaunches` reuse
    # it for every call with the same key without re-running Triton's binder (scalar instead
    # of 16-byte loads costs nothing measurable: launch-bound kernels). Derived from the
    # signature, not from the decorated kernel's own `do_not_specialize`: a module first
    # imported under TRITON_INTERPRET holds an InterpretedFunction, which has no such list,
    # and a compiled variant specialised on the first call's strides then read other strides
    # wrongly (a stride of 1 became a constant; seen on an H200, and what
    # test_a_device_launcher_specialises_on_no_runtime_argument fails on).
    return JITFunction(kernel.fn, do_not_specialize=scalars, do_not_specialize_on_alignment=[] if aligned else pointers)


def runtime_arguments(fn) -> tuple[list[str], list[str]]:
    """(pointer names, scalar names) of a kernel function: its arguments that are not
    `tl.constexpr`, split by the house convention that pointers end in `_ptr`. Annotations may be
    strings (`from __future__ import annotations`), so "constexpr" is looked for in their text,
    as Triton itself does."""
    pointers, scalars = [], []
    for name, param in inspect.signature(fn).parameters.items():
        if "constexpr" in str(param.annotation):
            continue
        (pointers if name.endswith("_ptr") else scalars).append(name)
    return pointers, scalars


def kernel_for(kernel, device: torch.device, *, aligned: bool = False):
    """`kernel` as it must run on `device`: interpreted on CPU, compiled elsewhere (cached).
    `aligned`: see `build_launcher`."""
    key = (id(kernel), device.type, aligned)
    launcher = _launchers.get(key)
    if launcher is None:
        with _fill:
            launcher = _launchers.get(key)  # another thread may have built it meanwhile
            if launcher is None:
                launcher = _launchers[key] = build_launcher(kernel, device.type, aligned=aligned)
    return launcher


def launches_for(kernel, device: torch.device, *, aligned: bool = False) -> DirectLaunches:
    """The one `DirectLaunches` of `kernel` on `device`'s type (cached, so a key compiled at a
    warmup is launched directly afterwards by every caller). `aligned`: see `build_launcher`."""
    key = (id(kernel), device.type, aligned)
    launches = _direct.get(key)
    if launches is None:
        launcher = kernel_for(kernel, device, aligned=aligned)  # takes the lock itself
        with _fill:
            launches = _direct.get(key)
            if launches is None:
                launches = _direct[key] = DirectLaunches(launcher)
    return launches


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
    return _same_call(record, expected)


def _same_call(record: list[tuple], expected: tuple) -> bool:
    """One recorded call whose arguments are, one by one, the very objects expected."""
    return len(record) == 1 and len(record[0]) == len(expected) and all(
        a is b for a, b in zip(record[0], expected, strict=True)
    )


def _probe_launcher_call(run) -> bool:
    """True if, for this launcher, `run(g0, g1, g2, stream, function, *rest)` is exactly
    `run.launch(g0, g1, g2, stream, function, coop, pdl, None, None, *rest)`.

    That is triton 3.6's `CudaLauncher.__call__` when the kernel needs no global or profile
    scratch (its `allocate_scratch` returns None for size 0): a Python frame, a closure and two
    calls per launch around the C function. Checked by running the INSTALLED `__call__` on a
    stand-in that records what reaches `launch`; 3.9's launcher hands `launch` a different
    layout (annotations, signature, args as a tuple), fails this check and keeps `run`.
    """
    sizes = (getattr(run, "global_scratch_size", None), getattr(run, "profile_scratch_size", None))
    if sizes != (0, 0) or not callable(getattr(run, "launch", None)):
        return False
    record: list[tuple] = []
    coop, pdl = object(), object()
    stand_in = types.SimpleNamespace(
        num_ctas=1, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
        profile_scratch_align=1, launch_cooperative_grid=coop, launch_pdl=pdl,
        gsan_enabled=False, launch=lambda *call: record.append(call),
    )  # fmt: skip
    head, rest = (object(), object()), tuple(object() for _ in range(5))
    type(run).__call__(stand_in, 2, 3, 1, *head, *rest)
    return _same_call(record, (2, 3, 1, *head, coop, pdl, None, None, *rest))


def _current_device_fn(driver_active) -> Callable[[], int]:
    """Triton's "current device" query, minus torch's lazy-init wrapper when it is torch's
    (`stages.platform.unwrapped_current_device`): by the time a raw launch exists CUDA is
    initialised (the first launch went through Triton)."""
    return unwrapped_current_device(driver_active.get_current_device)


def _c_function(run) -> tuple | None:
    """(run.launch, coop, pdl) when calling the C function directly is what `run` does, else
    None: see `_probe_launcher_call`."""
    try:
        if _probe_launcher_call(run):
            return run.launch, run.launch_cooperative_grid, run.launch_pdl
    except Exception as exc:  # a launcher we do not know: keep calling it as Triton does
        log.debug("triton launch: launcher call kept (%s: %s)", type(exc).__name__, exc)
    return None


def _raw_launch(compiled) -> Callable[..., None] | None:
    """A launch that calls the C launcher directly, or None if unsafe here.

    What `CompiledKernel[grid](*args)` costs per call and this skips: a fresh closure, a Python
    `launch_metadata` that builds a LazyDict whenever a hook object exists (the default
    `knobs.runtime.launch_*_hook` is an EMPTY `HookChain`, never None, in triton 3.6 and 3.9),
    the C launcher calling both empty chains back into Python, and (3.6, no scratch) the
    launcher's own Python `__call__`. With no hook registered we pass None for launch_metadata
    and both hooks, which the C launcher treats as "no hook"; with any hook registered (e.g. a
    profiler) each call takes the closure path instead, so hooks always fire. Constexpr args are
    still passed: 3.6's launcher parses one "O" per constexpr.
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
        log.debug("triton launch: direct launch unavailable (%s: %s)", type(exc).__name__, exc)
        return None
    closure = _closure_launch(compiled)
    c_function = _c_function(run)
    c_launch, coop, pdl = c_function or (None, None, None)

    def launch(grid0: int, grid1: int, grid2: int, *args) -> None:
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        if (enter is None or (type(enter) is chain and not enter.calls)) and (
            leave is None or (type(leave) is chain and not leave.calls)
        ):
            stream = current_stream(current_device())
            if c_launch is not None:  # what `run` would do, minus its Python frame
                c_launch(grid0, grid1, grid2, stream, function, coop, pdl, None, None, packed,
                         None, None, None, *args)  # fmt: skip
            else:
                run(grid0, grid1, grid2, stream, function, packed, None, None, None, *args)
        else:
            closure(grid0, grid1, grid2, *args)

    launch.compiled = compiled  # the reference that keeps `function` loaded (see above)
    launch.pointers_as_ints = _launcher_takes_int_pointers(run)
    launch.calls_c_directly = c_launch is not None
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
    device (the launcher no longer asks the driver). `launch.calls_c_directly` says the
    launcher's Python `__call__` is skipped too (see `_probe_launcher_call`).
    """
    launch = _raw_launch(compiled) or _closure_launch(compiled)
    if not hasattr(launch, "pointers_as_ints"):
        launch.pointers_as_ints = False
        launch.calls_c_directly = False
    return launch


class DirectLaunches:
    """Launch a jitted kernel; after the first launch for a key, launch its compiled kernel.

    The first call per key goes through `jit_fn[grid](*args)` (compiling if needed) and keeps
    the CompiledKernel it returns as a `direct_launch`. `key` must pin everything the compiled
    variant depends on: device, dtypes and constexpr values (neither alignment nor scalar
    values are specialized, see `build_launcher`). Never take the first launch for a key inside
    a graph capture: that would compile there.
    """

    def __init__(self, jit_fn):
        self.jit_fn = jit_fn
        self.compiled: dict[Hashable, Callable[..., None]] = {}  # key -> launch(g0, g1, g2, *a)

    def __call__(self, key: Hashable, grid: tuple[int, int, int], *args, **options) -> None:
        launch = self.compiled.get(key)
        if launch is not None:
            launch(*grid, *args)
        else:
            self.first(key, grid, *args, **options)

    def checked(
        self, key: Hashable, grid: tuple[int, int, int], tensors: Sequence[Any], tail: Sequence[Any], **options
    ) -> None:
        """Launch with `tensors` as the leading (pointer) arguments and `tail` after them, where
        the caller has checked that every tensor is on the kernel's device: once compiled, a
        launcher that takes int pointers gets `data_ptr()` ints (no driver query per pointer,
        see `direct_launch`), any other gets the tensors. `options` (num_warps, num_stages) are
        compile options: they only reach the first launch, so the key must pin them too."""
        launch = self.compiled.get(key)
        if launch is not None and launch.pointers_as_ints:
            launch(*grid, *(t.data_ptr() for t in tensors), *tail)
        else:
            self(key, grid, *tensors, *tail, **options)

    def first(self, key: Hashable, grid: tuple[int, int, int], *args, **options) -> None:
        """Launch through Triton's binder (compiling if needed); remember the compiled kernel."""
        kernel = self.jit_fn[grid](*args, **options)
        if callable(getattr(kernel, "__getitem__", None)):  # a CompiledKernel (triton 3.x)
            self.compiled[key] = direct_launch(kernel)
