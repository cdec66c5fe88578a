"""Fixtures shared by the stage tests."""

from __future__ import annotations

import pytest


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
