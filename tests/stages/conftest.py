"""Fixtures shared by the stage tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def deterministic():
    """Deterministic kernels, as every stage process runs with them (runner.deterministic)."""
    from stages.platform import deterministic_kernels

    before = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    deterministic_kernels()
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.utils.deterministic.fill_uninitialized_memory = before[1]
