"""The cache split (seed item 3) into the slot pool: batched == per-row byte for byte, the CFG
pair order, the trim ranges, the conformer trim, and the estimator stores of PooledAttSteps."""

from __future__ import annotations

import pytest
import torch

from stages.code2wav.chunk_decode import PooledAttSteps, store_small_caches
from stages.code2wav.flow_cache import AttKeep, trim_conformer_att
from stages.code2wav.slots import SlotPool
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")


def _chunk(rows: int, seed: int, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(rows, 32, 6, generator=g).to(device),  # conformer cnn
        torch.randn(3, rows, 2, 40, 32, generator=g).to(device),  # conformer att (trimmed)
        torch.randn(10, 2, 2 * rows, 64, 2, generator=g).to(device),  # estimator cnn, CFG order
    )


def _pool(capacity: int, device="cpu") -> SlotPool:
    return SlotPool(tiny_config(), device=torch.device(device), dtype=torch.float32, frames=60, capacity=capacity)


def _split_both_ways(rows: int, slots: list[int], device="cpu"):
    pools = [_pool(max(slots) + 1, device) for _ in range(2)]
    chunk = _chunk(rows, seed=rows, device=device)
    index = torch.tensor(slots, device=device)
    for pool, batched in zip(pools, (True, False)):
        store_small_caches(pool.tensors, index, SlotPool.pair_index(index), *chunk, batched=batched)
    return pools, chunk


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_batched_split_writes_the_same_bytes_as_per_row(rows):
    slots = list(range(2 * rows - 1, -1, -2))  # scattered, descending: not a contiguous block
    (batched, per_row), (cnn, att, ecnn) = _split_both_ways(rows, slots)
    for name in ("conformer_cnn", "conformer_att", "estimator_cnn"):
        assert torch.equal(batched[name], per_row[name]), name
    for r, s in enumerate(slots):
        assert torch.equal(batched["conformer_cnn"][s], cnn[r])
        assert torch.equal(batched["conformer_att"][:, s, :, :40], att[:, r])
        assert torch.equal(batched["estimator_cnn"][:, :, 2 * s], ecnn[:, :, r])  # cond row
        assert torch.equal(batched["estimator_cnn"][:, :, 2 * s + 1], ecnn[:, :, rows + r])  # uncond


def test_pair_index_is_the_cfg_layout_of_the_slots():
    assert SlotPool.pair_index(torch.tensor([5, 0, 2])).tolist() == [10, 0, 4, 11, 1, 5]


def test_keep_ranges():
    keep = AttKeep(prompt_len=4, keep_frames=2)
    assert keep.ranges(6) == [(0, 6)]
    assert keep.ranges(9) == [(0, 4), (7, 2)]


def test_estimator_stores_trim_into_the_front_of_each_slot():
    pool = torch.zeros(2, 1, 4, 1, 8, 1)  # [n_t, depth, 2S (S = 2), H, F, 1]
    buf = torch.arange(2 * 9, dtype=torch.float32).view(1, 2, 1, 9, 1)  # [depth, 2B, H, T+L, 1]
    pairs = SlotPool.pair_index(torch.tensor([1]))  # rows 2 (cond), 3 (uncond)
    steps = PooledAttSteps(pool, pairs, length=7, keep=AttKeep(prompt_len=4, keep_frames=2), store=True)
    steps.store(1, buf)
    assert pool[1, 0, 2, 0, :6, 0].tolist() == [0, 1, 2, 3, 7, 8]
    assert pool[1, 0, 3, 0, :6, 0].tolist() == [9, 10, 11, 12, 16, 17]
    assert pool[0].abs().sum() == 0 and pool[1, 0, :2].abs().sum() == 0  # other steps and slots
    back = torch.zeros(1, 2, 1, 8, 1)
    PooledAttSteps(pool, pairs, length=6, keep=None, store=False).load(1, back)  # tail [2:]
    assert back[0, 0, 0, 2:, 0].tolist() == [0, 1, 2, 3, 7, 8]


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
def test_batched_split_writes_the_same_bytes_as_per_row_on_cuda():
    for rows in (1, 4, 8):
        (batched, per_row), _ = _split_both_ways(rows, list(range(2 * rows - 1, -1, -2)), device="cuda")
        for name in ("conformer_cnn", "conformer_att", "estimator_cnn"):
            assert torch.equal(batched[name], per_row[name]), (rows, name)
