"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def interpret(monkeypatch):
    """Run Triton kernels on the CPU under the interpreter (`kernel_for` picks the interpreted
    twin for CPU tensors); skipped where triton is not installed."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def forced_cuda(interpret, monkeypatch):
    """The CUDA branch of the DiT's kernel choice on the CPU, the kernels under the interpreter
    (which compiles nothing, so the warm-ups are skipped)."""
    from stages.code2wav import fusions, kernels

    for module in (kernels, fusions):
        monkeypatch.setattr(module, "is_cuda", lambda device: device.type == "cpu")
        monkeypatch.setattr(module, "compile_failure", lambda *a, **k: None)
    monkeypatch.setattr(kernels, "tf32_tensor_cores", lambda device: True)
