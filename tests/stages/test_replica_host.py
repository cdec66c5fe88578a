"""Replica threads of one process (`stages.runner.replica_host`): warmups one at a time."""

from __future__ import annotations

import threading
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


HANG_S = 60.0  # a hang guard only: nothing here waits on the clock to decide a result


class _Arrivals:
    """WARMUP_LOCK (or a stand-in) that counts the threads that reached it: those holding it and
    those blocked in its acquire."""

    def __init__(self, lock, expected: int) -> None:
        self.lock, self.expected = lock, expected
        self.arrived = 0
        self.all_arrived = threading.Condition()

    def __enter__(self):
        with self.all_arrived:
            self.arrived += 1
            self.all_arrived.notify_all()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)

    def wait_for_everyone(self) -> None:
        with self.all_arrived:
            assert self.all_arrived.wait_for(lambda: self.arrived == self.expected, HANG_S), \
                f"{self.arrived} of {self.expected} threads reached the warmup lock"


def _warm_and_watch(monkeypatch, threads: int, fail: str | None = None, lock=None) -> dict:
    """Replace warm_replica by one that records how many warmups overlap. Each warmup stays
    inside until every thread has reached the lock (an event, not a sleep): with the lock the
    others are then blocked in it, without it they are inside too."""
    seen = {"inside": 0, "most": 0, "order": []}
    count = threading.Lock()
    arrivals = _Arrivals(lock if lock is not None else replica_host.WARMUP_LOCK, threads)
    monkeypatch.setattr(replica_host, "WARMUP_LOCK", arrivals)

    def warm(ctx, t2w):
        with count:
            seen["inside"] += 1
            seen["most"] = max(seen["most"], seen["inside"])
            seen["order"].append(t2w)
        arrivals.wait_for_everyone()
        with count:
            seen["inside"] -= 1
        if t2w == fail:
            raise RuntimeError(f"{t2w} could not capture")

    monkeypatch.setattr(replica_host, "warm_replica", warm)
    return seen


def test_the_threads_of_one_host_warm_up_one_at_a_time_then_all_serve(monkeypatch):
    seen = _warm_and_watch(monkeypatch, threads=4)
    threads = [ReplicaThread(_Loop(f"code2wav-{r}"), inbox=None) for r in range(4)]
    for t in threads:
        t.thread.start()
    for t in threads:
        assert t.warmed.wait(HANG_S)
        t.thread.join(HANG_S)
    assert seen["most"] == 1, "two replica warmups ran side by side"
    assert sorted(seen["order"]) == [f"code2wav-{r}" for r in range(4)]
    assert all(t.loop.served.is_set() and t.error is None for t in threads)


def test_a_failed_warmup_is_kept_for_the_host_and_releases_the_others(monkeypatch):
    _warm_and_watch(monkeypatch, threads=3, fail="code2wav-1")
    threads = [ReplicaThread(_Loop(f"code2wav-{r}"), inbox=None) for r in range(3)]
    for t in threads:
        t.thread.start()
    for t in threads:
        assert t.warmed.wait(HANG_S)  # the failure does not hold the lock: every thread gets its turn
        t.thread.join(HANG_S)
    errors = {t.loop.ctx.spec.name: t.error for t in threads}
    assert isinstance(errors["code2wav-1"], RuntimeError) and "could not capture" in str(errors["code2wav-1"])
    assert errors["code2wav-0"] is None and errors["code2wav-2"] is None
    assert not threads[1].loop.served.is_set(), "a replica that failed its warmup must not serve"


@pytest.mark.parametrize("locked", [True, False], ids=["with-lock", "without-lock"])
def test_the_check_sees_overlap_when_the_lock_is_gone(monkeypatch, locked):
    """The watcher above can fail: with the lock replaced by a no-op, warmups overlap."""
    seen = _warm_and_watch(monkeypatch, threads=3, lock=None if locked else _NoLock())
    threads = [ReplicaThread(_Loop(f"code2wav-{r}"), inbox=None) for r in range(3)]
    for t in threads:
        t.thread.start()
    for t in threads:
        t.thread.join(HANG_S)
    assert not any(t.thread.is_alive() for t in threads)
    assert seen["most"] == (1 if locked else 3)


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
