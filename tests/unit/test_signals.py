"""Interrupts belong to the parent: children spawned inside `interrupts_blocked` start with SIGINT
and SIGTERM blocked, and `ignore_interrupts` makes them ignore both for good (stages.signals)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading

from stages.signals import ignore_interrupts, interrupts_blocked


HANG_S = 120.0  # hang guards only (a loaded 2-core box once took 30 s to spawn the child)


def _child(started, signalled, survived) -> None:
    ignore_interrupts()
    started.set()
    # Alive until the parent has sent both signals (an event, not a sleep that a loaded machine
    # could outlast before they arrive); a signal is handled before the wait returns.
    if signalled.wait(HANG_S):
        survived.set()


def test_a_child_that_ignores_interrupts_survives_ctrl_c_and_sigterm():
    ctx = mp.get_context("spawn")
    started, signalled, survived = ctx.Event(), ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_child, args=(started, signalled, survived))
    with interrupts_blocked():
        proc.start()
    assert started.wait(HANG_S)
    os.kill(proc.pid, signal.SIGINT)
    os.kill(proc.pid, signal.SIGTERM)
    signalled.set()
    proc.join(HANG_S)
    assert proc.exitcode == 0 and survived.is_set()


def test_interrupts_blocked_restores_the_mask_and_ignore_interrupts_is_a_no_op_off_the_main_thread():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with interrupts_blocked():
        assert {signal.SIGINT, signal.SIGTERM} <= signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    handler, errors = signal.getsignal(signal.SIGINT), []

    def off_main() -> None:
        try:
            ignore_interrupts()
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)

    thread = threading.Thread(target=off_main)
    thread.start()
    thread.join()
    assert errors == [] and signal.getsignal(signal.SIGINT) is handler
