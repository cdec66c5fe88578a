"""One `tts-bench gate` as a library call: find (or make) the run, its case and baseline, judge.

`run_session(GateRequest(...))` takes exactly one of `run_case` (run that case's bench now, after
every check that can fail without it: the options, the baseline, the `--wer-run`, the case's
tiers against the baseline's, the preflight `ab` makes) or `current` (a complete recorded run:
its case from `case`, else the case file the run recorded, else the one the baseline was built
for, else default thresholds); an option of the other mode is refused, not ignored. It reads
the run's samples (`tts_bench.gate.samples.read_run`), folds in a WER run's verdict, uses the
A/A calibration next to the baseline when it was made with the baseline's config, and judges
(`tts_bench.gate.judge.judge`). A `run_case` run keeps its own verdict in run.json (`gate`).
Lines worth saying on stderr go to `notify`.

    session = run_session(GateRequest(run_case=Path("configs/cases/synthetic.yaml"), profile="cpu-2core"))
    session.report.exit_status(report_only=False)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tts_bench.config.paths import check_writable
from tts_bench.config.paths import resolve_profile
from tts_bench.verdicts.calibration import Calibration, calibration_path, load_calibration
from tts_bench.config import parse_tiers
from tts_bench.errors import ConfigError, InvalidRunError
from tts_bench.config.shipped import resolve_config_path
from tts_bench.gate import case as cases
from tts_bench.gate.baseline import load_baseline
from tts_bench.gate.bench import run_case
from tts_bench.gate.judge import GateReport, judge
from tts_bench.gate.samples import read_run
from tts_bench.rundir.results import RunDir

log = logging.getLogger(__name__)

DEFAULT_RESULT_DIR = Path("results/runs")


@dataclass(frozen=True)
class GateRequest:
    run_case: Path | None = None  # run this case's bench, then gate it
    current: Path | None = None  # or gate this recorded run
    baseline: Path | None = None  # default: results/baselines/<case>.<profile>.json
    case: Path | None = None  # thresholds for `current` (default: the one the run recorded)
    profile: str | None = None  # default: cpu-<N>core
    arm: str | None = None  # of an `ab` run (default: its test arm)
    sets: Sequence[str] = ()  # extra overrides on top of the case (recorded, reported)
    wer_run: Path | None = None  # a `tts-bench wer` run whose verdict is folded in
    report_only: bool = False
    result_dir: Path | None = None  # where run_case's run goes (default results/runs)


@dataclass(frozen=True)
class GateSession:
    report: GateReport
    doc: dict[str, Any]  # the report as JSON, with the baseline file
    baseline_path: Path


@dataclass(frozen=True)
class _Target:
    """What to gate: the run, its case (thresholds), the baseline and the hardware profile."""

    run: RunDir  # opened once: its samples are read from it and --run-case's verdict written to it
    case: cases.Case
    baseline_path: Path
    baseline_doc: dict
    profile: str
    calibration: Calibration | None  # read before --run-case's bench: a broken file fails first


def run_session(request: GateRequest, *, notify: Callable[[str], None] = log.warning) -> GateSession:
    """See the module docstring."""
    _check_options(request)
    wer_doc = _wer_doc(request.wer_run)  # before --run-case's bench: a bad --wer-run fails first
    target = _target(request, notify)
    c = target.case
    report = judge(target.baseline_doc, read_run(target.run, arm=request.arm, profile=target.profile),
                   c.thresholds, alpha=c.alpha, min_samples=c.min_samples, wer_doc=wer_doc,
                   calibration=target.calibration)
    doc = {**report.to_dict(report_only=request.report_only), "baseline_file": str(target.baseline_path)}
    if request.run_case is not None:  # the run keeps its own verdict
        target.run.update(gate=doc)
    return GateSession(report, doc, target.baseline_path)


# Options of one mode, by GateRequest field: with the other mode they would be ignored.
_REFUSED = {
    "--run-case": {"case": ("--case", "--case gives a recorded run's thresholds; --run-case uses its case file's"),
                   "arm": ("--arm", "--arm picks an arm of a recorded A/B; --run-case runs its case file's arm")},
    "--current": {"sets": ("--set", "--set changes the run --run-case makes; a recorded run is judged as it ran"),
                  "result_dir": ("--result-dir", "--result-dir is where --run-case makes its run; --current "
                                                 "makes none")},
}


def _check_options(request: GateRequest) -> None:
    """Options of the other mode are refused, not ignored: `--run-case --case X` would judge
    with the run case's thresholds, `--current --set k=v` would judge a run made without it."""
    if (request.run_case is None) == (request.current is None):
        raise ConfigError("error: give exactly one of --run-case and --current (tts-bench gate); "
                          "e.g. --run-case configs/cases/synthetic.yaml")
    mode = "--run-case" if request.run_case is not None else "--current"
    given = [(flag, why) for name, (flag, why) in _REFUSED[mode].items()
             if getattr(request, name) not in (None, [], ())]
    if given:
        flags = " and ".join(flag for flag, _ in given)
        reasons = "; ".join(why for _, why in given)
        raise ConfigError(f"error: {flags} cannot be used with {mode} (tts-bench gate): {reasons}; drop {flags}")


def _target(request: GateRequest, notify: Callable[[str], None]) -> _Target:
    """--run-case: load the baseline and check the case against it first (nothing that fails
    there runs the bench), then run. --current: the case from --case, else the run's recorded
    case, else the baseline's."""
    profile = resolve_profile(request.profile)
    if request.run_case is not None:
        loaded = cases.load_case(request.run_case)
        base_path = request.baseline or cases.baseline_path(loaded.case, profile)
        base_doc = load_baseline(base_path)
        rc = cases.resolve_case(loaded, request.sets)
        _check_tiers(rc, base_doc, base_path)
        cal = _calibration(loaded.case.name, profile, base_path, base_doc, notify)
        return _Target(_run(rc, request, profile, notify), loaded.case, base_path, base_doc, profile, cal)
    run = RunDir.open(Path(request.current), flag="--current")
    status = run.doc.get("status")
    if status != "complete":  # a failed or cut-short run's missing requests are not a speed-up
        raise InvalidRunError(f"error: {run.path} is not a complete run: its run.json status is {status!r} "
                              f"(--current); gate a finished run (an A/B can be finished with ab --resume)")
    recorded = run.doc.get("case") or {}  # {} for runs not made by --run-case
    loaded = _case_for(request.case, recorded)
    name = (loaded.case.name if loaded else None) or recorded.get("name") or "adhoc"
    base_path = request.baseline or cases.baseline_path(cases.Case(name=name, config="-"), profile)
    base_doc = load_baseline(base_path)
    if loaded is None and resolve_config_path(base_doc.get("case_file") or "-").is_file():
        loaded = cases.load_case(base_doc["case_file"])  # the case the baseline was built for
    if loaded is None:
        notify("warning: no case file (--case); using default thresholds")
    case = loaded.case if loaded else cases.Case(name=name, config="-")
    return _Target(run, case, base_path, base_doc, profile,
                   _calibration(case.name, profile, base_path, base_doc, notify))


def _calibration(case: str, profile: str, base_path: Path, base_doc: dict,
                 notify: Callable[[str], None]) -> Calibration | None:
    """The case's A/A calibration next to the baseline, when it was made with the baseline's
    config (the same `sut_hash` as the baseline). A file there that cannot be read (truncated,
    another format version, a key missing) is refused (exit 2) as `ab --calibration` refuses it:
    gating without the run-level test it was put there for would be a quieter gate, not a pass."""
    path = calibration_path(case, profile, base_path.parent)
    if not path.exists():
        return None
    cal = load_calibration(path, flag=f"the calibration beside baseline {base_path}")
    if cal.sut_hash != base_doc.get("sut_hash"):
        notify(f"warning: {path} was recorded for another config of the case; not used")
        return None
    return cal


def _check_tiers(rc: cases.ResolvedCase, base_doc: dict, base_path: Path) -> None:
    """The run's tiers are the baseline's: a tier the baseline lacks would run and never be
    judged, one the run lacks would make the gate invalid (exit 5), both after the whole bench."""
    run_tiers = [t.label for t in parse_tiers(rc.config.bench.tiers)]
    base_tiers = list(base_doc["tiers"])
    if sorted(run_tiers) != sorted(base_tiers):
        raise ConfigError(f"error: the run would cover tiers {', '.join(run_tiers)} but baseline {base_path} has "
                          f"{', '.join(base_tiers)} ({rc.loaded.path}: bench.tiers, --set); run the baseline's "
                          f"tiers, or record a baseline for these with tts-bench baseline update")


def _run(rc: cases.ResolvedCase, request: GateRequest, profile: str, notify: Callable[[str], None]) -> RunDir:
    result_dir = request.result_dir or DEFAULT_RESULT_DIR
    check_writable(result_dir, flag="--result-dir", directory=True)
    run = run_case(rc, profile=profile, result_dir=result_dir)
    notify(f"run: {run.path}")
    return run


def _case_for(case: Path | None, recorded: dict) -> cases.LoadedCase | None:
    """--case, else the case file the run recorded (if it still exists), else None (defaults)."""
    if case is not None:
        return cases.load_case(case)
    file = recorded.get("file")
    if file and resolve_config_path(file).is_file():
        return cases.load_case(file)
    return None


def _wer_doc(path: Path | None) -> dict | None:
    if path is None:
        return None
    doc = RunDir.open(path, flag="--wer-run").doc.get("wer")
    if not doc:
        raise ConfigError(f"error: {path} holds no WER result (--wer-run); pass a finished tts-bench wer run")
    return doc
