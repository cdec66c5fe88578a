"""Aggregate per-request records into the vLLM-style metrics of one arm at one tier.

Names follow vLLM / vllm-omni's serving benchmark, with units in the name:

| metric | definition |
|---|---|
| `completed` / `failed` | measured requests that produced audio / that did not; `failed_by_kind` splits the latter |
| `{mean,median,std,p90,p99}_audio_rtf` | per request (last chunk arrival − send) / audio seconds; lower is faster |
| `{mean,median,std,p90,p99}_audio_ttfp_ms` | per request first chunk arrival − send, in ms |
| `audio_throughput` | Σ audio seconds of completed requests / wall seconds of the measured phases |
| `request_throughput` | completed requests / wall seconds of the measured phases |
| `mean_audio_seconds` | mean audio length of completed requests (RTF moves with length) |
| `prompt_cache_hits` / `prompt_cache_misses` | completed requests whose voice's prompt setup was reused / built (backends that report it) |
| `mean_audio_ttfp_ms_{hit,miss}` | mean TTFP of those two groups: what building a voice adds to the first chunk |
| `mean_prompt_setup_ms` | mean time of the misses' voice setups (device synchronized) |

Warmup records are ignored. The wall time of a phase is last end − first send of its records,
summed over phases (`phase_id`), so repeats and resumed phases add up correctly.

    agg = aggregate(records)
    agg.mean_audio_rtf, agg.to_dict()
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np

from tts_bench.rundir.records import RequestRecord

_STATS = ("mean", "median", "std", "p90", "p99")


@dataclass(frozen=True)
class Aggregates:
    completed: int = 0
    failed: int = 0
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    mean_audio_rtf: float | None = None
    median_audio_rtf: float | None = None
    std_audio_rtf: float | None = None
    p90_audio_rtf: float | None = None
    p99_audio_rtf: float | None = None
    mean_audio_ttfp_ms: float | None = None
    median_audio_ttfp_ms: float | None = None
    std_audio_ttfp_ms: float | None = None
    p90_audio_ttfp_ms: float | None = None
    p99_audio_ttfp_ms: float | None = None
    audio_throughput: float | None = None
    request_throughput: float | None = None
    mean_audio_seconds: float | None = None
    wall_s: float = 0.0
    prompt_cache_hits: int = 0
    prompt_cache_misses: int = 0
    mean_audio_ttfp_ms_hit: float | None = None
    mean_audio_ttfp_ms_miss: float | None = None
    mean_prompt_setup_ms: float | None = None

    @property
    def failure_fraction(self) -> float:
        total = self.completed + self.failed
        return self.failed / total if total else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def describe(values: Iterable[float], name: str) -> dict[str, float | None]:
    """`{mean,median,std,p90,p99}_<name>` of `values` (None for each when there are none)."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return {f"{s}_{name}": None for s in _STATS}
    return {
        f"mean_{name}": float(arr.mean()),
        f"median_{name}": float(np.median(arr)),
        f"std_{name}": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        f"p90_{name}": float(np.percentile(arr, 90)),
        f"p99_{name}": float(np.percentile(arr, 99)),
    }


def measured_wall_s(records: Iterable[RequestRecord]) -> float:
    """Σ over phases of (last end − first send)."""
    spans: dict[str, list[float]] = defaultdict(lambda: [float("inf"), float("-inf")])
    for r in records:
        span = spans[r.phase_id]
        span[0] = min(span[0], r.t_send_s)
        span[1] = max(span[1], r.t_end_s)
    return float(sum(hi - lo for lo, hi in spans.values()))


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _voice_split(ok: list[RequestRecord]) -> dict:
    """Voice-cache counts, TTFP by hit / miss and the misses' setup time."""
    hits = [r for r in ok if r.prompt_cache_hit is True]
    misses = [r for r in ok if r.prompt_cache_hit is False]
    return {
        "prompt_cache_hits": len(hits),
        "prompt_cache_misses": len(misses),
        "mean_audio_ttfp_ms_hit": _mean([r.audio_ttfp_ms for r in hits]),
        "mean_audio_ttfp_ms_miss": _mean([r.audio_ttfp_ms for r in misses]),
        "mean_prompt_setup_ms": _mean([r.prompt_setup_ms for r in misses if r.prompt_setup_ms is not None]),
    }


def aggregate(records: Iterable[RequestRecord]) -> Aggregates:
    """Aggregates over the measured (non-warmup) records."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    kinds = Counter(r.failure_kind for r in measured if not r.ok)
    wall = measured_wall_s(measured)
    audio = sum(r.audio_seconds for r in ok)
    return Aggregates(
        completed=len(ok),
        failed=len(measured) - len(ok),
        failed_by_kind=dict(sorted(kinds.items())),
        **describe((r.audio_rtf for r in ok), "audio_rtf"),
        **describe((r.audio_ttfp_ms for r in ok), "audio_ttfp_ms"),
        audio_throughput=audio / wall if wall > 0 else None,
        request_throughput=len(ok) / wall if wall > 0 else None,
        mean_audio_seconds=audio / len(ok) if ok else None,
        wall_s=wall,
        **_voice_split(ok),
    )
