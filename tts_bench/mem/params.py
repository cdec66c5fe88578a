"""The `mem:` section of a bench config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MemParams:
    sampler: Literal["auto", "nvml", "npu-smi", "torch", "rss"] = "auto"
    interval_s: float = 2.0
    tier: str = "128x8"
    warm_tier: str | None = "4x1"
    device_index: int = 0

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"mem.interval_s must be > 0, got {self.interval_s}")
