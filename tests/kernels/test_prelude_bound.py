"""The prelude bound to a sampler's slot buffers (`bind_prelude`): same bits, same latch.

`step(logits [R, V])` must equal `fn(logits, history[:R], ..., out=out[:R])` bit for bit for
every R <= S, write only rows [:R] of the output buffer, and keep the fused path's process
latch. CPU cases run the fused kernel under TRITON_INTERPRET=1; the `gpu` case runs it compiled
(the bound launch proper).

Run: python -m pytest tests/kernels/test_prelude_bound.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch
from prelude_inputs import VOCAB, assert_bitwise_equal, random_inputs

from stages.talker import prelude
from stages.talker.config import SamplingConfig
from stages.talker.prelude import (
    bind_prelude,
    penalty_temperature_eager,
    penalty_temperature_fused,
)
from stages.talker.sampling import CodecSampler, SamplerState

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION:UserWarning"),
]
SLOTS = 9


@pytest.fixture(autouse=True)
def _fresh_latch():
    prelude._reset_latch_for_tests()
    yield
    prelude._reset_latch_for_tests()


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request, monkeypatch) -> torch.device:
    pytest.importorskip("triton", reason="the fused prelude needs triton (extra: triton)")
    if request.param == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        pytest.skip("requires a CUDA device")
    return torch.device(request.param)


def slot_buffers(device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    case = random_inputs(SLOTS, seed=seed).to(device)
    return {"history": case.history, "history_len": case.history_len,
            "pow_table": case.pow_table, "temperature": case.temperature,
            "out": torch.full((SLOTS, VOCAB), float("nan"), device=device)}  # fmt: skip


def per_call(fn, logits: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
    r = logits.shape[0]
    rows = [state[k][:r] for k in ("history", "history_len", "pow_table", "temperature")]
    return fn(logits, *rows, out=torch.empty_like(logits))


@pytest.mark.parametrize("fn", [penalty_temperature_eager, penalty_temperature_fused])
def test_bound_step_equals_the_per_call_form_bit_for_bit(device, fn):
    state = slot_buffers(device, seed=40)
    step = bind_prelude(fn, **state)
    for r, seed in ((3, 41), (1, 42), (5, 43), (3, 44), (SLOTS, 45)):
        logits = random_inputs(r, seed=seed).logits.to(device)
        got = step(logits)
        assert got.data_ptr() == state["out"].data_ptr() and got.shape == (r, VOCAB)
        expected = per_call(penalty_temperature_eager, logits, state)
        assert_bitwise_equal(got.cpu(), expected.cpu())
        if r < SLOTS:  # rows past every R so far were never written
            assert state["out"][5:].isnan().all()
    assert prelude._latch_tripped is False
    if fn is penalty_temperature_fused and device.type == "cuda":
        assert step._kernel._launch is not None, "the bound launch was never armed"


def test_bound_fused_step_latches_once_and_fills_the_buffer(monkeypatch, caplog):
    pytest.importorskip("triton", reason="the fused prelude needs triton (extra: triton)")
    from stages.talker import prelude_triton

    calls = []

    def broken(self, logits):
        calls.append(1)
        raise RuntimeError("simulated bound launch failure")

    monkeypatch.setattr(prelude_triton.RepPenTempStep, "__call__", broken)
    caplog.set_level(logging.WARNING, logger=prelude.__name__)
    state = slot_buffers(torch.device("cpu"), seed=46)
    step = bind_prelude(penalty_temperature_fused, **state)
    for seed in (47, 48):
        logits = random_inputs(4, seed=seed).logits
        got = step(logits)
        assert got.data_ptr() == state["out"].data_ptr()
        assert_bitwise_equal(got, per_call(penalty_temperature_eager, logits, state))
    assert len(calls) == 1 and prelude._latch_tripped is True
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    # A step bound after the latch is eager from the start: the kernel is not tried again.
    bind_prelude(penalty_temperature_fused, **state)(random_inputs(2, seed=49).logits)
    assert len(calls) == 1


def test_sampler_rebinds_when_the_prelude_or_the_state_changes():
    seen = []

    def recording(logits, history, history_len, pow_table, temperature, *, out=None):
        seen.append((recording, out.data_ptr()))
        return penalty_temperature_eager(logits, history, history_len, pow_table, temperature,
                                         out=out)  # fmt: skip

    cfg = SamplingConfig()
    sampler = CodecSampler(cfg, eos_id=VOCAB - 1, prelude=recording)
    states = [SamplerState.allocate(4, cfg.history_window, torch.device("cpu"), vocab=VOCAB)
              for _ in range(2)]  # fmt: skip
    logits = random_inputs(2, seed=50).logits
    first = sampler.prelude_step(states[0])
    assert sampler.prelude_step(states[0]) is first  # bound once per state
    sampler.filter(logits, states[1])
    assert seen[-1][1] == states[1].prelude_out.data_ptr()
    sampler.prelude = penalty_temperature_eager
    assert sampler.prelude_step(states[1]) is not first
    sampler.filter(logits, states[1])
    assert len(seen) == 1  # the recording prelude is no longer called
