"""A recorded A/B's result from its complete blocks, running nothing (`tts-bench ab --report RUN`).

A run cut by a time limit (a device lease, a CI job's budget) keeps every finished phase in its
record, and `--resume` finishes it, which needs the machine and the time again. This reads what
is already there: the blocks (a tier and repeat) where every arm's phase has a record, paired,
adjusted and tabled exactly as a finished run's. The run itself is not touched (its status,
result and lock stay as they were), so a later `--resume` still finishes it. No backend is built
and no memory preflight runs: a run made on a GPU can be read on any machine.

What counts as complete: a phase with its record in phases.jsonl (written when the phase ends,
in count and duration mode). In duration mode only the requests of the attempt that wrote that
record count (an attempt cut short and run again on --resume left requests under another
phase_id); in count mode a phase finished by --resume is its attempts' requests together, as in
the finished run. A block missing any arm's phase is left out of every table.

    run = RunDir.open(path)  # a reader: no lock taken, nothing repaired
    report = report_blocks(run, plan_from_run(run))  # as `run_session(AbRequest(report=path))`
    report.result.tiers[0].rtf
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tts_bench.ab.measurement import measurement_doc, with_phase_validity
from tts_bench.ab.summary import AbResult, summarize_ab
from tts_bench.errors import ConfigError
from tts_bench.load.windows import measured_phases
from tts_bench.rundir.records import RequestRecord, read_records
from tts_bench.rundir.results import RunDir
from tts_bench.verdicts.calibration import load_calibration

log = logging.getLogger(__name__)

Block = tuple[str, int]  # (tier, repeat)


def complete_blocks(phases: dict[tuple[str, str, int], dict], arms: Iterable[str]) -> set[Block]:
    """The (tier, repeat) blocks where every arm's phase has a record (`measured_phases`)."""
    seen: dict[Block, set[str]] = {}
    for arm, tier, repeat in phases:
        seen.setdefault((tier, repeat), set()).add(arm)
    return {block for block, have in seen.items() if have >= set(arms)}


def block_records(records: Iterable[RequestRecord], phases: dict[tuple[str, str, int], dict],
                  blocks: set[Block]) -> list[RequestRecord]:
    """The requests of `blocks` that their phases measured (see the module docstring)."""
    kept = []
    for r in records:
        phase = phases.get((r.arm, r.tier, r.repeat))
        if (r.tier, r.repeat) not in blocks or phase is None:  # no phase of its own: not measured
            continue
        if phase.get("mode") == "duration" and r.phase_id != phase.get("phase_id"):
            continue  # an attempt cut short, run again whole
        kept.append(r)
    return kept


@dataclass(frozen=True)
class BlocksReport:
    """What `tts-bench ab --report` shows: the result, what was measured and the stage work of
    the complete blocks."""

    result: AbResult
    measurement: dict[str, Any]
    work: list[dict]


def report_blocks(run: RunDir, plan: Any) -> BlocksReport:
    """The complete blocks of `run` (its `AbPlan`) as a finished run's tables; writes nothing."""
    phases = measured_phases(run)
    blocks = complete_blocks(phases, plan.arms)
    if not blocks:
        raise ConfigError(
            f"error: {run.path} has no complete block yet ({len(phases)} phase(s) recorded, a block needs one of "
            f"each arm: {', '.join(plan.arms)}) (--report); finish it with --resume {run.path}"
        )
    records = block_records(read_records(run), phases, blocks)
    calibration = load_calibration(plan.calibration) if plan.calibration else None
    result = summarize_ab(records, plan.arms, plan.tiers, run_dir=str(run.path), calibration=calibration,
                          blocks=blocks)
    result = with_phase_validity(result, run, blocks=blocks)
    measured = measurement_doc(run, result, next(iter(plan.arms.values())).bench, open_loop=plan.open_loop,
                               blocks=blocks)
    work = [w for w in run.doc.get("stage_work", []) if (w["tier"], int(w["repeat"])) in blocks]
    for tier in plan.tiers:
        used = sorted(r for t, r in blocks if t == tier.label)
        planned = plan.repeats if plan.until is None else "until resolved"
        log.warning("report of %s's complete blocks only: %d of %s planned (repeats %s); the run is %s",
                    tier.label, len(used), planned, ", ".join(map(str, used)) or "none", run.doc.get("status"))
    return BlocksReport(result, measured, work)
