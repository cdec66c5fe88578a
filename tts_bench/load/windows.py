"""Steady measurement windows: what a duration-mode phase measures, and the per-phase record.

Count mode (the default, CI) sends a fixed list of requests and measures until the last one
drains: with one prompt per client that is a burst with no steady state. Duration mode
(`bench.duration_s`) measures a window of steady load instead, like perf_analyzer's time
windows, AIPerf's `--benchmark-duration` and MLPerf's minimum duration:

- **ramp**: C closed-loop clients start sending (the prompt set cycles, each request keeps the
  seed of its position, so both arms send the same sequence); the ramp ends once C requests are
  in flight *and* `bench.ramp_s` has passed (open loop: once `ramp_s` has passed, C is a cap);
- **window**: `duration_s` seconds; a request belongs to it when it was *sent* inside it; the
  audio that *arrived* inside it (chunk by chunk) is the phase's throughput, in audio seconds
  per wall second, whichever request it belongs to;
- **drain**: nothing new is sent; requests in flight finish (and keep their window).

The window is cut into sub-windows of `bench.window_s`; the phase is `stable` when the last three
agree within `bench.stability_pct` on throughput and on mean RTF (perf_analyzer's rule: each
within the percentage of their mean); `bench.until_stable` adds sub-windows up to
`bench.max_duration_s`. A closed-loop phase whose C never fills before the window would end, or
a window with no request sent in it, is invalid, with the reason.

Every ab phase leaves one line in the run's phases.jsonl (`PhaseRecord`): the unit the verdict
compares per block, for throughput as for RTF.

    phase_throughputs(RunDir.open(path))   # {"4x1": {"base": [31.9, 32.1], "test": [...]}}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tts_bench.errors import ConfigError

PHASES_FILE = "phases.jsonl"


def check_window_params(bench: Any) -> None:
    """The window keys of a BenchParams (called from its __post_init__); ValueError naming the key."""
    if bench.duration_s is not None and not 0 < bench.duration_s <= 86_400:
        raise ValueError(f"bench.duration_s must be in (0, 86400] s or null (count mode), got {bench.duration_s}")
    if not 0 <= bench.ramp_s <= 3600:
        raise ValueError(f"bench.ramp_s must be in [0, 3600] s, got {bench.ramp_s}")
    if not 0 < bench.window_s <= 3600:
        raise ValueError(f"bench.window_s must be in (0, 3600] s, got {bench.window_s}")
    if not 0 < bench.stability_pct <= 100:
        raise ValueError(f"bench.stability_pct must be in (0, 100], got {bench.stability_pct}")
    cap = bench.max_duration_s
    if cap is not None and (bench.duration_s is None or not bench.duration_s <= cap <= 86_400):
        raise ValueError(f"bench.max_duration_s must be >= bench.duration_s (and <= 86400 s), got {cap}")


@dataclass(frozen=True)
class WindowPlan:
    """The shape of a duration-mode phase (from `bench`; the same for both arms)."""

    duration_s: float
    ramp_s: float = 0.0
    window_s: float = 10.0
    stability_pct: float = 10.0
    until_stable: bool = False
    max_duration_s: float | None = None

    @classmethod
    def from_bench(cls, bench: Any) -> WindowPlan | None:
        """None in count mode (`bench.duration_s` unset)."""
        if bench.duration_s is None:
            return None
        return cls(bench.duration_s, bench.ramp_s, bench.window_s, bench.stability_pct,
                   bench.until_stable, bench.max_duration_s)

    @property
    def cap_s(self) -> float:
        return self.max_duration_s if self.max_duration_s is not None else 3.0 * self.duration_s


def warmup_phase_on(bench: Any) -> bool:
    """`bench.warmup_phase`, default on in duration mode and off in count mode."""
    return bench.duration_s is not None if bench.warmup_phase is None else bool(bench.warmup_phase)


@dataclass(frozen=True)
class SubWindow:
    start_s: float
    end_s: float
    audio_s: float  # audio that arrived inside it
    throughput: float  # audio_s / (end_s - start_s)
    requests: int  # successful requests sent inside it
    mean_rtf: float | None


def sub_window_bounds(w0: float, w1: float, window_s: float) -> list[tuple[float, float]]:
    """Successive sub-windows of `window_s` from w0; the last one takes the remainder (a window
    shorter than one sub-window is one sub-window)."""
    n = max(1, math.floor((w1 - w0) / window_s + 1e-9))
    edges = [w0 + k * window_s for k in range(n)] + [w1]
    return list(zip(edges[:-1], edges[1:]))


def audio_between(chunks: Iterable[tuple[float, float]], a: float, b: float) -> float:
    """Audio seconds of the chunks (arrival offset, audio seconds) that arrived in [a, b)."""
    return float(sum(sec for t, sec in chunks if a <= t < b))


def sub_windows(w0: float, w1: float, window_s: float, sends: Sequence[tuple[float, float | None]],
                chunks: Sequence[Sequence[tuple[float, float]]]) -> list[SubWindow]:
    """Per sub-window: throughput by chunk arrival, mean RTF of the requests sent in it.
    `sends`: (send offset, audio_rtf or None for a failure) per request; `chunks`: per request."""
    out = []
    for a, b in sub_window_bounds(w0, w1, window_s):
        audio = sum(audio_between(c, a, b) for c in chunks)
        rtfs = [rtf for t, rtf in sends if a <= t < b and rtf is not None]
        out.append(SubWindow(a, b, audio, audio / (b - a), len(rtfs),
                             float(sum(rtfs) / len(rtfs)) if rtfs else None))
    return out


def agree(values: Sequence[float | None], pct: float) -> bool | None:
    """perf_analyzer's rule over the last three values: each within `pct` % of their mean.
    None when there are fewer than three (not enough sub-windows to say)."""
    last = list(values[-3:])
    if len(last) < 3:
        return None
    if any(v is None for v in last):
        return False
    mean = sum(last) / 3.0
    if mean == 0:
        return all(v == 0 for v in last)
    return all(abs(v - mean) <= pct / 100.0 * abs(mean) for v in last)


def is_stable(subs: Sequence[SubWindow], pct: float) -> bool | None:
    """Throughput and mean RTF both agree over the last three sub-windows (None: < 3 of them)."""
    thr, rtf = agree([s.throughput for s in subs], pct), agree([s.mean_rtf for s in subs], pct)
    if thr is None or rtf is None:
        return None
    return thr and rtf


@dataclass(frozen=True)
class PhaseRecord:
    """One phase as phases.jsonl stores it (count mode: the window is first send .. last end)."""

    arm: str
    tier: str
    repeat: int  # -1: the discarded warm phase
    phase_id: str
    mode: str  # count | duration
    warm: bool
    window_start_s: float
    window_s: float  # measured length (duration mode: as extended by until_stable)
    audio_s_in_window: float
    throughput: float | None  # audio seconds per wall second in the window
    requests_in_window: int
    ramp_s: float | None = None  # how long the ramp actually took (duration mode)
    max_in_flight: int = 0
    sub_windows: list[dict[str, Any]] = field(default_factory=list)
    stable: bool | None = None  # None: count mode, or fewer than three sub-windows
    stability_pct: float | None = None
    request_rate: float | None = None  # open loop: requests/s (None: closed loop)
    burstiness: float | None = None
    invalid_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def phases_path(run_dir: Any) -> Path:
    return Path(getattr(run_dir, "path", run_dir)) / PHASES_FILE


def append_phase(run_dir: Any, record: PhaseRecord) -> None:
    """One line in phases.jsonl, durable before the next phase starts (once per phase, off the
    measured window: the fsync cannot delay a chunk's timestamp)."""
    with open(phases_path(run_dir), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_phases(run_dir: Any) -> list[dict[str, Any]]:
    """Every phase record of a run, in write order (none: []); a torn last line is skipped, a
    damaged one elsewhere (not JSON, or no arm, tier and repeat) is a ConfigError naming it."""
    path = phases_path(run_dir)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:  # a write cut short by a kill: that phase runs again on --resume
                continue
            raise _damaged(path, i + 1, "is not valid JSON") from None
        if not isinstance(record, dict) or not {"arm", "tier", "repeat"} <= record.keys():
            raise _damaged(path, i + 1, "is not a phase record (a JSON object with arm, tier and repeat)")
        out.append(record)
    return out


def _damaged(path: Path, line: int, what: str) -> ConfigError:
    return ConfigError(f"error: {path}:{line} {what} (run directory); the record is corrupt: rerun from scratch, "
                       f"or delete that line and --resume an A/B to run its phase again")


def measured_phases(run_dir: Any, *, blocks: Any = None) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(arm, tier, repeat) -> the phase's record, warm phases left out; a phase recorded twice
    (a count phase finished by --resume) keeps its last record. `blocks`: only phases of these
    (tier, repeat) blocks (`tts-bench ab --report`, tts_bench.ab.report)."""
    return {(p["arm"], p["tier"], int(p["repeat"])): p for p in read_phases(run_dir)
            if not p.get("warm") and (blocks is None or (p["tier"], int(p["repeat"])) in blocks)}


def phase_throughputs(run: Any, *, blocks: Any = None) -> dict[str, dict[str, list[float | None]]]:
    """{tier: {arm: [window throughput per block, by repeat]}}: audio seconds per wall second,
    higher is better; None for an invalid phase. `run`: a RunDir or its path. What the verdict
    compares per block, exactly as it compares the blocks' RTF."""
    out: dict[str, dict[str, dict[int, float | None]]] = {}
    for (arm, tier, repeat), p in measured_phases(run, blocks=blocks).items():
        value = None if p.get("invalid_reason") else p.get("throughput")
        out.setdefault(tier, {}).setdefault(arm, {})[repeat] = value
    return {tier: {arm: [v for _, v in sorted(reps.items())] for arm, reps in arms.items()}
            for tier, arms in out.items()}


def window_throughputs(run: Any, *, blocks: Any = None) -> dict[tuple[str, str, int], float]:
    """(tier, arm, repeat) -> the window throughput of each valid duration-mode phase: the
    figures `tts_bench.ab.throughput.block_throughputs` prefers to its count-mode estimate from
    the requests (audio counted by chunk arrival inside the window, not by request)."""
    return {(tier, arm, repeat): float(p["throughput"]) for (arm, tier, repeat), p in measured_phases(run, blocks=blocks).items()
            if p.get("mode") == "duration" and not p.get("invalid_reason") and p.get("throughput")}


def complete_phase_ids(run_dir: Any) -> set[str]:
    """phase_id of every phase with a record (duration mode: a phase without one was cut short
    and is run again on --resume; its requests are not measured)."""
    return {p["phase_id"] for p in read_phases(run_dir)}
