"""Open-loop arrival times: requests sent on a seeded schedule instead of when a client is free.

As vLLM's `bench serve --request-rate R --burstiness B`: the gaps between arrivals are gamma
distributed with shape B and mean 1/R (B = 1: a Poisson process; B < 1 burstier, B > 1 more
regular; the gaps' coefficient of variation is 1/sqrt(B)). The tier's C caps the requests in
flight (vLLM's `--max-concurrency`): an arrival that finds C in flight waits for a slot and is
sent then; the schedule does not catch up (AIPerf's sleep-then-gate).

The schedule is drawn from (bench.seed, C, R, repeat) and never from the arm, so both arms of a
block see the same arrival times; it is the first arrival at t = 0 and then the cumulative gaps.

    times = Arrivals(12.0, 1.0, seed=0, tier=Tier(128, 8), repeat=0)
    [next(times) for _ in range(3)]     # [0.0, 0.031..., 0.12...]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

_BATCH = 256  # gaps drawn per refill (the same in every arm: identical streams)


@dataclass(frozen=True)
class OpenLoop:
    """The plan's arrival process, shared by both arms."""

    request_rate: float  # requests per second
    burstiness: float = 1.0  # gamma shape

    def __post_init__(self) -> None:
        if not 0 < self.request_rate <= 1e6:
            raise ValueError(f"request rate must be in (0, 1e6] requests/s, got {self.request_rate}")
        if not 0 < self.burstiness <= 1e3:
            raise ValueError(f"burstiness must be in (0, 1000], got {self.burstiness}")

    def times(self, *, seed: int, tier: Any, repeat: int) -> Arrivals:
        return Arrivals(self.request_rate, self.burstiness, seed=seed, tier=tier, repeat=repeat)

    def to_dict(self) -> dict[str, float]:
        return {"request_rate": self.request_rate, "burstiness": self.burstiness}


class Arrivals(Iterator[float]):
    """Arrival offsets in seconds from the phase start, without end."""

    def __init__(self, rate: float, burstiness: float, *, seed: int, tier: Any, repeat: int) -> None:
        # repeat -1 (the warm phase) gets its own stream; +1 keeps every entropy word non-negative.
        key = [int(seed), int(tier.concurrency), int(tier.replicas), int(repeat) + 1, 0x0A11]
        self.rate, self.burstiness = rate, burstiness
        self._rng = np.random.default_rng(key)
        self._shape, self._scale = burstiness, 1.0 / (rate * burstiness)
        self._buf: list[float] = []
        self._t = 0.0
        self._first = True

    def __next__(self) -> float:
        if self._first:
            self._first = False
            return 0.0
        if not self._buf:
            self._buf = self._rng.gamma(self._shape, self._scale, _BATCH).tolist()[::-1]
        self._t += self._buf.pop()
        return self._t


def first_times(loop: OpenLoop, n: int, *, seed: int, tier: Any, repeat: int) -> list[float]:
    """The first `n` arrival offsets (count mode: one per job)."""
    times = loop.times(seed=seed, tier=tier, repeat=repeat)
    return [next(times) for _ in range(n)]
