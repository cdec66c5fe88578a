"""A/A calibration of the perf gate: how often does it cry wolf on this machine?

For each case: run it B times and build a baseline (as `tts-bench baseline update` does), then
run it K more times unchanged and gate every run against that baseline. Every `worse` mark is a
false positive by construction. The false-positive rate is reported at the case's thresholds and
over a grid of thresholds, per metric and for the whole gate (a run fails if any metric is
`worse`), with the largest A/A shift seen per metric, so thresholds can be set from data. The
load average is recorded before and after each run (shared CI machines are noisy).

    PYTHONPATH=. python scripts/calibrate_gate.py --case configs/cases/synthetic.yaml \
        --case configs/cases/tiny-embedded.yaml --k 20 --baseline-runs 3 --profile cpu-2core \
        --out results/baselines [--write-baseline]

Writes `<out>/<case>.<profile>.calibration.json` and `.md` per case, and prints the tables. The
last stdout line is one JSON document with the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tts_bench.config import config_to_dict  # noqa: E402
from tts_bench.gate.baseline import build_baseline, write_baseline  # noqa: E402
from tts_bench.gate.bench import run_case  # noqa: E402
from tts_bench.gate.case import load_case, resolve_case  # noqa: E402
from tts_bench.gate.judge import judge, mark_for  # noqa: E402
from tts_bench.gate.samples import read_run, sut_hash  # noqa: E402

GRID = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 60.0, 80.0, 100.0)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _timed_run(rc, profile: str, result_dir: Path) -> tuple[Path, dict]:
    before, t0 = _load(), time.perf_counter()
    run = run_case(rc, profile=profile, result_dir=result_dir)
    return run.path, {"run": run.path.name, "wall_s": round(time.perf_counter() - t0, 2),
                      "load_before": before, "load_after": _load()}


def _fp_table(rows: list[dict], alpha: float) -> dict:
    """FP rate per threshold (grid), per metric and for the gate as a whole (any metric)."""
    runs = sorted({r["i"] for r in rows})
    metrics = sorted({r["metric"] for r in rows})
    out = {}
    for thr in GRID:
        bad = {m: set() for m in metrics}
        for r in rows:
            if mark_for(r["worse_pct"], thr, r["p_value"], alpha) == "worse":
                bad[r["metric"]].add(r["i"])
        out[f"{thr:g}"] = {**{m: len(b) / len(runs) for m, b in bad.items()},
                           "any": len(set().union(*bad.values())) / len(runs)}
    return out


def calibrate(case_path: Path, *, k: int, baseline_runs: int, profile: str, result_dir: Path,
              baseline_out: Path | None = None) -> dict:
    loaded = load_case(case_path)
    case = loaded.case
    rc = resolve_case(loaded)
    sut = sut_hash(config_to_dict(rc.case_config))
    t0 = time.perf_counter()
    runs_meta, base_paths = [], []
    for _ in range(baseline_runs):
        path, meta = _timed_run(rc, profile, result_dir)
        base_paths.append(path)
        runs_meta.append({**meta, "role": "baseline"})
    baseline = build_baseline([read_run(p, profile=profile) for p in base_paths],
                              case=case.name, profile=profile, sut=sut)
    if baseline_out is not None:  # the calibration's baseline doubles as the committed one
        write_baseline({**baseline, "case_file": str(case_path)},
                       baseline_out / f"{case.name}.{profile}.json")
    rows, exits = [], []
    for i in range(k):
        path, meta = _timed_run(rc, profile, result_dir)
        report = judge(baseline, read_run(path, profile=profile), case.thresholds,
                       alpha=case.alpha, min_samples=case.min_samples)
        exits.append(int(report.exit_status()))
        runs_meta.append({**meta, "role": "current", "exit": exits[-1],
                          "invalid": report.invalid_reasons})
        for r in report.rows:
            worse = r.delta_pct if r.better == "lower" else -r.delta_pct
            rows.append({"i": i, "tier": r.tier, "metric": r.metric, "delta_pct": r.delta_pct,
                         "worse_pct": worse, "p_value": r.p_value, "mark": r.mark})
    per_metric = {}
    for m in sorted({r["metric"] for r in rows}):
        w = np.array([r["worse_pct"] for r in rows if r["metric"] == m])
        p = np.array([r["p_value"] for r in rows if r["metric"] == m])
        per_metric[m] = {"threshold": case.thresholds.get(m), "max_abs_shift_pct": float(np.abs(w).max()),
                         "p95_abs_shift_pct": float(np.percentile(np.abs(w), 95)),
                         "std_shift_pct": float(w.std(ddof=1)) if w.size > 1 else 0.0,
                         "frac_p_below_alpha": float((p < case.alpha).mean())}
    return {
        "case": case.name, "case_file": str(case_path), "profile": profile, "k": k,
        "baseline_runs": baseline_runs, "alpha": case.alpha,
        "false_positive_runs": sum(e == 3 for e in exits), "invalid_runs": sum(e == 5 for e in exits),
        "false_positive_rate": sum(e == 3 for e in exits) / k,
        "per_metric": per_metric, "fp_rate_by_threshold": _fp_table(rows, case.alpha),
        "baseline_dispersion": {t: {m: {"per_run": d["per_run"], "per_run_std": d["per_run_std"]}
                                    for m, d in ms.items()} for t, ms in baseline["tiers"].items()},
        "wall_s": round(time.perf_counter() - t0, 1), "cpu_count": os.cpu_count(), "runs": runs_meta,
        "rows": rows,
    }


def to_markdown(doc: dict) -> str:
    metrics = list(doc["per_metric"])
    lines = [f"**A/A calibration: {doc['case']} on {doc['profile']}** (K={doc['k']} runs vs a baseline "
             f"of {doc['baseline_runs']}, alpha={doc['alpha']:g}, {doc['wall_s']:.0f} s)", "",
             f"false positives at the case thresholds: {doc['false_positive_runs']}/{doc['k']} "
             f"({100 * doc['false_positive_rate']:.0f}%), invalid runs: {doc['invalid_runs']}", "",
             "| metric | threshold | max A/A shift | p95 A/A shift | std of shift | runs with p < alpha |",
             "| --- | --- | --- | --- | --- | --- |"]
    for m, d in doc["per_metric"].items():
        thr = "n/a" if d["threshold"] is None else f"{d['threshold']:g}%"
        lines.append(f"| {m} | {thr} | {d['max_abs_shift_pct']:.1f}% | {d['p95_abs_shift_pct']:.1f}% | "
                     f"{d['std_shift_pct']:.1f}% | {100 * d['frac_p_below_alpha']:.0f}% |")
    lines += ["", "| threshold | " + " | ".join(metrics) + " | any |",
              "| --- | " + " | ".join("---" for _ in metrics) + " | --- |"]
    for thr, fp in doc["fp_rate_by_threshold"].items():
        lines.append(f"| {thr}% | " + " | ".join(f"{100 * fp[m]:.0f}%" for m in metrics)
                     + f" | {100 * fp['any']:.0f}% |")
    loads = [r["load_before"][0] for r in doc["runs"]] + [r["load_after"][0] for r in doc["runs"]]
    lines += ["", f"load average (1 min) during the calibration: min {min(loads):.2f}, "
                  f"max {max(loads):.2f} on {doc['cpu_count']} CPUs"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True, type=Path)
    ap.add_argument("--k", type=int, default=10, help="A/A current runs per case (>= 10)")
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--profile", default=f"cpu-{os.cpu_count()}core")
    ap.add_argument("--out", type=Path, default=Path("results/baselines"))
    ap.add_argument("--write-baseline", action="store_true",
                    help="also write the baseline built from the first runs to <out>/<case>.<profile>.json")
    args = ap.parse_args()
    if args.k < 10:
        ap.error(f"--k must be >= 10 for a false-positive rate worth quoting, got {args.k}")
    summary = []
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        for case_path in args.case:
            doc = calibrate(case_path, k=args.k, baseline_runs=args.baseline_runs,
                            profile=args.profile, result_dir=Path(tmp),
                            baseline_out=args.out if args.write_baseline else None)
            args.out.mkdir(parents=True, exist_ok=True)
            # Not Path.with_suffix: it would replace `.calibration` and overwrite the baseline.
            stem = f"{doc['case']}.{doc['profile']}.calibration"
            (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
            md = to_markdown(doc)
            (args.out / f"{stem}.md").write_text(md)
            sys.stdout.write(md + "\n")
            summary.append({k: doc[k] for k in ("case", "k", "false_positive_rate", "wall_s")})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
