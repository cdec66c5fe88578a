"""scripts/bench_prelude.py: impls of one B are timed round-robin, so drift hits all alike."""

from __future__ import annotations

import importlib

import torch



def _bench():
    return importlib.import_module("scripts.bench_prelude")  # scripts/ is importable from the repository root


def test_windows_rotate_through_the_impls_and_keep_one_sample_per_window():
    bench, calls = _bench(), []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    samples = bench.time_interleaved(fns, {"a": 1, "b": 2, "c": 1}, torch.device("cpu"),
                                     reps=3, warmup=0)
    assert calls == ["a", "b", "b", "c", "b", "b", "c", "a", "c", "a", "b", "b"]
    assert {name: len(xs) for name, xs in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(x >= 0 for xs in samples.values() for x in xs)
