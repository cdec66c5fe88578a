"""Fused sampling prelude (Triton) vs the eager reference: bit for bit, and under graph capture.

Each test runs on `cpu` (the Triton interpreter; CI) and on `cuda` (compiled; marked `gpu`,
skipped without a CUDA device). CPU tensors always go through the interpreter twin of the kernel
(see stages/talker/prelude_triton.py), whatever TRITON_INTERPRET said when triton was imported,
so one process can run both; the `device` fixture still sets TRITON_INTERPRET=1 for CPU cases
because the dispatcher offers the fused path on CPU only under it.

The bit-exactness tests call the kernel wrapper `rep_pen_temp` directly, not through the latch:
a latched fallback would compare eager with eager and could not fail.

Run: python -m pytest tests/kernels -q   (GPU host: the same command runs the cuda cases too)
"""

from __future__ import annotations

import re

import pytest
import torch
from prelude_inputs import (
    EOS_ID,
    VOCAB,
    PreludeInputs,
    assert_bitwise_equal,
    make_inputs,
    random_inputs,
)

from stages.talker import prelude
from stages.talker.prelude import HISTORY_WINDOW, penalty_temperature_eager

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# The inputs hold +-3e38 on purpose; the interpreter (numpy) reports the IEEE overflow to inf
# that both paths produce. Triton 3.9 also nags about its fp-fusion default (no fusable ops here).
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION:UserWarning"),
]


@pytest.fixture
def device(request, monkeypatch) -> torch.device:
    """The device under test, built here (never at import); CPU cases run interpreted."""
    pytest.importorskip("triton", reason="the fused prelude needs triton (extra: triton)")
    if request.param == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _fresh_latch():
    prelude._reset_latch_for_tests()
    yield
    prelude._reset_latch_for_tests()


def fused_kernel():
    from stages.talker import prelude_triton

    return prelude_triton.rep_pen_temp


def check_case(case: PreludeInputs, device: torch.device) -> torch.Tensor:
    """Fused == eager bit for bit on `device`; returns the result for extra assertions."""
    inputs = case.to(device)
    expected = penalty_temperature_eager(*inputs.args())
    actual = fused_kernel()(*inputs.args())
    assert_bitwise_equal(actual.cpu(), expected.cpu())
    return actual.cpu()


def seeded_logits(batch: int, seed: int, scale: float = 6.0) -> torch.Tensor:
    return torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_history_shorter_than_window_ignores_stale_slots(device):
    logits = seeded_logits(2, 1)
    case = make_inputs(
        logits=logits,
        history=[[3, 9, 27, 81, 243], [5, 5, 5]],
        history_len=[3, 0],  # row 0: 243 and 81 are stale; row 1: nothing is valid
        penalty=[1.3, 1.3],
        temperature=[1.0, 1.0],
    )
    out = check_case(case, device)
    # Non-vacuous: valid ids are penalized, stale ones are not.
    assert not torch.equal(out[0, [3, 9, 27]], logits[0, [3, 9, 27]])
    assert torch.equal(out[0, [81, 243]], logits[0, [81, 243]])
    assert torch.equal(out[1], logits[1])


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_repeated_ids_use_integer_counts(device):
    logits = seeded_logits(2, 2).abs() + 1.0  # positive: divided by alpha
    case = make_inputs(
        logits=logits,
        history=[[7] * HISTORY_WINDOW, [11, 12, 11, 13, 11, 12, 0, EOS_ID]],
        history_len=[HISTORY_WINDOW, 8],
        penalty=[1.05, 1.05],
        temperature=[1.0, 1.0],
    )
    out = check_case(case, device)
    table = case.pow_table[0]
    assert out[0, 7] == logits[0, 7] / table[HISTORY_WINDOW]  # count 16
    assert out[1, 11] == logits[1, 11] / table[3]  # count 3


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_negative_logits_are_multiplied(device):
    logits = -(seeded_logits(3, 3).abs() + 0.5)
    case = make_inputs(
        logits=logits,
        history=[[1, 2, 2, 3, 3, 3], [4] * 10, list(range(16))],
        history_len=[6, 10, 16],
        penalty=[1.05, 1.3, 0.8],
        temperature=[0.8, 0.8, 0.8],
    )
    out = check_case(case, device)
    assert out[1, 4] < logits[1, 4] / 0.8  # penalty > 1 makes a negative logit more negative


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_neg_inf_entries_stay_neg_inf(device):
    logits = seeded_logits(2, 4)
    censored = [EOS_ID, 0, 5, 6000]
    logits[:, censored] = float("-inf")
    case = make_inputs(
        logits=logits,
        history=[[5, 5, EOS_ID, 17], [0, 6000]],  # penalized AND censored
        history_len=[4, 2],
        penalty=[1.05, 2.0],
        temperature=[0.8, 0.35],
    )
    out = check_case(case, device)
    assert torch.isneginf(out[:, censored]).all()


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_penalty_and_temperature_both_not_one(device):
    logits = seeded_logits(4, 5, scale=12.0)
    case = make_inputs(
        logits=logits,
        history=[[1, 1, 2], [3, 4, 4, 4], [5], [6, 7, 8, 9, 10, 6]],
        history_len=[3, 4, 1, 6],
        penalty=[1.05, 1.3, 0.7, 2.5],
        temperature=[0.8, 1.7, 0.35, 0.05],
    )
    check_case(case, device)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("batch", [1, 3, 8, 33])
@pytest.mark.parametrize("seed", [0, 1])
def test_randomized_sweep_is_bit_exact(device, batch, seed):
    case = random_inputs(batch, seed=1000 * batch + seed)
    check_case(case, device)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_out_buffer_and_strided_logits_are_honoured(device):
    case = random_inputs(5, seed=7).to(device)
    wide = torch.full((5, VOCAB + 64), float("nan"), device=device)
    logits = wide[:, 32 : 32 + VOCAB]  # row stride != V: the wrapper copies it contiguous
    logits.copy_(case.logits)
    out = torch.empty(5, VOCAB, device=device)
    args = (logits, case.history, case.history_len, case.pow_table, case.temperature)
    returned = fused_kernel()(*args, out=out)
    assert returned is out
    assert_bitwise_equal(out.cpu(), penalty_temperature_eager(*case.args()).cpu())


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_empty_batch_returns_empty_result(device):
    case = random_inputs(3, seed=12).to(device)
    empty = PreludeInputs(*(t[:0] for t in case.args()))
    out = fused_kernel()(*empty.args())
    assert out.shape == (0, VOCAB)
    assert_bitwise_equal(out.cpu(), penalty_temperature_eager(*empty.args()).cpu())


@pytest.mark.gpu
def test_cached_compiled_kernel_handles_unaligned_and_new_shapes():
    """After the first launch the compiled kernel is reused directly (no Triton binder): it must
    not assume 16-byte-aligned pointers, and a new batch size must still cover every row."""
    pytest.importorskip("triton")
    from stages.talker import prelude_triton as pt

    device = torch.device("cuda")
    for batch, offset in ((4, 0), (4, 1), (9, 3), (1, 0)):
        case = random_inputs(batch, seed=100 + batch + offset).to(device)
        flat = torch.empty(batch * VOCAB + offset, device=device)
        logits = flat[offset:].view(batch, VOCAB)  # contiguous, 4-byte aligned if offset odd
        logits.copy_(case.logits)
        out = fused_kernel()(logits, *case.args()[1:])
        assert_bitwise_equal(out.cpu(), penalty_temperature_eager(*case.args()).cpu())
    assert len(pt._REP_PEN_TEMP_DEVICE.compiled) >= 1  # the direct path was taken


def test_compiled_kernel_uses_ieee_division_and_no_transcendentals():
    """Landmine guard, no GPU needed: compile for sm_90 and read the PTX. `/` would give the
    approximate div.full.f32, exp2/log2 the approximate ex2/lg2, `.ftz` would flush subnormals."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from stages.talker import prelude_triton as pt
    from stages.platform.triton_launch import build_launcher

    signature = {
        "logits_ptr": "*fp32",
        "history_ptr": "*i32",
        "history_len_ptr": "*i32",
        "pow_table_ptr": "*fp32",
        "temperature_ptr": "*fp32",
        "out_ptr": "*fp32",
        **dict.fromkeys(["VOCAB", "WINDOW", "BLOCK"], "constexpr"),
    }
    source = ASTSource(
        fn=build_launcher(pt._rep_pen_temp_kernel, "cuda"),
        signature=signature,
        constexprs={"VOCAB": VOCAB, "WINDOW": HISTORY_WINDOW, "BLOCK": pt.BLOCK_V},
    )
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    except Exception as exc:  # a triton build without the NVIDIA backend / ptxas
        pytest.skip(f"cannot compile for sm_90 here: {type(exc).__name__}: {exc}")
    ptx = compiled.asm["ptx"]
    assert "div.rn.f32" in ptx
    for banned in ("div.full", "div.approx", ".ftz", "ex2.", "lg2."):
        assert banned not in ptx, banned
    # No contraction of the multiply into an fp32 fma (integer mad for addresses is fine).
    assert re.search(r"\b(fma|mad)\.[a-z.]*f32", ptx) is None


def test_kernel_is_one_launch_over_rows_and_vocab_blocks(monkeypatch):
    """The grid covers every (row, block) once: rows x ceil(V / BLOCK) programs, one launch."""
    pytest.importorskip("triton")
    from stages.talker import prelude_triton as pt

    launches = []
    real = pt.kernel_for

    def spy(kernel, device):
        launcher = real(kernel, device)

        class Recorder:
            def __getitem__(self, grid):
                launches.append(grid)
                return launcher[grid]

        return Recorder()

    case = random_inputs(3, seed=11)
    monkeypatch.setattr(pt, "kernel_for", spy)
    out = pt.rep_pen_temp(*case.args())
    assert launches == [(3, -(-VOCAB // pt.BLOCK_V), 1)]
    assert_bitwise_equal(out, penalty_temperature_eager(*case.args()))
