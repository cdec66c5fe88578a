"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def interpret(monkeypatch):
    """Run Triton kernels on the CPU under the interpreter (`kernel_for` picks the interpreted
    twin for CPU tensors); skipped where triton is not installed."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
