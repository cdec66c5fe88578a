"""Codec sampling: EOS censoring, top-k/top-p, history window, forced EOS, swappable prelude."""

from __future__ import annotations

import torch

from stages.talker.config import SamplingConfig
from stages.talker.prelude import penalty_pow_table, penalty_temperature_eager
from stages.talker.sampling import (
    CodecSampler,
    SamplerState,
    advance,
    push_history,
    top_k_filter,
    top_p_filter,
)

V, EOS = 6562, 6561


def state_for(rows: int, sampler: CodecSampler, *, limit: int, ignore_eos: bool = False):
    state = SamplerState.allocate(rows, sampler.cfg.history_window, torch.device("cpu"), vocab=V)
    for r in range(rows):
        sampler.admit(state, r, limit=limit, ignore_eos=ignore_eos)
    return state


def run(sampler, state, logits, gens, steps):
    active = torch.ones(logits.shape[0], dtype=torch.bool)
    return [sampler.sample(logits, state, active=active, generators=gens) for _ in range(steps)]


def test_eos_is_masked_until_min_tokens_then_sampled():
    sampler = CodecSampler(SamplingConfig(), eos_id=EOS)
    state = state_for(1, sampler, limit=1000)
    logits = torch.zeros(1, V)
    logits[0, EOS] = 50.0  # EOS would win every draw if allowed
    results = run(sampler, state, logits, [torch.Generator().manual_seed(0)], 51)
    assert [bool(r.finished) for r in results[:50]] == [False] * 50
    assert all(int(r.sample) != EOS for r in results[:50])
    assert int(results[50].sample) == EOS and bool(results[50].finished)
    assert not bool(results[50].emit)


def test_ignore_eos_rows_never_sample_eos_and_stop_exactly_at_the_limit():
    sampler = CodecSampler(SamplingConfig(), eos_id=EOS)
    state = state_for(1, sampler, limit=61, ignore_eos=True)  # budget 60 codes
    logits = torch.zeros(1, V)
    logits[0, EOS] = 50.0
    results = run(sampler, state, logits, [torch.Generator().manual_seed(0)], 61)
    assert sum(bool(r.emit) for r in results) == 60
    assert bool(results[60].finished) and int(results[60].sample) == EOS
    assert int(state.step[0]) == 61


def test_top_k_keeps_at_least_k_and_top_p_keeps_min_tokens_to_keep():
    x = torch.arange(V, dtype=torch.float32)[None]
    kept = torch.isfinite(top_k_filter(x, 25))
    assert kept.sum() == 25 and kept[0, -25:].all()
    peaked = torch.full((1, V), -30.0)
    peaked[0, 7] = 30.0  # all mass on one id: top-p alone would keep 1
    assert torch.isfinite(top_p_filter(peaked, 0.85, 3)).sum() == 3


def test_samples_stay_inside_the_top_k_set():
    sampler = CodecSampler(SamplingConfig(min_tokens=0), eos_id=EOS)
    state = state_for(1, sampler, limit=10_000)
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(3))
    allowed = set(torch.topk(logits[0], 25).indices.tolist())
    gen = torch.Generator().manual_seed(1)
    drawn = {int(r.sample) for r in run(sampler, state, logits, [gen], 40)}
    assert drawn <= allowed


def test_history_window_shifts_left_when_full():
    sampler = CodecSampler(SamplingConfig(), eos_id=EOS)
    state = state_for(2, sampler, limit=100)
    emit = torch.tensor([True, False])
    for code in range(20):
        push_history(state, torch.tensor([code, 999]), emit)
    assert state.history[0].tolist() == list(range(4, 20))
    assert state.history_len.tolist() == [16, 0]
    assert state.history[1].tolist() == [0] * 16  # non-emitting row untouched


def test_inactive_rows_do_not_move():
    sampler = CodecSampler(SamplingConfig(), eos_id=EOS)
    state = state_for(2, sampler, limit=100)
    res = advance(state, torch.tensor([3, 4]), active=torch.tensor([True, False]), eos_id=EOS)
    assert res.emit.tolist() == [True, False] and res.finished.tolist() == [False, False]
    assert state.step.tolist() == [1, 0] and state.history_len.tolist() == [1, 0]


def test_prelude_is_one_swappable_attribute():
    calls = []

    def recording(logits, history, history_len, pow_table, temperature, *, out=None):
        calls.append((logits.shape, history.shape, pow_table.shape))
        return torch.div(logits, temperature[:, None], out=out)

    sampler = CodecSampler(SamplingConfig(), eos_id=EOS, prelude=recording)
    state = state_for(2, sampler, limit=100)
    run(sampler, state, torch.randn(2, V), [torch.Generator(), torch.Generator()], 1)
    assert calls == [((2, V), (2, 16), (2, 17))]


def test_repeated_code_is_penalised_through_the_pow_table():
    sampler = CodecSampler(SamplingConfig(), eos_id=EOS)
    state = state_for(1, sampler, limit=100)
    push_history(state, torch.tensor([5]), torch.tensor([True]))
    push_history(state, torch.tensor([5]), torch.tensor([True]))
    logits = torch.full((1, V), 2.0)
    out = sampler.prelude(logits, state.history, state.history_len, state.pow_table,
                          state.temperature)
    expected = torch.tensor(2.0) / state.pow_table[0, 2] / state.temperature[0]
    assert torch.equal(out[0, 5], expected)  # count 2 -> penalty**2, positive logit divided
    assert out[0, 5] < out[0, 6]


def test_batched_draw_equals_torch_multinomial_row_by_row():
    from stages.talker.sampling import draw_rows

    gen = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(3, V, generator=gen) * 3, dim=-1)
    seeds = [42, 7, 42]
    ours = draw_rows(probs, [torch.Generator().manual_seed(s) for s in seeds])
    ref = torch.stack([
        torch.multinomial(probs[r : r + 1], 1, generator=torch.Generator().manual_seed(s))[0, 0]
        for r, s in enumerate(seeds)
    ])
    assert torch.equal(ours, ref)
    skipped = draw_rows(probs, [None, torch.Generator().manual_seed(7), None])
    assert skipped[1] == ref[1]


def test_eager_prelude_writes_into_out_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, V, generator=gen) * 8
    history = torch.randint(0, V, (4, 16), generator=gen, dtype=torch.int32)
    lens = torch.tensor([0, 5, 16, 16], dtype=torch.int32)
    table = penalty_pow_table(1.05).expand(4, -1).contiguous()
    temperature = torch.full((4,), 0.8)
    buffer = torch.full((6, V), float("nan"))
    got = penalty_temperature_eager(logits, history, lens, table, temperature, out=buffer[:4])
    assert got.data_ptr() == buffer.data_ptr()
    want = penalty_temperature_eager(logits, history, lens, table, temperature)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert buffer[4:].isnan().all()  # rows past R untouched


def test_sampler_hands_the_prelude_rows_of_its_own_buffer():
    sampler = CodecSampler(SamplingConfig(), eos_id=EOS)
    seen = []

    def recording(logits, *args, out=None):
        seen.append(out)
        return penalty_temperature_eager(logits, *args, out=out)

    sampler.prelude = recording
    state = state_for(3, sampler, limit=80)
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    run(sampler, state, logits, [torch.Generator().manual_seed(i) for i in range(2)], 2)
    assert [o.shape for o in seen] == [(2, V), (2, V)]
    assert all(o.data_ptr() == state.prelude_out.data_ptr() for o in seen)
