"""The `mem:` section of a bench config: how `tts-bench mem` (and `ab --mem`) samples memory.

    mem:
      sampler: nvml,torch     # auto | nvml | npu-smi | torch | rss, comma-separated for several
      interval_s: 2.0
      tier: 128x8             # null (the default): the config's first bench tier
      warm_tier: 4x1          # run first on the same fresh backend, not sampled; null = none
      warm_prompts: null      # requests of the warm tier; null = 2 x its concurrency
      device_index: 0         # GPU index for NVML (ignores CUDA_VISIBLE_DEVICES) / npu-smi card
"""

from __future__ import annotations

from dataclasses import dataclass

from tts_bench.config.limits import MAX_PROMPTS, check_range

SAMPLER_CHOICES = ("auto", "nvml", "npu-smi", "torch", "rss")
# Sampling faster than this measures the sampler: an NVML query alone takes ~1 ms, and the
# recorder keeps every sample in memory for the whole tier.
MIN_INTERVAL_S = 0.01


@dataclass(frozen=True)
class MemParams:
    sampler: str = "auto"
    interval_s: float = 2.0
    # None: the config's first `bench.tiers` entry, the load the config was written for (a
    # fixed 128x8 ran 8 replicas and 128 requests in flight against the tiny CPU config).
    tier: str | None = None
    warm_tier: str | None = "4x1"
    warm_prompts: int | None = None
    device_index: int = 0

    def __post_init__(self) -> None:
        if not self.interval_s >= MIN_INTERVAL_S:  # below it the sampler only busy-loops
            raise ValueError(f"mem.interval_s must be >= {MIN_INTERVAL_S} s, got {self.interval_s}")
        names = [n.strip() for n in self.sampler.split(",") if n.strip()]
        bad = [n for n in names if n not in SAMPLER_CHOICES]
        if not names or bad:
            raise ValueError(
                f"mem.sampler: {(bad or [self.sampler])[0]!r} is not a sampler; valid: "
                f"{', '.join(SAMPLER_CHOICES)} (comma-separated for several)"
            )
        if self.warm_prompts is not None and self.warm_prompts < 1:
            raise ValueError(f"mem.warm_prompts must be >= 1 or null, got {self.warm_prompts}")
        if self.device_index < 0:
            raise ValueError(f"mem.device_index must be >= 0, got {self.device_index}")
        if self.warm_prompts is not None:
            check_range("mem.warm_prompts", self.warm_prompts, 1, MAX_PROMPTS)

    @property
    def sampler_names(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.sampler.split(",") if n.strip())
