"""The fused prelude's steady-state branches (`rep_pen_temp`, `RepPenTempStep`), on the CPU.

After its first (compiling) launch the fused prelude launches the compiled kernel directly
(`stages.platform.triton_launch`, tested in test_triton_launch.py). Here a fake launcher is
registered for the CPU "device key", so the steady-state branches run on CPU tensors and what
they hand the launcher is asserted; odd inputs must leave them for the checked path. The
compiled path itself (bit-exact, graph capture) is covered by the `gpu` tests here and in the
sibling modules.

Run: python -m pytest tests/kernels/test_prelude_launch.py -q
"""

from __future__ import annotations

import pytest
import torch
from prelude_inputs import VOCAB, assert_bitwise_equal, random_inputs

from stages.talker.prelude import HISTORY_WINDOW, penalty_temperature_eager

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION:UserWarning"),
]


@pytest.fixture
def pt():
    pytest.importorskip("triton", reason="the fused prelude needs triton (extra: triton)")
    from stages.talker import prelude_triton

    return prelude_triton


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
    import triton

    if triton.__version__.startswith("3.6."):  # the layout _probe_launcher_call was read from
        assert launch.calls_c_directly, "triton 3.6's launcher __call__ was not skipped"
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


def slot_state(slots: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Sampler-like slot buffers [S, ...] filled from a seeded case, plus a NaN output buffer."""
    case = random_inputs(slots, seed=seed)
    return (*case.args()[1:], torch.full((slots, VOCAB), float("nan")))


@pytest.mark.parametrize("pointers_as_ints", [False, True])
def test_bound_step_resolves_state_pointers_once_and_passes_only_logits(
    pt, monkeypatch, pointers_as_ints
):
    launches = register_fake_launch(pt, monkeypatch, pointers_as_ints=pointers_as_ints)
    state = slot_state(6, seed=30)
    step = pt.RepPenTempStep(*state)
    logits = random_inputs(3, seed=31).logits
    first = step(logits)  # checked path (rep_pen_temp's own fast branch here); arms the step
    second = step(logits)
    assert first.data_ptr() == second.data_ptr() == state[4].data_ptr()
    assert second.shape == (3, VOCAB) and step(logits) is second  # one view per R, reused
    assert len(launches) == 3
    bound = launches[1]
    assert bound[:3] == (3, -(-VOCAB // pt.BLOCK_V), 1)
    if pointers_as_ints:  # full slot buffers: rows [:R] start at the same address
        assert bound[3:9] == (logits.data_ptr(), *(t.data_ptr() for t in state))
    else:
        assert bound[3] is logits and all(a is b for a, b in zip(bound[4:9], state, strict=True))
    assert bound[9:] == (VOCAB, HISTORY_WINDOW, pt.BLOCK_V)


def test_bound_step_sends_odd_logits_to_the_checked_path(pt, monkeypatch):
    launches = register_fake_launch(pt, monkeypatch, pointers_as_ints=True)
    state = slot_state(4, seed=32)
    step = pt.RepPenTempStep(*state)
    logits = random_inputs(2, seed=33).logits
    step(logits)  # arms
    launches.clear()
    with pytest.raises(ValueError, match=r"^error: logits are torch.float16"):
        step(logits.half())
    with pytest.raises(ValueError, match=r"^error: 5 logit rows for a sampler state of 4 slots"):
        step(torch.zeros(5, VOCAB))
    # Strided logits: copied contiguous by the checked path, then run (CPU: the interpreter).
    strided = torch.cat([logits, logits], dim=1)[:, :VOCAB]
    got = step(strided)
    assert launches == []  # none of the three reached the bound launch
    rows = [t[:2] for t in state[:4]]
    assert_bitwise_equal(got, penalty_temperature_eager(logits, *rows))


def test_bound_step_rejects_slot_buffers_of_different_sizes(pt):
    history, history_len, pow_table, temperature, out = slot_state(4, seed=34)
    with pytest.raises(ValueError, match=r"^error: sampler state shapes .*SamplerState.allocate"):
        pt.RepPenTempStep(history[:3], history_len, pow_table, temperature, out)
