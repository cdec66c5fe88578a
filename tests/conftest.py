"""Shared test setup: hardware markers skip cleanly without the hardware.

No device is constructed here at import time; `gpu`/`npu` tests are skipped at collection
with a reason when the platform lacks the device.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("NO_COLOR", "1")


def pytest_configure(config):
    # One intra-op thread per test process: the suite runs on 2-core machines where model tests,
    # spawned stage processes and the harness share the cores; oversubscribed OpenMP pools made
    # tiny-model steps 10-50x slower than single-threaded ones.
    import torch

    torch.set_num_threads(1)
    # cuBLAS reads this when its first handle is made: set before any test touches CUDA, so
    # tests that turn on deterministic kernels (as stage processes do) get them.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _has_npu() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch
        import torch_npu  # noqa: F401

        return torch.npu.is_available()
    except Exception:  # torch_npu without CANN raises at import
        return False


def pytest_collection_modifyitems(config, items):
    has_cuda = _has_cuda()
    has_npu = None
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="requires a CUDA device"))
        if "npu" in item.keywords:
            if has_npu is None:
                has_npu = _has_npu()
            if not has_npu:
                item.add_marker(pytest.mark.skip(reason="requires an Ascend NPU with torch_npu"))


@pytest.fixture
def virtual_clock():
    """Synthetic-backend runs of this test on virtual time (tests/virtual_clock.py): what they
    measure is what their delays imply, however loaded the machine."""
    from tests.virtual_clock import on_virtual_time

    with on_virtual_time() as clock:
        yield clock


@pytest.fixture
def deterministic():
    """Deterministic kernels, as every stage process runs with them (runner.deterministic);
    the flags are restored afterwards."""
    import torch

    from stages.platform import deterministic_kernels

    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory,
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    deterministic_kernels()
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.utils.deterministic.fill_uninitialized_memory = before[1]
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:]
