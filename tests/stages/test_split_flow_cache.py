"""flow_cache: batched split == per-row split byte for byte; CFG order; trim ranges; lifetimes."""

from __future__ import annotations

import pytest
import torch

from stages.code2wav.flow_cache import (
    AttKeep,
    FlowCache,
    cfg_interleaved_order,
    copy_att_rows,
    split_flow_cache,
    stack_flow_cache,
    trim_conformer_att,
)
from tests.stages.code2wav_tiny import single_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

N_T, DEPTH, C, H, D = 3, 2, 8, 2, 4


def _request(seed: int, conf_len: int = 6, est_len: int = 5) -> FlowCache:
    g = torch.Generator().manual_seed(seed)
    return FlowCache(
        conformer_cnn=torch.randn(1, C, 6, generator=g),
        conformer_att=torch.randn(4, 1, H, conf_len, 2 * D, generator=g),
        estimator_cnn=torch.randn(N_T, DEPTH, 2, 2 * C, 2, generator=g),
        estimator_att=torch.randn(N_T, DEPTH, 2, H, est_len, 2 * D, generator=g),
    )


def _same(a: FlowCache, b: FlowCache) -> bool:
    return all(
        torch.equal(getattr(a, f), getattr(b, f))
        for f in ("conformer_cnn", "conformer_att", "estimator_cnn", "estimator_att")
    )


def test_cfg_order_matches_per_row_selection():
    for rows in range(1, 9):
        order = cfg_interleaved_order(rows, torch.device("cpu"))
        expected = [i for r in range(rows) for i in (r, rows + r)]
        assert order.tolist() == expected
        x = torch.randn(rows * 2, 3)
        per_row = torch.cat([torch.cat([x[r : r + 1], x[rows + r : rows + r + 1]]) for r in range(rows)])
        assert torch.equal(x.index_select(0, order), per_row)


def test_order_tensor_is_cached_per_rows_and_device():
    a = cfg_interleaved_order(4, torch.device("cpu"))
    assert cfg_interleaved_order(4, torch.device("cpu")) is a
    assert cfg_interleaved_order(5, torch.device("cpu")) is not a


@pytest.mark.parametrize("rows", range(1, 9))
def test_batched_split_is_byte_identical_to_per_row(rows):
    states = [_request(100 * rows + r) for r in range(rows)]
    batch = stack_flow_cache(states)
    keep = AttKeep(prompt_len=2, keep_frames=2)
    per_row = split_flow_cache(batch, rows, batched=False, att_keep=keep)
    batched = split_flow_cache(batch, rows, batched=True, att_keep=keep)
    for a, b in zip(per_row, batched):
        assert _same(a, b)
    # and both round-trip the stacked requests (untrimmed split)
    for state, row in zip(states, split_flow_cache(batch, rows, batched=True)):
        assert _same(state, row)


def test_batched_rows_are_views_into_one_fresh_buffer():
    states = [_request(r) for r in range(3)]
    batch = stack_flow_cache(states)
    rows = split_flow_cache(batch, 3, batched=True)
    base = rows[0].estimator_cnn.untyped_storage().data_ptr()
    assert all(r.estimator_cnn.untyped_storage().data_ptr() == base for r in rows)
    assert base != batch.estimator_cnn.untyped_storage().data_ptr()  # never aliases the input
    per_row = split_flow_cache(batch, 3, batched=False)
    ptrs = {r.estimator_cnn.untyped_storage().data_ptr() for r in per_row}
    assert len(ptrs) == 3


def test_non_identity_conformer_order_uses_index_select():
    states = [_request(r) for r in range(3)]
    batch = stack_flow_cache(states)
    order = torch.tensor([2, 0, 1])
    rows = split_flow_cache(batch, 3, batched=True, conformer_order=order)
    assert torch.equal(rows[0].conformer_cnn, states[2].conformer_cnn)
    assert torch.equal(rows[1].conformer_att, states[0].conformer_att)


def test_keep_ranges_and_trimmed_copy():
    keep = AttKeep(prompt_len=4, keep_frames=2)
    assert keep.ranges(6) == [(0, 6)]
    assert keep.ranges(9) == [(0, 4), (7, 2)]
    att = torch.arange(2 * 9, dtype=torch.float32).view(1, 1, 2, 1, 9, 1)
    (row,) = copy_att_rows(att, 1, keep)
    assert row[0, 0, 0, 0, :, 0].tolist() == [0, 1, 2, 3, 7, 8]
    assert row[0, 0, 1, 0, :, 0].tolist() == [9, 10, 11, 12, 16, 17]


def test_conformer_trim_keeps_token_layers_tiled():
    tokens, n_tok = 7, 2
    tok = torch.arange(tokens, dtype=torch.float32).view(1, 1, 1, tokens, 1).expand(n_tok, 1, 1, tokens, 1)
    mel = torch.arange(100, 100 + 2 * tokens, dtype=torch.float32).view(1, 1, 1, 2 * tokens, 1)
    att = torch.cat([tok.repeat(1, 1, 1, 2, 1), mel], dim=0)
    out = trim_conformer_att(att, AttKeep(prompt_len=4, keep_frames=6), up_rate=2, n_token_layers=n_tok)
    assert out.shape[3] == 10
    assert out[0, 0, 0, :, 0].tolist() == [0, 1, 4, 5, 6] * 2
    assert out[2, 0, 0, :, 0].tolist() == [100, 101, 102, 103, 108, 109, 110, 111, 112, 113]


@pytest.mark.gpu
def test_batched_split_is_byte_identical_on_cuda():
    dev = torch.device("cuda")
    for rows in (1, 4, 8):
        states = [_request(r) for r in range(rows)]
        states = [FlowCache(*(getattr(s, f).to(dev) for f in ("conformer_cnn", "conformer_att",
                                                              "estimator_cnn", "estimator_att")))
                  for s in states]  # fmt: skip
        batch = stack_flow_cache(states)
        for a, b in zip(split_flow_cache(batch, rows, batched=False), split_flow_cache(batch, rows, batched=True)):
            assert _same(a, b)
