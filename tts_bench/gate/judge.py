"""The gate's verdict: a current run against a baseline, per tier and metric, asv-style marks.

For each gated metric (a case threshold that is not null):

    delta%   = 100 * (center(current) / center(baseline) - 1)
    worse%   = delta% for lower-is-better metrics (RTF, TTFP, memory), -delta% for throughput
    p        = two-sided Mann-Whitney U of the current samples against the baseline's pool
               (`stats.mann_whitney_p`: scipy, normal approximation, tie + continuity corrected)
    run p    = with a calibration (`tts-bench calibrate`): two-sided t test of the run's log shift
               against the calibrated run-to-run SD of a phase's center,
               z = ln(current / baseline) / (phase_sd * sqrt(1/m + 1/b)), m and b the phases
               behind each center, df = the calibration's
    mark     = worse   worse% >  threshold and p < alpha (and run p < alpha when calibrated)
               better  worse% < -threshold and the same significance
               ~       beyond the threshold either way, but not significant
               =       within the threshold

Both conditions are needed: significance alone flags harmless 1% shifts on thousands of
samples, a threshold alone flags one noisy run. Landmine: the U test treats requests as
independent, but requests of one run share that run's machine state; on a shared CPU a whole
run can shift by tens of percent and the U test is then (correctly) sure the *run* is slower.
The run-level test is what separates that from a regression: it asks whether the shift is
large for a whole run on this machine, from A/A calibration data. Without a calibration next
to the baseline (`<case>.<profile>.calibration.json`) only the U test runs. Exit status, most
serious first:

    5 invalid run   provenance mismatch (case, backend, config hash, hardware profile), failed or
                    missing requests (all requests failing is 5, never "-100% throughput")
    4 accuracy      the WER run given with the gate regressed
    3 perf          some metric is `worse` (unless report-only)
    0 ok

    report = judge(baseline_doc, read_run(run_dir, profile="cpu-2core"), case.thresholds,
                   alpha=0.01, min_samples=8)
    report.exit_status(report_only=False), gate_table(report)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pandas as pd

from tts_bench.errors import ExitStatus
from tts_bench.gate.samples import METRICS, RunSamples, center
from tts_bench.verdicts.stats import mann_whitney_p, two_sided_p
from tts_bench.report.tables import fmt_pct

Mark = Literal["worse", "better", "~", "=", "not gated"]
GATE_COLUMNS = ("tier", "metric", "baseline", "current", "delta", "threshold", "p-value", "mark")


@dataclass(frozen=True)
class GateRow:
    tier: str
    metric: str
    better: str
    baseline: float
    current: float
    delta_pct: float
    threshold_pct: float | None
    p_value: float
    mark: Mark
    n_baseline: int
    n_current: int
    run_p_value: float | None = None  # run-level test against the calibrated phase SD


@dataclass(frozen=True)
class GateReport:
    rows: list[GateRow]
    invalid_reasons: list[str] = field(default_factory=list)
    accuracy_reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    current: str = ""
    baseline: str = ""

    @property
    def regressions(self) -> list[GateRow]:
        return [r for r in self.rows if r.mark == "worse"]

    def exit_status(self, *, report_only: bool = False) -> ExitStatus:
        if self.invalid_reasons:
            return ExitStatus.INVALID_RUN
        if self.accuracy_reasons:
            return ExitStatus.ACCURACY_REGRESSION
        if self.regressions and not report_only:
            return ExitStatus.PERF_REGRESSION
        return ExitStatus.OK

    def verdict(self) -> str:
        if self.invalid_reasons:
            return "invalid"
        if self.accuracy_reasons:
            return "accuracy regression"
        return "perf regression" if self.regressions else "pass"

    def to_dict(self, *, report_only: bool = False) -> dict[str, Any]:
        return {
            "verdict": self.verdict(), "exit_status": int(self.exit_status(report_only=report_only)),
            "report_only": report_only, "current": self.current, "baseline": self.baseline,
            "rows": [asdict(r) for r in self.rows], "invalid_reasons": self.invalid_reasons,
            "accuracy_reasons": self.accuracy_reasons, "notes": self.notes,
        }


def mark_for(worse_pct: float, threshold: float | None, p_value: float, alpha: float,
             run_p_value: float | None = None) -> Mark:
    if threshold is None:
        return "not gated"
    if abs(worse_pct) <= threshold:
        return "="
    if p_value >= alpha or (run_p_value is not None and run_p_value >= alpha):
        return "~"
    return "worse" if worse_pct > 0 else "better"


@dataclass(frozen=True)
class RunLevel:
    """What a calibration says about whole runs of this tier and metric (see the docstring)."""

    phase_sd: float  # log SD of one phase's center
    df: int
    current_phases: int
    baseline_phases: int


def run_p_value(log_shift: float, rl: RunLevel) -> float:
    se = rl.phase_sd * math.sqrt(1.0 / max(rl.current_phases, 1) + 1.0 / max(rl.baseline_phases, 1))
    if se <= 0:
        return 0.0 if log_shift else 1.0
    return two_sided_p(log_shift / se, max(rl.df, 1))


def compare_metric(tier: str, metric: str, base: dict[str, Any], current: list[float], *,
                   threshold: float | None, alpha: float, run_level: RunLevel | None = None) -> GateRow:
    spec = METRICS[metric]
    b, c = float(base["center"]), center(current, spec.center)
    delta = 100.0 * (c / b - 1.0) if b else float("inf")
    worse = delta if spec.better == "lower" else -delta
    p = mann_whitney_p(current, base["samples"])
    p_run = run_p_value(math.log(c / b), run_level) if run_level and b > 0 and c > 0 else None
    return GateRow(tier, metric, spec.better, b, c, delta, threshold, p,
                   mark_for(worse, threshold, p, alpha, p_run), len(base["samples"]), len(current), p_run)


def provenance_problems(baseline: dict[str, Any], cur: RunSamples) -> list[str]:
    p, out = cur.provenance, []
    checks = (("case", p.case, baseline.get("case")), ("backend", p.backend, baseline.get("backend")),
              ("config hash", p.sut_hash, baseline.get("sut_hash")),
              ("hardware profile", p.profile, baseline.get("profile")))
    for what, got, want in checks:
        if what == "case" and got is None:
            continue  # an `ab` run names no case; its config hash still has to match
        if got != want:
            out.append(f"{what}: current {got!r} != baseline {want!r}")
    return out


def tier_problems(tier: str, t: Any, *, min_samples: int, max_failure_fraction: float) -> list[str]:
    if t is None:
        return [f"{tier}: no requests in the current run"]
    total = t.completed + t.failed
    if total and t.completed == 0:
        return [f"{tier}: all {total} requests failed ({t.failed_by_kind})"]
    out = []
    if total and t.failed / total > max_failure_fraction:
        out.append(f"{tier}: {t.failed} of {total} requests failed ({t.failed_by_kind}), above "
                   f"max failure fraction {max_failure_fraction:g}")
    if total < t.expected:
        out.append(f"{tier}: {total} of {t.expected} planned requests recorded (run cut short?)")
    if t.completed < min_samples:
        out.append(f"{tier}: {t.completed} successful requests, fewer than min_samples {min_samples}")
    return out


def _run_level(calibration: Any, tier: str, metric: str, t: Any, base: dict[str, Any]) -> RunLevel | None:
    if calibration is None or tier not in calibration.tiers:
        return None
    cal = calibration.tiers[tier]
    sd = cal.phase_sd.get(metric)
    if sd is None:
        return None
    return RunLevel(sd, cal.phase_df, t.phases, len(base.get("per_run") or [None]))


def judge(baseline: dict[str, Any], cur: RunSamples, thresholds: Any, *, alpha: float,
          min_samples: int = 8, max_failure_fraction: float = 0.0,
          wer_doc: dict[str, Any] | None = None, calibration: Any = None) -> GateReport:
    """Gate `cur` against `baseline` (see the module docstring). `thresholds.get(metric)`;
    `calibration`: a `tts_bench.verdicts.calibration.Calibration` of the case on this profile, or None."""
    invalid = [f"provenance: {x}" for x in provenance_problems(baseline, cur)]
    notes = []
    if calibration is not None:
        notes.append(f"run-level test against the calibrated run-to-run SD ({calibration.path}, "
                     f"{calibration.runs} A/As)")
    if cur.provenance.extra_sets:
        notes.append(f"current run has overrides beyond the case: {list(cur.provenance.extra_sets)}")
    if cur.provenance.git_dirty:
        notes.append("current run was made from a dirty working tree")
    rows = []
    for tier, metrics in baseline.get("tiers", {}).items():
        t = cur.tiers.get(tier)
        problems = tier_problems(tier, t, min_samples=min_samples,
                                 max_failure_fraction=max_failure_fraction)
        invalid += problems
        if problems:
            continue
        for metric, base in metrics.items():
            samples = t.samples.get(metric)
            if not samples:
                invalid.append(f"{tier}: no {metric} samples in the current run (the baseline has them)")
                continue
            bad = t.non_finite(metric)
            if bad:
                invalid.append(f"{tier}: {bad} non-finite {metric} samples in the current run (damaged records)")
                continue
            rows.append(compare_metric(tier, metric, base, samples, threshold=thresholds.get(metric),
                                       alpha=alpha, run_level=_run_level(calibration, tier, metric, t, base)))
    return GateReport(rows, invalid, _accuracy(wer_doc, invalid), notes, cur.path,
                      str(baseline.get("case")))


def _accuracy(wer_doc: dict[str, Any] | None, invalid: list[str]) -> list[str]:
    """Fold a WER run's own verdict in: regression -> accuracy reasons, invalid -> invalid.
    Reasons are labelled by the run's metric: `wer:` for an English set, `cer:` for a Chinese
    one (runs from before the metric was recorded are English WER)."""
    if wer_doc is None:
        return []
    label = wer_doc.get("metric") or "wer"
    verdict, reasons = wer_doc.get("verdict"), list(wer_doc.get("reasons") or [])
    if verdict == "invalid":
        invalid.extend(f"{label}: {r}" for r in reasons or [f"invalid {label.upper()} run"])
    return [f"{label}: {r}" for r in reasons] if verdict == "regression" else []


def _fmt_num(v: float) -> str:
    return f"{v:.4g}"


def gate_table(report: GateReport) -> pd.DataFrame:
    """One row per tier and metric; a `run p` column when a calibration was used."""
    with_run_p = any(r.run_p_value is not None for r in report.rows)
    rows = [{
        "tier": r.tier,
        "metric": f"{r.metric} ({r.better} is better)",
        "baseline": _fmt_num(r.baseline),
        "current": _fmt_num(r.current),
        "delta": fmt_pct(r.delta_pct),
        "threshold": f"±{r.threshold_pct:g}%" if r.threshold_pct is not None else "n/a",
        "p-value": f"{r.p_value:.2g}",
        "run p": "n/a" if r.run_p_value is None else f"{r.run_p_value:.2g}",
        "mark": r.mark,
    } for r in report.rows]
    columns = [*GATE_COLUMNS[:-1], "run p", GATE_COLUMNS[-1]] if with_run_p else list(GATE_COLUMNS)
    return pd.DataFrame(rows, columns=columns, dtype=object)
