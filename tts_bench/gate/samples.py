"""What the gate reads from a run directory: per-tier metric samples and the run's provenance.

Works on runs made by `tts-bench gate --run-case` (kind `case`, one arm) and on `tts-bench ab`
runs (pick the arm with `arm=`; default: the test arm). Metrics, their samples and direction:

| metric | samples | center | better |
|---|---|---|---|
| `audio_rtf` | one per successful measured request | median | lower |
| `audio_ttfp_ms` | one per successful measured request | median | lower |
| `audio_throughput` | one per measured phase (repeat): audio s / wall s | mean | higher |
| `steady_mem_mib` | memory samples after warmup (first sampler), when recorded | median | lower |
| `peak_mem_mib` | one per phase: its peak, when recorded | mean | lower |

Provenance is what makes two runs comparable: the case, backend, hardware profile and the
*system-under-test hash* (`sut_hash`): a hash of the resolved config's values that differ from
the schema defaults, leaving out the sections that do not change what is measured (`wer`, `mem`)
and the judging-only bench keys. Hashing only non-default values keeps baselines valid when a
new config field (with its default) is added to the schema.

    rs = read_run(Path("results/runs/20261129-201500-case-3fa9c1"))
    rs.tiers["2x1"].samples["audio_rtf"], rs.provenance.sut_hash
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tts_bench.config import parse_tier
from tts_bench.config.sut import sut_hash
from tts_bench.errors import ConfigError
from tts_bench.rundir.records import RequestRecord, read_records
from tts_bench.rundir.results import RunDir

Direction = Literal["lower", "higher"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    better: Direction
    center: Literal["median", "mean"]
    unit: str


METRICS: dict[str, MetricSpec] = {
    m.name: m
    for m in (
        MetricSpec("audio_rtf", "lower", "median", ""),
        MetricSpec("audio_ttfp_ms", "lower", "median", "ms"),
        MetricSpec("audio_throughput", "higher", "mean", "audio s/s"),
        MetricSpec("steady_mem_mib", "lower", "median", "MiB"),
        MetricSpec("peak_mem_mib", "lower", "mean", "MiB"),
    )
}



def center(values: np.ndarray | list[float], how: str) -> float:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.median(arr) if how == "median" else arr.mean())


@dataclass(frozen=True)
class Provenance:
    case: str | None
    profile: str | None
    backend: str
    sut_hash: str  # of the case's config (what a baseline must match)
    run_sut_hash: str  # of the config actually run (differs when extra overrides were given)
    extra_sets: tuple[str, ...]
    git_sha: str | None
    git_dirty: bool | None
    created: str
    cpu_count: int | None

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass
class TierSamples:
    expected: int  # measured requests the plan asked for
    completed: int = 0
    failed: int = 0
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    phases: int = 0  # measured phases (repeats) with successful requests

    def non_finite(self, metric: str) -> int:
        """How many of `metric`'s samples are NaN or inf (damaged records: no statistic holds them)."""
        return sum(not math.isfinite(v) for v in self.samples.get(metric, ()))


@dataclass(frozen=True)
class RunSamples:
    path: str
    arm: str
    provenance: Provenance
    tiers: dict[str, TierSamples]


def _pick_arm(doc: dict[str, Any], arm: str | None, path: Path) -> str:
    arms = list(doc.get("configs", {}))
    if not arms:
        raise ConfigError(f"error: {path}/run.json records no configs (--current); pass a run made by "
                          f"tts-bench gate --run-case or tts-bench ab")
    if arm is None:
        return arms[-1]  # a case run has one arm; an A/B's second arm is its test arm
    if arm not in arms:
        raise ConfigError(f"error: arm {arm!r} not in {path} (--arm); valid: {', '.join(arms)}")
    return arm


def _plan(doc: dict[str, Any], config: dict[str, Any]) -> dict[str, int]:
    """Planned measured requests per tier (over all repeats)."""
    plan = (doc.get("case") or {}).get("plan") or doc.get("ab") or {}
    if plan.get("per_tier"):
        return {str(t): int(n) for t, n in plan["per_tier"].items()}
    bench = config.get("bench", {})
    tiers = list(plan.get("tiers") or bench.get("tiers") or [])
    repeats = int(plan.get("repeats", bench.get("repeats", 1)))
    per_client = bench.get("prompts_per_client")  # K*C prompts per tier CxR (tts-bench ab)
    num = int(plan.get("num_prompts", bench.get("num_prompts", 0)))
    return {t: (int(per_client) * parse_tier(t).concurrency if per_client else num) * repeats
            for t in tiers}


def _provenance(doc: dict[str, Any], arm: str, profile: str | None) -> Provenance:
    config = doc["configs"][arm]
    case = doc.get("case") or {}
    env = doc.get("environment", {})
    run_hash = sut_hash(config)
    return Provenance(
        case=case.get("name"), profile=case.get("profile") or profile,
        backend=str(config.get("backend")), sut_hash=case.get("sut_hash") or run_hash,
        run_sut_hash=run_hash, extra_sets=tuple(case.get("extra_sets") or ()),
        git_sha=env.get("git_sha"), git_dirty=env.get("git_dirty"),
        created=str(doc.get("created")), cpu_count=env.get("cpu_count"),
    )


def _request_samples(records: list[RequestRecord], tiers: dict[str, TierSamples]) -> None:
    phases: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for r in records:
        t = tiers.get(r.tier)
        if t is None:
            continue
        if not r.ok:
            t.failed += 1
            t.failed_by_kind[str(r.failure_kind)] = t.failed_by_kind.get(str(r.failure_kind), 0) + 1
            continue
        t.completed += 1
        t.samples.setdefault("audio_rtf", []).append(float(r.audio_rtf))
        t.samples.setdefault("audio_ttfp_ms", []).append(float(r.audio_ttfp_ms))
        phases[(r.tier, r.phase_id)].append(r)
    for (tier, _), recs in phases.items():
        tiers[tier].phases += 1
        wall = max(r.t_end_s for r in recs) - min(r.t_send_s for r in recs)
        if wall > 0:
            tiers[tier].samples.setdefault("audio_throughput", []).append(
                sum(r.audio_seconds for r in recs) / wall)


def _mem_samples(doc: dict[str, Any], arm: str, tiers: dict[str, TierSamples]) -> None:
    """First sampler's memory per tier (summaries are labelled `2x1` or `2x1 r1`)."""
    sampler = None
    for s in (doc.get("mem") or {}).get("tiers", []):
        a = s.get("arms", {}).get(arm)
        tier = str(s.get("tier", "")).split(" ")[0]
        if a is None or tier not in tiers or sampler not in (None, s.get("sampler")):
            continue
        sampler = s.get("sampler")
        steady = [x["used_mib"] for x in a.get("samples", [])
                  if x.get("phase") == "measure" and x.get("used_mib") is not None]
        tiers[tier].samples.setdefault("steady_mem_mib", []).extend(steady)
        if a.get("peak_mib") is not None:
            tiers[tier].samples.setdefault("peak_mem_mib", []).append(float(a["peak_mib"]))


def read_run(path: Path | str | RunDir, *, arm: str | None = None, profile: str | None = None) -> RunSamples:
    """Samples and provenance of one arm of a recorded run (see the module docstring); `path`
    may be a RunDir the caller already holds (its run.json is not read again)."""
    run = path if isinstance(path, RunDir) else RunDir.open(path)
    doc = run.doc
    name = _pick_arm(doc, arm, run.path)
    tiers = {t: TierSamples(expected=n) for t, n in _plan(doc, doc["configs"][name]).items()}
    records = read_records(run)
    _request_samples([r for r in records if r.arm == name and not r.warmup], tiers)
    _mem_samples(doc, name, tiers)
    return RunSamples(str(run.path), name, _provenance(doc, name, profile), tiers)
