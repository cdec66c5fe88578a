"""A/A calibration of a case: how often do identical arms read faster/slower, and how far do
whole runs move on this machine?

Each A/A is a real `tts-bench ab` run (`tts_bench.ab.run_ab`) of the case's resolved config
against itself, K blocks per tier (default 2) in counterbalanced order. Over N A/As:

- false verdicts: A/As whose RTF verdict was faster/slower at K blocks (t interval, K-1 df),
  with a Clopper-Pearson 95% interval; the same for TTFP and throughput, reported beside it;
- the block SD: sqrt(mean d^2) over all N*K block log ratios d (true d = 0 in an A/A), which is
  what a one-block `tts-bench ab` uses for its interval; its false-verdict rate is estimated
  leave-one-out (each block judged with the SD of all the others), so the figure is not
  flattered by judging a block with a spread it helped estimate;
- the phase SD: the SD of every phase's log center (median RTF and TTFP, mean throughput): the
  run-to-run movement `tts-bench gate` must not take for a regression.

    doc = run_calibration(load_case("configs/cases/synthetic.yaml"), runs=200, repeats=2,
                          profile="cpu-2core", result_dir=Path("/tmp/aa"))
    write_json_atomic(calibration_path("synthetic", "cpu-2core"), doc)
    calibrate_case("synthetic", runs=200, profile="cpu-2core")          # the command: both, and the .md
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import platform
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tts_bench.config.paths import check_writable
from tts_bench.config.paths import resolve_profile
from tts_bench.config.sut import sut_hash
from tts_bench.rundir.atomic_json import write_json_atomic
from tts_bench.ab import run_ab
from tts_bench.verdicts.calibration import CALIBRATION_FILE, DEFAULT_DIR, calibration_key, calibration_path
from tts_bench.config import apply_overrides, config_to_dict
from tts_bench.config.files import check_shared_sections
from tts_bench.errors import ExitStatus, InvalidRunError
from tts_bench.gate.bench import preflight_arms
from tts_bench.gate.case import LoadedCase, case_path, load_case, resolve_case
from tts_bench.gate.samples import METRICS, center
from tts_bench.rundir.records import RequestRecord, read_records
from tts_bench.rundir.provenance import load_avg, python_argv
from tts_bench.rundir.results import RunDir
from tts_bench.verdicts.stats import ALPHA, clopper_pearson, mde_log, pct, repeats_needed, t_quantile

log = logging.getLogger(__name__)

BLOCK_METRICS = ("audio_rtf", "audio_ttfp_ms", "audio_throughput")
REQUEST_METRICS = BLOCK_METRICS[:2]  # per-request values; throughput is one figure per phase
MDE_REPEATS = (1, 2, 4, 8)
EFFECTS_PCT = (2.0, 5.0, 10.0, 20.0)
CALLED = ("faster", "slower")


def _phases(records: Sequence[RequestRecord]) -> dict[tuple[str, int, str], list[RequestRecord]]:
    """Measured, successful requests per (tier, repeat, arm)."""
    out: dict[tuple[str, int, str], list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.ok and not r.warmup:
            out[(r.tier, r.repeat, r.arm)].append(r)
    return out


def run_observations(records: Sequence[RequestRecord], tier: str,
                     per_block: dict[str, dict[int, float]]) -> dict[str, Any]:
    """Per block log ratios (mean and median, per metric) and per phase log centers of one tier.
    `per_block`: the tier's throughput per arm and repeat as its verdict used them
    (`TierResult.block_throughputs`: measurement windows in duration mode)."""
    phases = _phases(records)
    repeats = sorted({k for (t, k, _) in phases if t == tier})
    blocks: dict[str, dict[str, list[float]]] = {m: {"mean": [], "median": []} for m in BLOCK_METRICS}
    centers: dict[str, list[float]] = {m: [] for m in ("audio_rtf", "audio_ttfp_ms", "audio_throughput")}
    for k in repeats:
        b, t = phases.get((tier, k, "base")), phases.get((tier, k, "test"))
        if not b or not t:
            continue
        for m in REQUEST_METRICS:
            bv, tv = np.array([getattr(r, m) for r in b]), np.array([getattr(r, m) for r in t])
            blocks[m]["mean"].append(math.log(tv.mean() / bv.mean()))
            blocks[m]["median"].append(math.log(np.median(tv) / np.median(bv)))
        if k in per_block.get("base", {}) and k in per_block.get("test", {}):  # one figure: mean = median
            d = math.log(per_block["test"][k] / per_block["base"][k])
            blocks["audio_throughput"]["mean"].append(d)
            blocks["audio_throughput"]["median"].append(d)
        for arm, recs in (("base", b), ("test", t)):
            for m in ("audio_rtf", "audio_ttfp_ms"):
                centers[m].append(math.log(center([getattr(r, m) for r in recs], METRICS[m].center)))
            thr = per_block.get(arm, {}).get(k)
            if thr:
                centers["audio_throughput"].append(math.log(thr))
    return {"blocks": blocks, "centers": centers}


def _rate(count: int, n: int) -> dict[str, Any]:
    lo, hi = clopper_pearson(count, n) if n else (None, None)  # JSON has no NaN
    return {"count": count, "of": n, "rate": count / n if n else None, "ci95": [lo, hi]}


def _one_block_rate(count: int | None, n: int) -> dict[str, Any]:
    return _rate(0, 0) if count is None else _rate(count, n)  # "n/a" in the tables


def loo_false_verdicts(d: np.ndarray, min_effect_pct: float, alpha: float = ALPHA) -> int | None:
    """One-block A/As judged with the calibrated SD of all *other* blocks: how many read
    faster/slower (|d| beyond the interval and at least the minimum effect). None below 3
    blocks: the others then hold one degree of freedom or none, and nothing was judged."""
    # d: [n] block log ratios of A/As
    n = d.size
    if n < 3:
        return None
    ss = float((d**2).sum())
    sd_loo = np.sqrt((ss - d**2) / (n - 1))
    half = t_quantile(1 - alpha / 2, n - 1) * sd_loo
    big = np.abs(np.expm1(d)) * 100.0 >= min_effect_pct
    return int(((np.abs(d) > half) & big).sum())


def _metric_doc(d_mean: np.ndarray, d_median: np.ndarray, min_effect_pct: float) -> dict[str, Any]:
    n = int(d_mean.size)
    sd_mean = float(np.sqrt((d_mean**2).mean())) if n else float("nan")
    sd_median = float(np.sqrt((d_median**2).mean())) if n else float("nan")
    return {
        "sd_mean": sd_mean, "sd_median": sd_median, "df": n, "sd_mean_pct": pct(sd_mean),
        "max_abs_block_delta_pct": float(np.abs(np.expm1(d_mean)).max() * 100.0) if n else None,
        "false_verdicts_one_block": _one_block_rate(loo_false_verdicts(d_mean, min_effect_pct), n),
        "mde_pct": {str(k): pct(mde_log(sd_mean, k, n if k == 1 else k - 1)) for k in MDE_REPEATS},
        "repeats_needed": {f"{e:g}": repeats_needed(e, sd_mean) for e in EFFECTS_PCT},
    }


def _tier_doc(tier: str, obs: list[dict[str, Any]], verdicts: list[dict[str, Any]],
              min_effect_pct: float) -> dict[str, Any]:
    metrics = {}
    for m in BLOCK_METRICS:
        d_mean = np.array([x for o in obs for x in o["blocks"][m]["mean"]])
        d_median = np.array([x for o in obs for x in o["blocks"][m]["median"]])
        called = sum(v[m] in CALLED for v in verdicts)
        metrics[m] = {**_metric_doc(d_mean, d_median, min_effect_pct),
                      "false_verdicts": _rate(called, len(verdicts))}
    centers = {m: np.array([x for o in obs for x in o["centers"][m]]) for m in obs[0]["centers"]}
    phase_sd = {m: float(c.std(ddof=1)) for m, c in centers.items() if c.size > 1}
    n_phases = max((c.size for c in centers.values()), default=0)
    return {"metrics": metrics, "phase_sd": phase_sd, "phase_df": max(n_phases - 1, 0)}


def _arms(rc, test_sets: Sequence[str]) -> dict[str, Any]:
    arms = {"base": rc.config, "test": apply_overrides(rc.config, test_sets, source="--test-set")}
    # ab's own check: an A/A reads bench.* (tiers, prompts, repeats) from the base arm, so a
    # --test-set there would be recorded and never run.
    check_shared_sections(arms, "tts-bench calibrate")
    return arms


def run_calibration(
    loaded: LoadedCase, *, runs: int, repeats: int = 2, profile: str, result_dir: Path,
    sets: Sequence[str] = (), test_sets: Sequence[str] = (),
    on_run: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """N A/As of the case (K blocks each); the calibration document (see the module docstring).

    `test_sets` perturb the test arm: an A/B posing as an A/A, to check that a check can fail."""
    if runs < 1 or repeats < 1:
        raise ValueError(f"runs and repeats must be >= 1, got {runs} and {repeats}")
    rc = resolve_case(loaded, sets)
    arms = _arms(rc, test_sets)
    bench = rc.config.bench
    tiers = preflight_arms(arms)  # before the first A/A's run directory exists
    rows, obs = [], defaultdict(list)
    t0 = time.perf_counter()
    for i in range(runs):
        load_before, t_run = load_avg(), time.perf_counter()
        run = RunDir.create(result_dir, "ab", command_line=python_argv(),
                            configs={n: config_to_dict(c) for n, c in arms.items()},
                            extra={"ab": {"tiers": [t.label for t in tiers], "repeats": repeats,
                                          "num_prompts": bench.num_prompts, "calibration_run": i}})
        with run.finishing():  # as `ab` records it: complete / invalid, or failed / interrupted
            result = run_ab(arms, tiers, repeats=repeats, num_prompts=bench.num_prompts, run_dir=run)
            run.update(status="complete" if result.valid else "invalid", result=result.to_dict())
        records = read_records(run)
        for t in result.tiers:
            if t.invalid_reasons or t.rtf is None or t.ttfp is None:
                continue
            obs[t.tier].append({**run_observations(records, t.tier, t.block_throughputs),
                                "verdicts": {"audio_rtf": t.rtf.verdict, "audio_ttfp_ms": t.ttfp.verdict,
                                             "audio_throughput": t.throughput.verdict if t.throughput else None}})
        row = {"run": i, "dir": run.path.name, "valid": result.valid, "wall_s": round(time.perf_counter() - t_run, 2),
               "load_before": load_before, "load_after": load_avg(),
               "tiers": {t.tier: {"verdict": t.rtf.verdict if t.rtf else None,
                                  "ttfp_verdict": t.ttfp.verdict if t.ttfp else None,
                                  "throughput_verdict": t.throughput.verdict if t.throughput else None,
                                  "delta_pct": t.rtf.delta_mean_pct if t.rtf else None,
                                  "ci95_pct": list(t.rtf.ci95_pct) if t.rtf and t.rtf.ci95_pct else None,
                                  "block_deltas_pct": list(t.rtf.block_deltas_pct) if t.rtf else []}
                         for t in result.tiers}}
        rows.append(row)
        if on_run is not None:
            on_run(i, row)
    return _document(loaded, rc, profile=profile, repeats=repeats, rows=rows, obs=obs, test_sets=test_sets,
                     wall_s=time.perf_counter() - t0)


def _document(loaded, rc, *, profile, repeats, rows, obs, test_sets, wall_s) -> dict[str, Any]:
    bench = rc.config.bench
    if not obs:
        raise InvalidRunError(f"error: none of the {len(rows)} A/A runs of {loaded.case.name} was valid "
                              f"(tts-bench calibrate); check the runs' failures")
    tiers = {tier: _tier_doc(tier, o, [x["verdicts"] for x in o], bench.min_effect_pct) for tier, o in obs.items()}
    valid = [r for r in rows if r["valid"]]
    called = sum(any(t["verdict"] in CALLED for t in r["tiers"].values()) for r in valid)
    loads = [x[0] for r in rows for x in (r["load_before"], r["load_after"]) if x]
    return {
        **CALIBRATION_FILE.stamp(),
        "case": loaded.case.name, "case_file": str(loaded.path), "profile": profile,
        "key": calibration_key(config_to_dict(rc.config), num_prompts=bench.num_prompts),
        # What `tts-bench gate` matches against its baseline's sut_hash (judging-only --set values,
        # such as bench.min_effect_pct, leave it unchanged); none for a perturbed test arm.
        "sut_hash": None if test_sets else sut_hash(config_to_dict(rc.config)), "extra_sets": list(rc.extra_sets),
        "test_sets": list(test_sets), "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command_line": python_argv(), "runs": len(rows), "valid_runs": len(valid), "repeats": repeats,
        "tiers_run": list(bench.tiers), "num_prompts": bench.num_prompts, "min_effect_pct": bench.min_effect_pct,
        "alpha": ALPHA, "false_verdicts": _rate(called, len(valid)),
        "environment": {"cpu_count": os.cpu_count(), "load_1min_min": min(loads, default=None),
                        "load_1min_max": max(loads, default=None),
                        "load_1min_mean": round(float(np.mean(loads)), 2) if loads else None},
        # What a run must match to use this calibration (tts_bench.verdicts.calibration: refused otherwise).
        "conditions": {"load_1min_max": max(loads, default=None), "cpu_count": os.cpu_count(),
                       "machine": platform.machine() or None, "profile": profile,
                       "tiers": list(bench.tiers), "num_prompts": bench.num_prompts},
        "wall_s": round(wall_s, 1), "tiers": tiers, "rows": rows,
    }


def _fmt_rate(r: dict[str, Any]) -> str:
    if not r["of"]:
        return "n/a"
    lo, hi = r["ci95"]
    return f"{r['count']}/{r['of']} = {100 * r['rate']:.1f}% [{100 * lo:.1f}%, {100 * hi:.1f}%]"


def to_markdown(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    lines = [f"**A/A calibration: {doc['case']} on {doc['profile']}** ({doc['runs']} A/As x {doc['repeats']} "
             f"repeats, tiers {', '.join(doc['tiers_run'])}, {doc['num_prompts']} prompts, min effect "
             f"{doc['min_effect_pct']:g}%, {doc['wall_s']:.0f} s; `{' '.join(doc['command_line'][1:])}`)", "",
             f"false verdicts (audio RTF faster/slower in an A/A, any tier) at {doc['repeats']} repeats: "
             f"{_fmt_rate(doc['false_verdicts'])} (Clopper-Pearson 95%)", "",
             "| tier | metric | false verdicts at K | false verdicts, 1 repeat + calibrated SD (leave-one-out) "
             "| block SD | max abs block delta | MDE at 1 / 2 / 4 / 8 repeats | phase SD |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for tier, t in doc["tiers"].items():
        for m, d in t["metrics"].items():
            mde = " / ".join(f"{d['mde_pct'][str(k)]:.1f}%" for k in MDE_REPEATS)
            lines.append(f"| {tier} | {m} | {_fmt_rate(d['false_verdicts'])} | "
                         f"{_fmt_rate(d['false_verdicts_one_block'])} | {d['sd_mean_pct']:.2f}% | "
                         f"{d['max_abs_block_delta_pct']:.1f}% | {mde} | {pct(t['phase_sd'].get(m, float('nan'))):.1f}% |")
    lines += ["", "repeats needed (even, t with K-1 df, 80% power, two-sided alpha 0.05) at the measured "
                  "block SD of audio RTF:", "",
              "| tier | " + " | ".join(f"{e:g}% effect" for e in EFFECTS_PCT) + " |",
              "| --- | " + " | ".join("---" for _ in EFFECTS_PCT) + " |"]
    for tier, t in doc["tiers"].items():
        need = t["metrics"]["audio_rtf"]["repeats_needed"]
        lines.append(f"| {tier} | " + " | ".join(str(need[f"{e:g}"] or "> 1000") for e in EFFECTS_PCT) + " |")
    lines += ["", f"load average (1 min) around the runs: min {env['load_1min_min']}, mean "
                  f"{env['load_1min_mean']}, max {env['load_1min_max']} on {env['cpu_count']} CPUs"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Calibrated:
    """A finished `tts-bench calibrate`: the document, its markdown, where it was written."""

    doc: dict[str, Any]
    markdown: str
    written: Path | None  # the .json (the .md beside it); None with write=False

    @property
    def false_verdicts(self) -> int:
        return int(self.doc["false_verdicts"]["count"])

    def exit_status(self, *, fail_on_false_verdict: bool = False) -> ExitStatus:
        """3 when asked to fail on an A/A that read faster/slower, else 0, or 5 when some A/A
        was not valid."""
        if fail_on_false_verdict and self.false_verdicts:
            return ExitStatus.PERF_REGRESSION
        return ExitStatus.OK if self.doc["valid_runs"] == self.doc["runs"] else ExitStatus.INVALID_RUN


def calibrate_case(
    case: str | Path, *, runs: int, repeats: int = 2, profile: str | None = None, sets: Sequence[str] = (),
    test_sets: Sequence[str] = (), out: Path = DEFAULT_DIR, write: bool = True, result_dir: Path | None = None,
    on_run: Callable[[int, dict[str, Any]], None] | None = None,
) -> Calibrated:
    """`tts-bench calibrate` as one call: the case (a file, or a name under configs/cases/),
    `runs` A/As (run directories in `result_dir`, default a temporary one), and, with `write`,
    `<out>/<case>.<profile>.calibration.json` and `.md`."""
    loaded = load_case(case_path(case))
    profile = resolve_profile(profile)
    if write:  # before the A/As: a bad --out found after them would lose them all
        target = calibration_path(loaded.case.name, profile, out)
        check_writable(out, flag="--out", directory=True)
        for path in (target, target.with_suffix(".md")):
            check_writable(path, flag="--out", directory=False)
    if result_dir is not None:
        check_writable(result_dir, flag="--result-dir", directory=True)
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        doc = run_calibration(loaded, runs=runs, repeats=repeats, profile=profile,
                              result_dir=result_dir or Path(tmp), sets=sets, test_sets=test_sets, on_run=on_run)
    md = to_markdown(doc)
    if not write:
        return Calibrated(doc, md, None)
    path = write_json_atomic(calibration_path(doc["case"], profile, out), doc)
    path.with_suffix(".md").write_text(md, encoding="utf-8")  # <case>.<profile>.calibration.md
    return Calibrated(doc, md, path)
