"""Perf baselines: built from N clean runs of a case, with provenance and dispersion.

A baseline file `results/baselines/<case>.<profile>.json` is reviewed and committed. It holds:
the case, hardware profile, backend and system-under-test hash the runs were made with; the
commit(s), creation date and run count; and per tier and metric the per-request samples pooled
from every run, the center of the pool, each run's own center and the std of those (run-to-run
dispersion, the number to look at before tightening a threshold).

`build_baseline` refuses runs with failed or missing requests and runs whose provenance differs
(another case, backend, profile, config, or extra overrides): a baseline averaged over a broken
night is how gates start crying wolf. `--tighten-only` keeps the old file unless the new
baseline is faster on `audio_rtf` in every tier.

    base = build_baseline(loaded_case, [read_run(p, profile="cpu-2core") for p in paths],
                          profile="cpu-2core", sut="3fa9c10b22aa")
    decision = write_baseline(base, path, tighten_only=True)
    decision = update_baseline(Path("configs/cases/synthetic.yaml"), run=3)   # the command
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tts_bench.config.paths import check_writable
from tts_bench.config.paths import resolve_profile
from tts_bench.config.sut import sut_hash
from tts_bench.rundir.atomic_json import write_json_atomic
from tts_bench.rundir.versioned_json import VersionedJson
from tts_bench.config import config_to_dict
from tts_bench.errors import ConfigError, InvalidRunError
from tts_bench.gate import case as cases
from tts_bench.gate.bench import run_case
from tts_bench.gate.samples import METRICS, RunSamples, center, read_run
from tts_bench.rundir.provenance import load_avg

BASELINE_VERSION = 1
BASELINE_FILE = VersionedJson(
    "baseline", "baseline_version", BASELINE_VERSION, flag="--baseline",
    record_hint="record one with tts-bench baseline update --case <case> --from <run dirs>",
    stale_hint="re-record it",
)
# The same format, read as the file `baseline update --tighten-only` would replace: errors name --out.
_OUT_FILE = dataclasses.replace(BASELINE_FILE, flag="--out")
PRIMARY_METRIC = "audio_rtf"


def _refuse(what: str, fix: str) -> InvalidRunError:
    return InvalidRunError(f"error: {what} (baseline update); {fix}")


def check_clean(rs: RunSamples) -> None:
    """A run may feed a baseline only if every planned request succeeded and every sample is a
    number (a NaN would become the center, and every later gate would crash or pass on it)."""
    for tier, t in rs.tiers.items():
        for name in t.samples:
            bad = t.non_finite(name)
            if bad:
                raise _refuse(f"{rs.path} has {bad} non-finite {name} samples in tier {tier}",
                              "its records are damaged; use another run")
        if t.failed:
            raise _refuse(f"{rs.path} has {t.failed} failed requests in tier {tier} ({t.failed_by_kind})",
                          "fix the failures and rerun; a baseline is never built from a broken run")
        if t.completed < t.expected or not t.completed:
            raise _refuse(f"{rs.path} tier {tier} has {t.completed} of {t.expected} requests",
                          "the run was cut short; rerun it (or --resume it) before using it")


def check_same_provenance(runs: Sequence[RunSamples], *, case: str, profile: str, sut: str) -> None:
    for rs in runs:
        p = rs.provenance
        problems = []
        if p.case not in (None, case):
            problems.append(f"case {p.case!r} != {case!r}")
        if p.profile not in (None, profile):
            problems.append(f"profile {p.profile!r} != {profile!r}")
        if p.sut_hash != sut or p.run_sut_hash != sut:
            problems.append(f"config hash {p.run_sut_hash} != the case's {sut}")
        if p.extra_sets:
            problems.append(f"extra overrides {list(p.extra_sets)}")
        if problems:
            raise _refuse(f"{rs.path} does not match the case: {'; '.join(problems)}",
                          "build a baseline only from unmodified runs of this case on this profile")
    tiers = {tuple(rs.tiers) for rs in runs}
    if len(tiers) != 1:
        raise _refuse(f"the runs cover different tiers {sorted(tiers)}", "use runs of one case plan")


def _metric_doc(name: str, runs: Sequence[RunSamples], tier: str) -> dict[str, Any] | None:
    spec = METRICS[name]
    per_run = [rs.tiers[tier].samples.get(name, []) for rs in runs]
    if not all(per_run):
        return None  # e.g. memory not recorded in some run: not part of the baseline
    pooled = [v for vals in per_run for v in vals]
    centers = [center(v, spec.center) for v in per_run]
    return {
        "better": spec.better, "statistic": spec.center, "center": center(pooled, spec.center),
        "per_run": centers, "per_run_std": float(np.std(centers, ddof=1)) if len(centers) > 1 else 0.0,
        "n": len(pooled), "samples": pooled,
    }


def build_baseline(runs: Sequence[RunSamples], *, case: str, profile: str, sut: str) -> dict[str, Any]:
    """The baseline document from N clean runs of one case (see the module docstring)."""
    if not runs:
        raise ConfigError("error: no runs given (baseline update --from); pass one or more run directories")
    paths = [Path(rs.path).resolve() for rs in runs]
    if len(set(paths)) != len(paths):
        twice = sorted({str(p) for p in paths if paths.count(p) > 1})
        raise ConfigError(f"error: run {', '.join(twice)} given more than once (baseline update --from); "
                          f"each run counts once in the run-to-run dispersion")
    for rs in runs:
        check_clean(rs)
    check_same_provenance(runs, case=case, profile=profile, sut=sut)
    shas = sorted({str(rs.provenance.git_sha) for rs in runs})
    tiers = {}
    for tier in runs[0].tiers:
        metrics = {m: _metric_doc(m, runs, tier) for m in METRICS}
        tiers[tier] = {m: d for m, d in metrics.items() if d is not None}
    return {
        **BASELINE_FILE.stamp(),
        "case": case, "profile": profile, "backend": runs[0].provenance.backend, "sut_hash": sut,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": shas[0] if len(shas) == 1 else shas,
        "dirty": any(bool(rs.provenance.git_dirty) for rs in runs),
        "n_runs": len(runs),
        "runs": [{"run": Path(rs.path).name, "created": rs.provenance.created,
                  "git_sha": rs.provenance.git_sha} for rs in runs],
        "environment": {"cpu_count": runs[0].provenance.cpu_count, "load_avg": load_avg()},
        "tiers": tiers,
    }


def load_baseline(path: Path | str) -> dict[str, Any]:
    return _load(path, BASELINE_FILE)


def _load(path: Path | str, fmt: VersionedJson) -> dict[str, Any]:
    doc = fmt.load(path)
    problem = baseline_problem(doc)
    if problem:
        raise ConfigError(f"error: {path} is not a usable baseline: {problem} ({fmt.flag}); re-record it with "
                          f"tts-bench baseline update")
    return doc


def baseline_problem(doc: dict[str, Any]) -> str | None:
    """What makes `doc` unusable as a gate's reference (None when nothing does): a gate over no
    tiers passes everything, and a non-positive or non-finite center makes every delta inf/NaN."""
    tiers = doc.get("tiers")
    if not isinstance(tiers, dict) or not tiers:
        return "it has no tiers"
    for tier, metrics in tiers.items():
        if not isinstance(metrics, dict) or not metrics:
            return f"tier {tier!r} has no metrics"
        for name, m in metrics.items():
            if not isinstance(m, dict):
                return f"{tier} {name} is not an object"
            if m.get("better") not in ("lower", "higher"):
                return f"{tier} {name}: better is {m.get('better')!r}, not lower or higher"
            c = m.get("center")
            if not _finite(c) or c <= 0:
                return f"{tier} {name}: center {c!r} is not a positive number"
            samples = m.get("samples")
            if not isinstance(samples, list) or not samples or not all(map(_finite, samples)):
                return f"{tier} {name}: samples must be a non-empty list of finite numbers"
    return None


def _finite(v: Any) -> bool:
    # math, not numpy: np.isfinite refuses an int above 2**64 (TypeError) instead of answering
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_faster(new: dict[str, Any], old: dict[str, Any], metric: str = PRIMARY_METRIC) -> bool:
    """True when `new` beats `old` on `metric` (direction-aware) in every tier of `old`."""
    for tier, metrics in old.get("tiers", {}).items():
        o, n = metrics.get(metric), new.get("tiers", {}).get(tier, {}).get(metric)
        if o is None or n is None:
            return False
        better = n["center"] < o["center"] if o["better"] == "lower" else n["center"] > o["center"]
        if not better:
            return False
    return True


@dataclass(frozen=True)
class UpdateDecision:
    written: bool
    path: Path
    reason: str


def write_baseline(doc: dict[str, Any], path: Path | str, *, tighten_only: bool = False) -> UpdateDecision:
    """Write `doc` atomically; with `tighten_only` only when it is faster than the file there."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"error: {path} is a directory (baseline update --out); name the JSON file to write")
    if tighten_only and path.is_file():
        old = load_baseline(path)
        if old.get("sut_hash") != doc["sut_hash"] or old.get("backend") != doc["backend"]:
            raise ConfigError(f"error: {path} was recorded for another config ({old.get('sut_hash')} vs "
                              f"{doc['sut_hash']}) (--tighten-only); drop --tighten-only to replace it")
        if not is_faster(doc, old):
            return UpdateDecision(False, path, f"kept {path}: the new runs are not faster on "
                                               f"{PRIMARY_METRIC} in every tier")
    write_json_atomic(path, doc)
    return UpdateDecision(True, path, f"wrote {path} ({doc['n_runs']} runs)")


def update_baseline(
    case: Path, *, runs_from: Sequence[Path] = (), run: int = 0, profile: str | None = None,
    tighten_only: bool = False, out: Path | None = None, result_dir: Path = Path("results/runs"),
    on_run: Callable[[int, Path], None] | None = None,
) -> UpdateDecision:
    """`tts-bench baseline update` as one call: run the case `run` times (each run directory is
    passed to `on_run(i, path)` as it finishes), add `runs_from`, build the baseline from all of
    them and write it (default: results/baselines/<case>.<profile>.json)."""
    loaded = cases.load_case(case)
    profile = resolve_profile(profile)
    if not runs_from and run < 1:
        raise ConfigError("error: no runs given (baseline update --from); pass run directories made by "
                          "tts-bench gate --run-case, or --run N")
    resolved = cases.resolve_case(loaded)  # once: it reads the case's config file
    out = Path(out or cases.baseline_path(loaded.case, profile))
    sut = sut_hash(config_to_dict(resolved.case_config))
    _check_out(out, tighten_only=tighten_only, sut=sut, backend=resolved.case_config.backend)
    if run:
        check_writable(result_dir, flag="--result-dir", directory=True)
    samples = [read_run(p, profile=profile) for p in runs_from]  # a bad --from fails before the runs
    for i in range(run):
        made = run_case(resolved, profile=profile, result_dir=result_dir).path
        if on_run is not None:
            on_run(i, made)
        samples.append(read_run(made, profile=profile))
    doc = build_baseline(samples, case=loaded.case.name, profile=profile, sut=sut)
    doc["case_file"] = str(case)  # lets `gate --current <ab run>` find the thresholds
    return write_baseline(doc, out, tighten_only=tighten_only)


def _check_out(out: Path, *, tighten_only: bool, sut: str, backend: str) -> None:
    """Before any run: `--out` can be written and, with --tighten-only, the file there is a
    baseline of this config (what `write_baseline` would refuse after the runs)."""
    check_writable(out, flag="--out", directory=False)
    if not (tighten_only and out.is_file()):
        return
    old = _load(out, _OUT_FILE)
    if old.get("sut_hash") != sut or old.get("backend") != backend:
        raise ConfigError(f"error: {out} was recorded for another config ({old.get('sut_hash')} vs {sut}) "
                          f"(--out, --tighten-only); drop --tighten-only to replace it")
