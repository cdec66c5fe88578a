"""Cache row writes (stages.platform.indexing, the talker's KV write): the values of
`index_copy_` / slice indexing, and on CUDA under deterministic kernels without the
whole-destination copies those take."""

from __future__ import annotations

import pytest
import torch

from stages.platform.indexing import index_copy_span
from stages.talker.model import KVCache

# (dst shape, dim, span_dim, start, src length along span_dim): the dims of every use in code2wav
# and ones around them (index after the span, a dim in between, a span that is the whole dim).
CASES = [
    ((4, 6, 3, 9, 5), 1, 3, 2, 4),  # estimator arena step: pairs, heads in between, frames
    ((5, 80, 12), 0, 2, 0, 7),  # hift mel pool
    ((5, 40), 0, 1, 0, 40),  # hift tail, whole dim
    ((3, 5, 4, 10, 2), 1, 3, 0, 6),  # conformer att
    ((7, 3, 5), 2, 0, 1, 4),  # index after the span
]


def _reference(dst, dim, index, src, span_dim, start):
    out = dst.clone()
    out.narrow(span_dim, start, src.shape[span_dim]).index_copy_(dim, index, src)
    return out


@pytest.mark.parametrize(("shape", "dim", "span_dim", "start", "n"), CASES)
def test_span_write_equals_index_copy_into_the_narrowed_view(shape, dim, span_dim, start, n):
    gen = torch.Generator().manual_seed(0)
    dst = torch.randn(shape, generator=gen)
    index = torch.randperm(shape[dim], generator=gen)[: max(1, shape[dim] - 2)]
    src_shape = list(shape)
    src_shape[dim], src_shape[span_dim] = index.shape[0], n
    src = torch.randn(src_shape, generator=gen)
    expected = _reference(dst, dim, index, src, span_dim, start)
    index_copy_span(dst, dim, index, src, span_dim=span_dim, start=start)
    assert torch.equal(dst, expected)


def test_without_a_span_it_is_index_copy():
    dst, src = torch.zeros(4, 3), torch.arange(6.0).view(2, 3)
    index_copy_span(dst, 0, torch.tensor([3, 1]), src)
    assert torch.equal(dst, torch.tensor([[0.0] * 3, [3.0, 4.0, 5.0], [0.0] * 3, [0.0, 1.0, 2.0]]))


def test_refuses_a_sliced_destination_and_a_span_outside_it():
    dst = torch.zeros(4, 3, 8)
    with pytest.raises(ValueError, match="contiguous"):
        index_copy_span(dst[:, :, :4], 0, torch.tensor([0]), torch.ones(1, 3, 4))
    with pytest.raises(ValueError, match="outside"):
        index_copy_span(dst, 0, torch.tensor([0]), torch.ones(1, 3, 5), span_dim=2, start=4)
    with pytest.raises(ValueError, match="differ"):
        index_copy_span(dst, 0, torch.tensor([0]), torch.ones(1, 3, 8), span_dim=0)


def _kv_case(device, rows=5, heads=3, seq=16, hd=4):
    gen = torch.Generator().manual_seed(1)
    cache = KVCache((max(8, rows), heads, seq, hd), device=device, dtype=torch.float32)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    positions = torch.randint(0, seq, (rows,), generator=gen).to(device)
    k = torch.randn(rows, heads, 1, hd, generator=gen).to(device)
    v = torch.randn(rows, heads, 1, hd, generator=gen).to(device)
    return cache, torch.arange(rows, device=device), positions, k, v


def _kv_reference(cache, rows, positions, k, v):
    ek, ev = cache.k.clone(), cache.v.clone()
    for r in range(rows.shape[0]):  # row r's every head at its own position
        ek[rows[r], :, positions[r]] = k[r, :, 0]
        ev[rows[r], :, positions[r]] = v[r, :, 0]
    return ek, ev


def test_talker_decode_write_lands_at_each_rows_own_position():
    cache, rows, positions, k, v = _kv_case(torch.device("cpu"))
    ek, ev = _kv_reference(cache, rows, positions, k, v)
    cache.write(cache.decode_rows(positions), k, v)
    assert torch.equal(cache.k, ek) and torch.equal(cache.v, ev)


def test_talker_prefill_write_fills_positions_0_to_t_of_its_slot_only():
    cache, _, _, _, _ = _kv_case(torch.device("cpu"))
    ek, ev = cache.k.clone(), cache.v.clone()
    gen = torch.Generator().manual_seed(2)
    k, v = (torch.randn(1, 3, 7, 4, generator=gen) for _ in range(2))
    ek[5, :, :7], ev[5, :, :7] = k[0], v[0]
    cache.write(cache.prefill_rows(torch.tensor([5]), 7), k, v)
    assert torch.equal(cache.k, ek) and torch.equal(cache.v, ev)


# ---- CUDA ------------------------------------------------------------------------------------


def _peak_extra_bytes(write) -> int:
    """Device bytes allocated beyond the current ones while `write` runs."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    write()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.gpu
def test_cuda_span_write_allocates_what_it_writes_not_the_destination(deterministic):
    """64 MiB destination, a few rows written: the narrowed index_copy_ copies the whole slice
    (its peak grows by about the slice), the span write only by its indices and rows."""
    dev = torch.device("cuda")
    dst = torch.randn(16, 64, 16, 256, 4, device=dev)  # 64 MiB, a pool slice of an arena's shape
    index = torch.tensor([3, 7], device=dev)
    src = torch.randn(16, 2, 16, 200, 4, device=dev)
    expected = _reference(dst, 1, index, src, 3, 0)
    old = _peak_extra_bytes(lambda: dst.clone().narrow(3, 0, 200).index_copy_(1, index, src))
    new = _peak_extra_bytes(lambda: index_copy_span(dst, 1, index, src, span_dim=3))
    assert torch.equal(dst, expected)
    assert old > dst.nbytes // 2, old  # the landmine is real on this torch: else the test proves nothing
    assert new < src.nbytes * 4, (new, src.nbytes)


@pytest.mark.gpu
def test_cuda_talker_decode_write_does_not_copy_the_cache(deterministic):
    dev = torch.device("cuda")
    cache, rows, positions, k, v = _kv_case(dev, rows=64, heads=12, seq=1024, hd=64)
    ek, ev = _kv_reference(cache, rows, positions, k, v)
    extra = _peak_extra_bytes(lambda: cache.write(cache.decode_rows(positions), k, v))
    assert torch.equal(cache.k, ek) and torch.equal(cache.v, ev)
    assert extra < cache.k.nbytes // 8, (extra, cache.k.nbytes)
