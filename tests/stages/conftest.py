"""Fixtures shared by the stage tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def deterministic():
    """Deterministic kernels, as every stage process runs with them (runner.deterministic)."""
    from stages.platform import deterministic_kernels

    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory,
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    deterministic_kernels()
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.utils.deterministic.fill_uninitialized_memory = before[1]
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:]


@pytest.fixture
def talker_extras(monkeypatch):
    """`talker_extras(module)` -> a list that receives the stage extras of every TalkerEngine
    `module` builds from then on (the engines are built as usual)."""

    def spy_on(module) -> list[dict]:
        seen: list[dict] = []
        real = module.TalkerEngine

        def build(cfg, **kw):
            seen.append(dict(cfg.extra))
            return real(cfg, **kw)

        monkeypatch.setattr(module, "TalkerEngine", build)
        return seen

    return spy_on
