"""Memory summary per arm: steady state, peak, headroom, the delta between arms, and its table.

Definitions (the seed's procedure, made exact):
- steady state = median of the samples taken after the tier's warmup requests (phase
  "measure"); gaps (samples with an error) are left out;
- peak = max over every sample of the tier, warmup included (a spike during warmup still has
  to fit on the card);
- total = the device's memory as the sampler reports it (none for `torch`); headroom = total − peak;
- delta = steady(arm) − steady(base) in MiB and in % of the base's steady state.
Everything is MiB (2^20 bytes); npu-smi's "MB" are MiB too.

    summary = summarize({"base": series_a, "test": series_b}, tier="128x8")
    summary.to_dict()["arms"]["test"]["delta_mib"]        # +318.0
    render(mem_table(summary), "md")
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tts_bench.mem.npu_smi import MIB
from tts_bench.mem.recorder import MemSample, MemSeries
from tts_bench.report.tables import fmt_pct

MEM_COLUMNS = ("arm", "steady-state median MiB", "peak MiB", "delta (steady)", "headroom MiB", "samples")


def _mib(b: float | None) -> float | None:
    return None if b is None else b / MIB


@dataclass(frozen=True)
class ArmMemory:
    """One arm's memory over one tier."""

    arm: str
    steady_median_mib: float | None
    peak_mib: float | None
    total_mib: float | None
    n_samples: int
    n_measure: int
    gaps: int
    sample_ms_mean: float | None
    sample_ms_max: float | None
    warmup_end_s: float | None  # when the measure phase began (the shaded span of the PNG)
    extra: dict[str, float | None]  # torch: reserved steady/peak, allocator peak (MiB)
    samples: list[MemSample]

    @property
    def headroom_mib(self) -> float | None:
        if self.total_mib is None or self.peak_mib is None:
            return None
        return self.total_mib - self.peak_mib


def _extra_sum(s: MemSample, key: str) -> int | None:
    vals = [r.get(key) for r in s.readings]
    return None if not vals or None in vals else sum(vals)


def _torch_extras(ok: list[MemSample], measure: list[MemSample]) -> dict[str, float | None]:
    """Reserved memory (what the allocator holds on the device) and the allocators' own peaks,
    which also see spikes between two samples."""
    if not ok or _extra_sum(ok[0], "reserved_bytes") is None:
        return {}
    reserved = [_extra_sum(s, "reserved_bytes") for s in measure]
    extras = {
        "reserved_steady_median_mib": _mib(statistics.median(reserved)) if reserved else None,
        "reserved_peak_mib": _mib(max(_extra_sum(s, "reserved_bytes") for s in ok)),
        "allocator_peak_mib": _mib(max((_extra_sum(s, "peak_bytes") or 0) for s in ok)),
    }
    # The voices' prompt setups the replicas hold (part of the allocated bytes above), where
    # the stages report them.
    voices = [sum(r.get("prompt_cache_bytes") or 0 for r in s.readings) for s in ok]
    if any(voices):
        extras["voices_peak_mib"] = _mib(max(voices))
    return extras


def arm_memory(arm: str, series: MemSeries) -> ArmMemory:
    """Reduce one arm's samples to steady state, peak, total and sampler overhead."""
    samples = series.samples
    ok = [s for s in samples if s.ok]
    measure = [s for s in ok if s.phase == "measure"]
    totals = [s.total_bytes for s in ok if s.total_bytes is not None]
    times = [s.sample_ms for s in samples]
    # When the warmup requests ended: the recorder's mark, else the first measure-phase sample.
    first_measure = series.phase_starts.get(
        "measure", next((s.t_s for s in samples if s.phase == "measure"), None))
    return ArmMemory(
        arm=arm,
        steady_median_mib=_mib(statistics.median(s.used_bytes for s in measure)) if measure else None,
        peak_mib=_mib(max(s.used_bytes for s in ok)) if ok else None,
        total_mib=_mib(max(totals)) if totals else None,
        n_samples=len(samples),
        n_measure=len(measure),
        gaps=len(samples) - len(ok),
        sample_ms_mean=statistics.fmean(times) if times else None,
        sample_ms_max=max(times) if times else None,
        warmup_end_s=first_measure,
        extra=_torch_extras(ok, measure) if series.sampler == "torch" else {},
        samples=samples,
    )


@dataclass(frozen=True)
class MemSummary:
    """Every arm of one tier for one sampler; the first arm is the base of the deltas."""

    sampler: str
    interval_s: float
    tier: str
    arms: dict[str, ArmMemory]
    describe: dict[str, Any]

    @property
    def base(self) -> str:
        return next(iter(self.arms))

    def delta(self, arm: str) -> tuple[float | None, float | None]:
        """(MiB, % of base) of the steady state; (None, None) when either side has none."""
        a, b = self.arms[arm].steady_median_mib, self.arms[self.base].steady_median_mib
        if a is None or b is None:
            return None, None
        return a - b, (100.0 * (a - b) / b if b else None)

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON: sampler, interval_s, arms.<arm>.{steady_median_mib, peak_mib,
        total_mib, headroom_mib, samples, ...}; samples in MiB."""
        return {
            "sampler": self.sampler,
            "interval_s": self.interval_s,
            "tier": self.tier,
            "base_arm": self.base,
            "describe": self.describe,
            "arms": {name: self._arm_dict(name) for name in self.arms},
        }

    def _arm_dict(self, name: str) -> dict[str, Any]:
        a = self.arms[name]
        d_mib, d_pct = self.delta(name)
        return {
            "steady_median_mib": a.steady_median_mib,
            "peak_mib": a.peak_mib,
            "total_mib": a.total_mib,
            "headroom_mib": a.headroom_mib,
            "delta_mib": d_mib,
            "delta_pct": d_pct,
            "n_samples": a.n_samples,
            "n_measure": a.n_measure,
            "gaps": a.gaps,
            "sample_ms_mean": a.sample_ms_mean,
            "sample_ms_max": a.sample_ms_max,
            "warmup_end_s": a.warmup_end_s,
            **a.extra,
            "samples": [
                {"t_s": round(s.t_s, 3), "phase": s.phase, "used_mib": _mib(s.used_bytes),
                 "total_mib": _mib(s.total_bytes), "sample_ms": round(s.sample_ms, 3), "error": s.error}
                for s in a.samples
            ],
        }


def summarize(series: dict[str, MemSeries], *, tier: str) -> MemSummary:
    """Per-arm reduction of one sampler's series (`series` ordered base first)."""
    if not series:
        raise ValueError("summarize needs at least one arm's series")
    first = next(iter(series.values()))
    return MemSummary(
        sampler=first.sampler, interval_s=first.interval_s, tier=tier,
        arms={arm: arm_memory(arm, s) for arm, s in series.items()}, describe=first.describe,
    )


def _fmt_mib(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def _fmt_delta(summary: MemSummary, arm: str) -> str:
    if arm == summary.base:
        return "(base)"
    d_mib, d_pct = summary.delta(arm)
    if d_mib is None:
        return "n/a"
    mib = "+0.0" if round(d_mib, 1) == 0 else f"{d_mib:+.1f}"
    return f"{mib} MiB ({fmt_pct(d_pct, 2)})"


def mem_table(summary: MemSummary) -> pd.DataFrame:
    """`arm | steady-state median MiB | peak MiB | delta (steady) | headroom MiB | samples`."""
    rows = []
    for name, a in summary.arms.items():
        gaps = f", {a.gaps} gap{'s' if a.gaps != 1 else ''}" if a.gaps else ""
        rows.append({
            MEM_COLUMNS[0]: name,
            MEM_COLUMNS[1]: _fmt_mib(a.steady_median_mib),
            MEM_COLUMNS[2]: _fmt_mib(a.peak_mib),
            MEM_COLUMNS[3]: _fmt_delta(summary, name),
            MEM_COLUMNS[4]: _fmt_mib(a.headroom_mib),
            MEM_COLUMNS[5]: f"{a.n_measure}/{a.n_samples}{gaps}",
        })
    return pd.DataFrame(rows, columns=list(MEM_COLUMNS), dtype=object)


def table_title(summary: MemSummary) -> str:
    total = next((a.total_mib for a in summary.arms.values() if a.total_mib is not None), None)
    of = f", total {total:.0f} MiB" if total is not None else ""
    return (f"memory at {summary.tier} ({summary.sampler}, every {summary.interval_s:g} s{of}; "
            f"samples = measure/all)")
