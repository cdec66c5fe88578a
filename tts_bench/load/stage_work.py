"""Where a tier's time went inside the embedded runner: each stage's work over the measured phase.

The phase hooks (`tts_bench.load.phases`) take a snapshot of every stage's loop counters when the
measured requests start and another when they end (`backend.work_snapshot()`, the embedded
runner's `stages.runner.work_delta`); the difference says, per stage, how busy it was (share of the
phase's wall time inside steps), how long a step took and how many rows it carried, and how much
work waited. A talker busy ~100 % holds the tier back; replicas busy ~100 % with a backlog mean
code2wav does. Backends without counters (piper, http, synthetic) record nothing.

Recorded in run.json as `stage_work` (one entry per arm, tier and repeat, every stage), and
shown under `tts-bench ab`'s tables, averaged over repeats, with the replicas pooled:

    hooks = StageWorkHooks(run)              # or beside memory hooks: phases.HookChain(mem, hooks)
    run_ab(arms, tiers, repeats=3, num_prompts=64, run_dir=run, hooks=hooks)
    print(render(work_table(hooks.entries), "md", title=WORK_TITLE))
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pandas as pd

WORK_TITLE = "stage work during the measured requests (mean over repeats; replicas pooled)"
# A replica's decode time split (Token2Wav.work): launching eager groups (host-bound: thousands
# of launches each), launching graph replays, finishing (device wait and the copy back).
DECODE_SPLIT = ("eager_launch_s", "replay_launch_s", "finish_s")


class StageWorkHooks:
    """Phase hooks: work counters at "measure" and "end" of every phase, recorded per phase."""

    def __init__(self, run_dir: Any = None) -> None:
        self.run_dir = run_dir  # a tts_bench.rundir.results.RunDir, or None to keep entries here only
        # A resumed run keeps what it recorded before.
        self.entries: list[dict] = list(run_dir.doc.get("stage_work", [])) if run_dir is not None else []
        self._before: list[dict] | None = None

    def on_phase(self, arm: str, tier: str, repeat: int, phase: str, backend: Any) -> None:
        snapshot = getattr(backend, "work_snapshot", None)
        if not callable(snapshot):
            return
        if phase == "measure":
            self._before = snapshot() or None  # no answer (a broken runner): nothing to compare
        elif phase == "end" and self._before is not None:
            # lazy: stages.runner loads torch. Only a backend with counters (the embedded
            # runner, which has loaded it already) gets this far: piper, http and synthetic
            # runs record no stage work and never load the stages for it.
            from stages.runner import work_delta

            stages = work_delta(self._before, snapshot())
            self._before = None
            if not stages:  # the runner did not answer (broken): nothing to record
                return
            self.entries.append({"arm": arm, "tier": tier, "repeat": repeat, "stages": stages})
            if self.run_dir is not None:
                self.run_dir.update(stage_work=self.entries)

    def abandon(self) -> None:
        self._before = None


def pooled(stages: list[dict]) -> list[dict]:
    """The talker as it is, and the code2wav replicas pooled into one row: busy is their mean,
    per-step figures are over all their steps, counters are summed."""
    from stages.runner import GROUP_KIND_KEYS, per_step  # lazy: see on_phase

    talker = [s for s in stages if not s["stage"].startswith("code2wav")]
    replicas = [s for s in stages if s["stage"].startswith("code2wav")]
    if not replicas:
        return talker
    total = {k: sum(s.get(k, 0) or 0 for s in replicas)
             for k in ("steps", "rows", "busy_s", "backlog", "groups", "graph_captures", "graph_replays")}
    for key in ("ready", "eager_final_groups", *GROUP_KIND_KEYS, *DECODE_SPLIT):  # older runs lack these counters
        if all(key in s for s in replicas):
            total[key] = sum(s[key] for s in replicas)
    steps = total["steps"]
    row = {"stage": f"code2wav x{len(replicas)}", **total, **per_step(total),
           "busy": sum(s["busy"] or 0.0 for s in replicas) / len(replicas),
           "groups_per_step": total["groups"] / steps if steps and total["groups"] else None}
    return talker + [row]


def work_table(entries: list[dict]) -> pd.DataFrame:
    """One row per tier, arm and stage (replicas pooled), each figure the mean over repeats."""
    cells: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for e in entries:
        for s in pooled(e["stages"]):
            cells[(e["tier"], e["arm"], s["stage"])].append(s)
    rows = []
    for (tier, arm, stage), seen in cells.items():
        rows.append({
            "Tier": tier, "Arm": arm, "Stage": stage, "Repeats": len(seen),
            "Busy": _pct(_mean(s.get("busy") for s in seen)),
            "ms a step": _num(_mean(s.get("ms_per_step") for s in seen), 1),
            "rows a step": _num(_mean(s.get("rows_per_step") for s in seen), 1),
            # Requests with a chunk waiting as a step began: rows a step's ceiling with no cap.
            "ready a step": _num(_mean(s.get("ready_per_step") for s in seen), 1, missing=""),
            "backlog a step": _num(_mean(s.get("backlog_per_step") for s in seen), 1),
            "groups a step": _num(_mean(s.get("groups_per_step") for s in seen), 2, missing=""),
            # Which parts of the streams' lives split a replica's step into groups (mean over repeats).
            "groups a step: first / growing / steady / final": _kinds(seen),
            "graphs captured / replayed / eager": _graphs(seen),
            # The talker's busy time split (its engine's counters); blank for other stages.
            "device wait (of busy)": _pct(_mean(_share(s, "device_wait_s") for s in seen), missing=""),
            "admitting (of busy)": _pct(_mean(_share(s, "admit_s") for s in seen), missing=""),
            "device span (of busy)": _pct(_mean(_share(s, "device_span_s") for s in seen), missing=""),
            # A replica's split: host time launching eager groups / waiting for the device.
            "eager launches (of busy)": _pct(_mean(_share(s, "eager_launch_s") for s in seen), missing=""),
            "finishing (of busy)": _pct(_mean(_share(s, "finish_s") for s in seen), missing=""),
        })
    return pd.DataFrame(rows)


def _kinds(seen: list[dict]) -> str:
    """Each kind's groups a step, the mean over repeats; blank where a repeat lacks the counters."""
    from stages.runner import kinds_per_step  # lazy: see on_phase

    per_repeat = [kinds_per_step(s) for s in seen]
    if not per_repeat or None in per_repeat:
        return ""
    return " / ".join(f"{sum(col) / len(col):.2f}" for col in zip(*per_repeat))


def _share(stage: dict, key: str) -> float | None:
    """`stage[key]` as a share of its busy seconds, or None when it has no such counter."""
    busy = stage.get("busy_s")
    return stage[key] / busy if key in stage and busy else None


def _mean(values) -> float | None:
    seen = [v for v in values if v is not None]
    return sum(seen) / len(seen) if seen else None


def _pct(value: float | None, missing: str = "n/a") -> str:
    return missing if value is None else f"{100.0 * value:.0f}%"


def _num(value: float | None, digits: int, missing: str = "n/a") -> str:
    return missing if value is None else f"{value:.{digits}f}"


def _graphs(seen: list[dict]) -> str:
    from stages.runner import eager_label  # lazy: see on_phase

    if not any("graph_captures" in s for s in seen):
        return ""
    summed = {k: sum(s.get(k, 0) for s in seen) for k in ("groups", "graph_captures", "graph_replays")}
    if all("eager_final_groups" in s for s in seen):  # runs recorded before the counter have none
        summed["eager_final_groups"] = sum(s["eager_final_groups"] for s in seen)
    return f"{summed['graph_captures']} / {summed['graph_replays']} / {eager_label(summed)}"
