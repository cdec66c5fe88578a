"""Replica threads of one process (`stages.runner.replica_host`): warmups one at a time."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from stages.runner import replica_host
from stages.runner.replica_host import ReplicaThread


class _Loop:
    """The part of a ReplicaLoop a ReplicaThread touches: its context, engine and serve loop."""

    def __init__(self, name: str) -> None:
        self.ctx = SimpleNamespace(spec=SimpleNamespace(name=name), device=torch.device("cpu"))
        self.t2w = name
        self.served = threading.Event()

    def run(self, inbox) -> None:
        self.served.set()


def _warm_and_watch(monkeypatch, fail: str | None = None) -> dict:
    """Replace warm_replica by one that sleeps and records how many warmups overlap."""
    seen = {"inside": 0, "most": 0, "order": []}
    lock = threading.Lock()

    def warm(ctx, t2w):
        with lock:
            seen["inside"] += 1
            seen["most"] = max(seen["most"], seen["inside"])
            seen["order"].append(t2w)
        time.sleep(0.2)  # long enough for every other thread to reach its warmup
        with lock:
            seen["inside"] -= 1
        if t2w == fail:
            raise RuntimeError(f"{t2w} could not capture")

    monkeypatch.setattr(replica_host, "warm_replica", warm)
    return seen


def test_the_threads_of_one_host_warm_up_one_at_a_time_then_all_serve(monkeypatch):
    seen = _warm_and_watch(monkeypatch)
    threads = [ReplicaThread(_Loop(f"code2wav-{r}"), inbox=None) for r in range(4)]
    for t in threads:
        t.thread.start()
    for t in threads:
        assert t.warmed.wait(10)
        t.thread.join(10)
    assert seen["most"] == 1, "two replica warmups ran side by side"
    assert sorted(seen["order"]) == [f"code2wav-{r}" for r in range(4)]
    assert all(t.loop.served.is_set() and t.error is None for t in threads)


def test_a_failed_warmup_is_kept_for_the_host_and_releases_the_others(monkeypatch):
    _warm_and_watch(monkeypatch, fail="code2wav-1")
    threads = [ReplicaThread(_Loop(f"code2wav-{r}"), inbox=None) for r in range(3)]
    for t in threads:
        t.thread.start()
    for t in threads:
        assert t.warmed.wait(10)  # the failure does not hold the lock: every thread gets its turn
        t.thread.join(10)
    errors = {t.loop.ctx.spec.name: t.error for t in threads}
    assert isinstance(errors["code2wav-1"], RuntimeError) and "could not capture" in str(errors["code2wav-1"])
    assert errors["code2wav-0"] is None and errors["code2wav-2"] is None
    assert not threads[1].loop.served.is_set(), "a replica that failed its warmup must not serve"


@pytest.mark.parametrize("locked", [True, False], ids=["with-lock", "without-lock"])
def test_the_check_sees_overlap_when_the_lock_is_gone(monkeypatch, locked):
    """The watcher above can fail: with the lock replaced by a no-op, warmups overlap."""
    seen = _warm_and_watch(monkeypatch)
    if not locked:
        monkeypatch.setattr(replica_host, "WARMUP_LOCK", _NoLock())
    threads = [ReplicaThread(_Loop(f"code2wav-{r}"), inbox=None) for r in range(3)]
    for t in threads:
        t.thread.start()
    for t in threads:
        t.thread.join(10)
    assert (seen["most"] == 1) is locked


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
