"""Launching compiled Triton kernels cheaply (`stages.platform.triton_launch`), on the CPU.

After the first launch a kernel is launched by calling Triton's C launcher directly, once the
calling conventions have been checked against the installed triton. These tests pin that
contract without a GPU: a real `CompiledKernel` object built without compiling (its `_run`
records instead of launching), stand-in launchers shaped like triton 3.6's and 3.9's, and a
stand-in Triton driver. The compiled path on a device is covered by the `gpu` test in
test_prelude_launch.py.

Run: python -m pytest tests/kernels/test_triton_launch.py -q
"""

from __future__ import annotations

import types

import pytest

STREAM_OF_DEVICE_3 = 0x7E57


@pytest.fixture
def tl():
    pytest.importorskip("triton", reason="the launch helpers need triton (extra: triton)")
    from stages.platform import triton_launch

    return triton_launch


@pytest.fixture
def fake_driver(monkeypatch):
    """Triton's active driver replaced by one whose current device is 3 (no GPU needed)."""
    from triton.runtime.driver import driver

    fake = types.SimpleNamespace(
        get_current_device=lambda: 3,
        get_current_stream=lambda index: STREAM_OF_DEVICE_3 if index == 3 else None,
    )
    monkeypatch.setattr(driver, "_active", fake)
    return fake


@pytest.fixture
def launch_hook():
    """Registers a launch-enter hook on Triton's knobs for one test; yields what it saw."""
    from triton import knobs

    seen = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    yield seen
    knobs.runtime.launch_enter_hook.remove(hook)


def recording_kernel(calls: list):
    """A real CompiledKernel, never compiled: handles look initialised, `run` records."""
    from triton.compiler.compiler import CompiledKernel

    kernel = CompiledKernel.__new__(CompiledKernel)
    kernel.module, kernel._module_pid = object(), None  # _init_handles: nothing to do
    kernel.function, kernel.packed_metadata = 0xF00, (4, 1, 0)
    kernel.name, kernel.src = "recording", None

    def run(*call):  # like the C launcher: it calls the hooks it is given
        calls.append(call)
        if call[7] is not None:
            call[7](call[6])

    kernel._run = run
    return kernel


def test_direct_launch_calls_the_c_launcher_with_tritons_convention(tl, fake_driver):
    calls = []
    launch = tl.direct_launch(recording_kernel(calls))
    assert launch.pointers_as_ints is False  # only Triton's NVIDIA launcher is known to
    launch(5, 7, 1, "logits", "out", 6562)
    # grid, stream of the CURRENT device, function, packed metadata, no metadata, no hooks, args
    assert calls == [(5, 7, 1, STREAM_OF_DEVICE_3, 0xF00, (4, 1, 0), None, None, None,
                      "logits", "out", 6562)]  # fmt: skip


def test_direct_launch_defers_to_triton_while_a_launch_hook_is_registered(
    tl, fake_driver, launch_hook
):
    calls = []
    tl.direct_launch(recording_kernel(calls))(2, 7, 1, "logits")
    assert len(calls) == 1 and calls[0][:6] == (2, 7, 1, STREAM_OF_DEVICE_3, 0xF00, (4, 1, 0))
    assert calls[0][7] is not None  # Triton's own path handed the hook chain to the launcher
    assert len(launch_hook) == 1 and launch_hook[0].get()["name"] == "recording"


def test_unrecognised_compiled_kernel_launches_through_its_getitem(tl):
    log = []

    class OnlyGetitem:
        def __getitem__(self, grid):
            return lambda *args: log.append((grid, args))

    tl.direct_launch(OnlyGetitem())(3, 7, 1, "a", 1)
    assert log == [((3, 7, 1), ("a", 1))]


def test_direct_launches_reuse_the_compiled_kernel_per_key(tl):
    log = []

    class FakeCompiled:
        def __getitem__(self, grid):
            return lambda *args: log.append(("direct", grid, args))

    class FakeJit:
        def __getitem__(self, grid):
            def run(*args):
                log.append(("jit", grid, args))
                return FakeCompiled()

            return run

    launches = tl.DirectLaunches(FakeJit())
    launches(("k1",), (2, 7, 1), "a", 1)
    launches(("k1",), (3, 7, 1), "b", 2)
    launches(("k2",), (3, 7, 1), "c", 3)
    launches(("k2",), (1, 7, 1), "d", 4)
    assert log == [
        ("jit", (2, 7, 1), ("a", 1)),
        ("direct", (3, 7, 1), ("b", 2)),
        ("jit", (3, 7, 1), ("c", 3)),
        ("direct", (1, 7, 1), ("d", 4)),
    ]


def test_compile_options_reach_the_first_launch_only(tl):
    """num_warps / num_stages are compile options: Triton's binder gets them on a key's first
    launch; the compiled kernel has them built in, so later launches pass arguments alone."""
    import torch

    log = []

    class FakeCompiled:
        def __getitem__(self, grid):
            return lambda *args: log.append(("direct", args))

    class FakeJit:
        def __getitem__(self, grid):
            def run(*args, **options):
                log.append(("jit", args, options))
                return FakeCompiled()

            return run

    launches = tl.DirectLaunches(FakeJit())
    a = torch.zeros(2)
    launches.checked("k", (1, 1, 1), (a,), (5,), num_warps=8, num_stages=3)
    launches.checked("k", (1, 1, 1), (a,), (6,), num_warps=8, num_stages=3)
    assert log[0] == ("jit", (a, 5), {"num_warps": 8, "num_stages": 3})
    assert log[1][0] == "direct" and log[1][1][-1] == 6 and len(log) == 2


@pytest.mark.parametrize("ints", [True, False], ids=["int-pointers", "tensors"])
def test_checked_launches_pass_addresses_only_to_a_compiled_launcher_that_takes_them(tl, ints):
    import torch

    log = []

    def compiled_launch(*args):
        log.append(("direct", args))

    compiled_launch.pointers_as_ints = ints

    class FakeJit:  # Triton's binder; it returns no CompiledKernel, so nothing is kept
        def __getitem__(self, grid):
            return lambda *args: log.append(("jit", grid, args))

    launches = tl.DirectLaunches(FakeJit())
    a, b = torch.zeros(2), torch.ones(3)
    launches.checked("k", (4, 1, 1), (a, b), (7, 8))  # not compiled yet: Triton's binder, tensors
    assert log.pop() == ("jit", (4, 1, 1), (a, b, 7, 8))
    launches.compiled["k"] = compiled_launch
    launches.checked("k", (5, 1, 1), (a, b), (7, 8))
    want = (a.data_ptr(), b.data_ptr()) if ints else (a, b)
    assert log == [("direct", (5, 1, 1, *want, 7, 8))]


def test_only_tritons_nvidia_launcher_gets_int_pointers(tl):
    """Guards the class name the int-pointer shortcut is keyed on against a Triton rename."""
    from triton.backends.nvidia.driver import CudaLauncher

    assert tl._launcher_takes_int_pointers(CudaLauncher.__new__(CudaLauncher))
    assert not tl._launcher_takes_int_pointers(lambda *args: None)




class Launcher36Shape:
    """Shaped like triton 3.6's CudaLauncher: a Python __call__ allocating scratch (None when
    the kernel needs none), then the C function with the launch flags spliced in."""

    def __init__(self, calls: list, *, global_scratch_size: int = 0):
        self.global_scratch_size, self.global_scratch_align = global_scratch_size, 128
        self.profile_scratch_size, self.profile_scratch_align = 0, 1
        self.num_ctas, self.launch_cooperative_grid, self.launch_pdl = 1, False, True
        self.python_calls = 0
        self.launch = lambda *call: calls.append(call)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        if isinstance(self, Launcher36Shape):  # not the probe's stand-in
            self.python_calls += 1

        def allocate_scratch(size):
            return f"scratch[{gridX * gridY * gridZ * size}]" if size > 0 else None

        global_scratch = allocate_scratch(self.global_scratch_size)
        profile_scratch = allocate_scratch(self.profile_scratch_size)
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, global_scratch, profile_scratch, *args)  # fmt: skip


class Launcher39Shape(Launcher36Shape):
    """Shaped like triton 3.9's: metadata and hooks before the scratch, args as one tuple."""

    def __call__(self, gridX, gridY, gridZ, stream, function, metadata, launch_metadata,
                 enter_hook, exit_hook, *args):  # fmt: skip
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, metadata, launch_metadata, enter_hook, exit_hook, None, None,
                    "annotations", "signature", args)  # fmt: skip


def kernel_with_launcher(launcher):
    kernel = recording_kernel([])
    kernel._run = launcher
    return kernel


def test_launcher_python_call_is_skipped_when_it_only_forwards(tl, fake_driver):
    c_calls = []
    launcher = Launcher36Shape(c_calls)
    launch = tl.direct_launch(kernel_with_launcher(launcher))
    assert launch.calls_c_directly is True
    launch(5, 7, 1, "logits", "out", 6562)
    # Exactly what the launcher's __call__ would have handed its C function, without calling it.
    assert c_calls == [(5, 7, 1, STREAM_OF_DEVICE_3, 0xF00, False, True, None, None,
                        (4, 1, 0), None, None, None, "logits", "out", 6562)]  # fmt: skip
    assert launcher.python_calls == 0


def test_launcher_that_allocates_scratch_keeps_its_python_call(tl, fake_driver):
    c_calls = []
    launcher = Launcher36Shape(c_calls, global_scratch_size=64)
    launch = tl.direct_launch(kernel_with_launcher(launcher))
    assert launch.calls_c_directly is False
    launch(2, 7, 1, "logits")
    assert launcher.python_calls == 1
    assert c_calls[0][7] == "scratch[896]"  # the launcher's own allocation reached the C call


def test_launcher_with_another_calling_layout_keeps_its_python_call(tl, fake_driver):
    c_calls = []
    launch = tl.direct_launch(kernel_with_launcher(Launcher39Shape(c_calls)))
    assert launch.calls_c_directly is False
    launch(2, 7, 1, "logits")
    assert c_calls == [(2, 7, 1, STREAM_OF_DEVICE_3, 0xF00, False, True, (4, 1, 0), None, None,
                        None, None, None, "annotations", "signature", ("logits",))]  # fmt: skip


def test_launcher_whose_probe_raises_keeps_its_python_call(tl, fake_driver):
    c_calls = []
    launcher = Launcher36Shape(c_calls)
    del launcher.launch_pdl  # the probe's stand-in has it; reading the real one then raises
    launch = tl.direct_launch(kernel_with_launcher(launcher))
    assert launch.calls_c_directly is False


def _specialisation(launcher) -> dict[str, bool]:
    """{argument: does Triton specialise a compiled variant on it?} of a JITFunction, for the
    arguments that are not constexpr: a pointer on its alignment (16 bytes), a scalar on its
    value (equal to 1, divisible by 16)."""
    return {p.name: not (p.do_not_specialize_on_alignment if p.name.endswith("_ptr") else p.do_not_specialize)
            for p in launcher.params if not p.is_constexpr}


@pytest.mark.parametrize("interpreted", [False, True], ids=["jit", "decorated-under-TRITON_INTERPRET"])
def test_a_device_launcher_specialises_on_no_runtime_argument(tl, monkeypatch, interpreted):
    """DirectLaunches reuses one compiled variant per key, so a variant must not depend on a
    scalar's value (Triton compiles ints equal to 1 as constants) nor on a pointer's alignment.
    That must hold also for a kernel module first imported under TRITON_INTERPRET (a test's
    interpreter run before a CUDA one): its kernels are InterpretedFunctions, which keep no
    `do_not_specialize`, and a DiT variant compiled then read a stride of 50 as 1 on an H200."""
    import triton

    from stages.code2wav import dit_triton
    from stages.talker import prelude_triton

    kernels = [dit_triton._residual_norm_modulate_kernel, dit_triton._qk_norm_to_cache_kernel,
               prelude_triton._rep_pen_temp_kernel]
    if interpreted:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        kernels = [triton.jit(k.fn) for k in kernels]  # what a first import under the interpreter holds
        from triton.runtime.interpreter import InterpretedFunction

        assert all(isinstance(k, InterpretedFunction) for k in kernels)
    for kernel in kernels:
        flags = _specialisation(tl.build_launcher(kernel, "cuda"))
        assert flags, kernel
        specialised = [name for name, on in flags.items() if on]
        assert not specialised, f"{kernel.fn.__name__}: specialised {specialised}"
    # The residual kernel's shape arguments are among what was checked (the stride that broke).
    names = _specialisation(tl.build_launcher(kernels[0], "cuda"))
    assert {"frames", "y_sc", "gate_sb", "x_ptr", "y_ptr"} <= set(names)


def test_an_aligned_launcher_specialises_on_pointer_alignment_only(tl):
    """The DiT GEMM's launcher (`aligned=True`): its pointers are specialised on alignment (the
    16-byte loads a GEMM needs; its caller copies unaligned inputs first), its row count still
    never on its value; `kernel_for` keeps the two kinds of launcher apart."""
    import torch

    from stages.code2wav import dit_gemm

    flags = _specialisation(tl.build_launcher(dit_gemm._linear_kernel, "cuda", aligned=True))
    assert flags == {"x_ptr": True, "w_ptr": True, "b_ptr": True, "out_ptr": True, "rows": False}
    plain = _specialisation(tl.build_launcher(dit_gemm._linear_kernel, "cuda"))
    assert not any(plain.values())
    cuda = torch.device("cuda")
    assert tl.kernel_for(dit_gemm._linear_kernel, cuda, aligned=True) is not tl.kernel_for(dit_gemm._linear_kernel, cuda)


def test_runtime_arguments_split_pointers_scalars_and_skip_constexprs(tl):
    import triton.language as tl_lang

    def kernel(x_ptr, out_ptr, rows, stride: int, BLOCK: tl_lang.constexpr, EPS: "tl.constexpr"):
        pass

    assert tl.runtime_arguments(kernel) == (["x_ptr", "out_ptr"], ["rows", "stride"])


def test_threads_reaching_a_kernel_first_together_share_one_launcher(tl, monkeypatch):
    """Replica threads warm up side by side: every one must get the same DirectLaunches (the one
    a warmup compiles into), however their first calls interleave. Building is slowed down so
    that, without the caches' lock, every thread would build its own."""
    import threading
    import time

    import torch

    real_build = tl.build_launcher

    def slow_build(*args, **kwargs):
        time.sleep(0.05)  # widens the window between a cache miss and the store
        return real_build(*args, **kwargs)

    monkeypatch.setattr(tl, "build_launcher", slow_build)

    def kernel(x_ptr, n):  # a stand-in: only its identity and signature are used
        pass

    stand_in = types.SimpleNamespace(fn=kernel)
    monkeypatch.setattr(tl, "_launchers", {})
    monkeypatch.setattr(tl, "_direct", {})
    start, got = threading.Barrier(6), []

    def first_call():
        start.wait()
        got.append(tl.launches_for(stand_in, torch.device("meta")))

    threads = [threading.Thread(target=first_call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 6 and len({id(launches) for launches in got}) == 1
