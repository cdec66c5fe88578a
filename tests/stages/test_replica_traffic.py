"""scripts/replica_traffic.py's batching: a replica's view of runner traffic."""

from __future__ import annotations

import random

from scripts.replica_traffic import _traffic


def _requests(lengths):
    return [[(i, seq) for seq in range(n)] for i, n in enumerate(lengths)]


def test_irregular_batches_keep_each_request_in_order_and_vary_in_size():
    lengths = [3, 7, 1, 5, 9, 2, 6, 4, 8, 5]
    seen, sizes = {}, []
    for batch in _traffic(_requests(lengths), live=6, rows=4, rng=random.Random(0)):
        assert 1 <= len(batch) <= 4
        assert len({i for i, _ in batch}) == len(batch)  # one payload per request a decode
        for i, seq in batch:
            assert seq == seen.get(i, -1) + 1
            seen[i] = seq
        sizes.append(len(batch))
    assert seen == {i: n - 1 for i, n in enumerate(lengths)}
    assert len(set(sizes)) > 2  # irregular: many batch sizes, hence many captured shapes


def test_regular_batches_take_the_full_row_count_while_enough_are_live():
    batches = list(_traffic(_requests([4] * 8), live=8, rows=4))
    assert [len(b) for b in batches] == [4] * 8
