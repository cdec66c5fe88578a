"""The fused prelude's launch path: the direct launcher and the steady-state branch, on the CPU.

`stages.talker.prelude_triton` launches its compiled kernel by calling `CompiledKernel.run` (the
C launcher) itself, after checking Triton's calling convention once. These tests pin that
contract without a GPU: a real `CompiledKernel` object built without compiling (its `_run`
records instead of launching), a stand-in Triton driver, and a fake launcher registered for the
CPU "device key" so `rep_pen_temp`'s steady-state branch runs on CPU tensors. The compiled path
itself (bit-exact, graph capture) is covered by the `gpu` tests in the sibling modules.

Run: python -m pytest tests/kernels/test_prelude_launch.py -q
"""

from __future__ import annotations

import types

import pytest
import torch
from prelude_inputs import VOCAB, assert_bitwise_equal, random_inputs

from stages.talker.prelude import HISTORY_WINDOW, penalty_temperature_eager

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION:UserWarning"),
]
STREAM_OF_DEVICE_3 = 0x7E57


@pytest.fixture
def pt():
    pytest.importorskip("triton", reason="the fused prelude needs triton (extra: triton)")
    from stages.talker import prelude_triton

    return prelude_triton


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


def test_direct_launch_calls_the_c_launcher_with_tritons_convention(pt, fake_driver):
    calls = []
    launch = pt.direct_launch(recording_kernel(calls))
    assert launch.pointers_as_ints is False  # only Triton's NVIDIA launcher is known to
    launch(5, 7, 1, "logits", "out", 6562)
    # grid, stream of the CURRENT device, function, packed metadata, no metadata, no hooks, args
    assert calls == [(5, 7, 1, STREAM_OF_DEVICE_3, 0xF00, (4, 1, 0), None, None, None,
                      "logits", "out", 6562)]  # fmt: skip


def test_direct_launch_defers_to_triton_while_a_launch_hook_is_registered(
    pt, fake_driver, launch_hook
):
    calls = []
    pt.direct_launch(recording_kernel(calls))(2, 7, 1, "logits")
    assert len(calls) == 1 and calls[0][:6] == (2, 7, 1, STREAM_OF_DEVICE_3, 0xF00, (4, 1, 0))
    assert calls[0][7] is not None  # Triton's own path handed the hook chain to the launcher
    assert len(launch_hook) == 1 and launch_hook[0].get()["name"] == "recording"


def test_unrecognised_compiled_kernel_launches_through_its_getitem(pt):
    log = []

    class OnlyGetitem:
        def __getitem__(self, grid):
            return lambda *args: log.append((grid, args))

    pt.direct_launch(OnlyGetitem())(3, 7, 1, "a", 1)
    assert log == [((3, 7, 1), ("a", 1))]


def test_direct_launches_reuse_the_compiled_kernel_per_key(pt):
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

    launches = pt.DirectLaunches(FakeJit())
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


def test_only_tritons_nvidia_launcher_gets_int_pointers(pt):
    """Guards the class name the int-pointer shortcut is keyed on against a Triton rename."""
    from triton.backends.nvidia.driver import CudaLauncher

    assert pt._launcher_takes_int_pointers(CudaLauncher.__new__(CudaLauncher))
    assert not pt._launcher_takes_int_pointers(lambda *args: None)


def register_fake_launch(pt, monkeypatch, *, pointers_as_ints: bool) -> list:
    """A fake launcher under the CPU key, so rep_pen_temp's fast branch runs on CPU tensors."""
    launches = []

    def launch(*args):
        launches.append(args)

    launch.pointers_as_ints = pointers_as_ints
    key = (torch.empty(0).get_device(), VOCAB, HISTORY_WINDOW)
    monkeypatch.setitem(pt._REP_PEN_TEMP_DEVICE.compiled, key, launch)
    return launches


@pytest.fixture
def steady_state(pt, monkeypatch):
    return register_fake_launch(pt, monkeypatch, pointers_as_ints=False)


@pytest.mark.parametrize("pointers_as_ints", [False, True])
def test_steady_state_launches_once_with_grid_from_shapes(pt, monkeypatch, pointers_as_ints):
    launches = register_fake_launch(pt, monkeypatch, pointers_as_ints=pointers_as_ints)
    case = random_inputs(3, seed=1)
    out = torch.empty_like(case.logits)
    assert pt.rep_pen_temp(*case.args(), out=out) is out  # no allocation with out=
    blocks = -(-VOCAB // pt.BLOCK_V)
    assert len(launches) == 1
    grid, args = launches[0][:3], launches[0][3:]
    assert grid == (3, blocks, 1)
    tensors = (*case.args(), out)
    if pointers_as_ints:
        assert args[:6] == tuple(t.data_ptr() for t in tensors)
    else:
        assert all(a is b for a, b in zip(args[:6], tensors, strict=True))
    assert args[6:] == (VOCAB, HISTORY_WINDOW, pt.BLOCK_V)


def test_steady_state_rejects_a_wrong_out_buffer_with_a_typed_error(pt, steady_state):
    case = random_inputs(2, seed=2)
    with pytest.raises(ValueError, match=r"^error: out buffer .*empty_like"):
        pt.rep_pen_temp(*case.args(), out=torch.empty(2, VOCAB, dtype=torch.float64))
    assert steady_state == []


@pytest.mark.parametrize("odd", ["int64_history", "strided_logits", "fp16_logits"])
def test_unusual_inputs_leave_the_fast_branch(pt, steady_state, monkeypatch, odd):
    """Other dtypes / layouts take the checked path: still exact, or a typed error."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    case = random_inputs(2, seed=3)
    logits, history = case.logits, case.history
    if odd == "int64_history":
        history = history.long()
    elif odd == "strided_logits":
        logits = torch.cat([logits, logits], dim=1)[:, :VOCAB]
    else:
        with pytest.raises(ValueError, match=r"^error: logits are torch.float16"):
            pt.rep_pen_temp(logits.half(), *case.args()[1:])
        return
    out = pt.rep_pen_temp(logits, history, case.history_len, case.pow_table, case.temperature)
    assert steady_state == []
    assert_bitwise_equal(out, penalty_temperature_eager(*case.args()))


@pytest.mark.gpu
def test_cuda_launches_directly_and_still_fires_registered_hooks(pt):
    """On the installed triton (3.6 on the H200 host) the convention check must pass, and a
    hook registered later (a profiler) must see the steady-state launches."""
    from triton import knobs

    device = torch.device("cuda", torch.cuda.current_device())
    case = random_inputs(4, seed=5).to(device)
    expected = penalty_temperature_eager(*case.args()).cpu()
    assert_bitwise_equal(pt.rep_pen_temp(*case.args()).cpu(), expected)  # may compile
    launch = pt._REP_PEN_TEMP_DEVICE.compiled[(device.index, VOCAB, HISTORY_WINDOW)]
    assert getattr(launch, "compiled", None) is not None, "direct launch not verified here"
    assert_bitwise_equal(pt.rep_pen_temp(*case.args()).cpu(), expected)  # the raw launch
    seen = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        out = pt.rep_pen_temp(*case.args())
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert_bitwise_equal(out.cpu(), expected)
    assert len(seen) == 1
    # A host tensor among device ones: a typed error from the launcher, never a launch with a
    # host pointer (which would poison the CUDA context): later launches still work.
    with pytest.raises(ValueError, match="cpu tensor"):
        pt.rep_pen_temp(case.logits, case.history.cpu(), *case.args()[2:])
    assert_bitwise_equal(pt.rep_pen_temp(*case.args()).cpu(), expected)
