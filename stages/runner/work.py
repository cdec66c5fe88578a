"""Where a stage's time goes: cumulative work counters of its loop, read between its steps.

Each stage loop (the talker, every code2wav replica) counts its steps, the rows in them, the
work waiting when each step began and the wall time spent inside steps. A step ends with the
host sync that hands its codes or audio over, so its time is device time plus launch overhead,
including time spent waiting while another process's kernels hold the device. The client reads
the counters with `StageRunner.work_snapshot()`; the difference of two snapshots taken around a
tier says who was busy (`work_delta`):

- a talker busy ~100 % of the wall time holds the tier back (the replicas wait for codes);
- replicas busy ~100 % with a growing backlog mean code2wav holds it back;
- everyone well under 100 % with slow steps: the device is shared (time-sliced) or idle.

A replica also counts the requests with a payload waiting when each step began (`ready`): a step
takes one chunk a request, so rows well under `max_num_seqs` with rows ~ ready mean the batches
are as full as the requests allow, and the backlog is later chunks of the same requests. With
`runner.one_shape_steps` rows < ready also counts the requests whose next chunk had another shape.

    before = runner.work_snapshot()
    ...  # run a tier
    for row in work_delta(before, runner.work_snapshot()):
        print(row["stage"], f"{row['busy']:.0%}", row["ms_per_step"], row["rows_per_step"])
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from stages.code2wav.decode_work import GROUP_KINDS


@dataclass
class WorkCounters:
    steps: int = 0
    rows: int = 0  # summed over steps: requests in a talker step, payloads in a decode
    busy_s: float = 0.0  # wall time inside steps
    backlog: int = 0  # summed over steps: work waiting when the step began (not taken by it)
    # Summed over steps, code2wav only (None: not counted): requests with a payload waiting when
    # the step began, the rows it could take with no `max_num_seqs` cap (one chunk a request).
    # rows ~ ready: the batches are as full as the requests allow; rows < ready: the cap binds
    # (or, with runner.one_shape_steps, chunks of other shapes waited).
    ready: int | None = None
    started: float = field(default_factory=time.monotonic)

    def add(self, rows: int, seconds: float, backlog: int = 0, ready: int | None = None) -> None:
        self.steps += 1
        self.rows += rows
        self.busy_s += seconds
        self.backlog += backlog
        if ready is not None:
            self.ready = (self.ready or 0) + ready

    def snapshot(self, extra: dict | None = None) -> dict:
        """The counters now, `wall_s` since the stage started, plus `extra` (engine counters)."""
        counted = {} if self.ready is None else {"ready": self.ready}
        return {"steps": self.steps, "rows": self.rows, "busy_s": self.busy_s, "backlog": self.backlog,
                **counted, "wall_s": time.monotonic() - self.started, **(extra or {})}

    def snapshot_with(self, engine: Any) -> dict:
        """`snapshot()` plus the engine's own cumulative counters, when it has `work()` (the
        talker's admit / device-wait seconds, code2wav's groups and graph captures / replays)."""
        work = getattr(engine, "work", None)
        return self.snapshot(work() if callable(work) else None)


def work_delta(before: list[dict], after: list[dict]) -> list[dict]:
    """Per stage (in `after`'s order): every counter's increase between two snapshots, and
    busy (share of the wall time inside steps), ms_per_step, rows_per_step, backlog_per_step.

    A stage missing from `before` (restarted, or it did not answer then) is counted from its
    start. Derived figures are None over an interval without steps."""
    earlier = {row["stage"]: row for row in before}
    out = []
    for row in after:
        base = earlier.get(row["stage"], {})
        delta = {"stage": row["stage"]}
        for key, value in row.items():
            if key != "stage" and isinstance(value, (int, float)) and not isinstance(value, bool):
                delta[key] = value - base.get(key, 0)
        wall = delta.get("wall_s", 0.0)
        delta["busy"] = delta.get("busy_s", 0.0) / wall if wall > 0 else None
        out.append({**delta, **per_step(delta)})
    return out


def per_step(counters: dict) -> dict:
    """ms_per_step, rows_per_step, backlog_per_step and ready_per_step of summed counters (None
    without steps; ready_per_step None where the stage does not count it)."""
    steps = counters.get("steps", 0)
    if not steps:
        return {"ms_per_step": None, "rows_per_step": None, "backlog_per_step": None, "ready_per_step": None}
    ready = counters.get("ready")
    return {"ms_per_step": 1000.0 * counters["busy_s"] / steps, "rows_per_step": counters["rows"] / steps,
            "backlog_per_step": counters["backlog"] / steps,
            "ready_per_step": None if ready is None else ready / steps}


def eager_groups(counters: dict) -> int:
    """Chunk groups that ran eagerly: all of them with graphs off; with graphs on, final chunks
    (their length varies: only warmed ones have graphs, `code2wav_final_chunk_graphs`) and each
    new shape's first run before its capture. Every group either replays or runs eagerly; an
    eager full-size group is ~6k launches of host work."""
    return counters.get("groups", 0) - counters.get("graph_replays", 0)


def eager_label(counters: dict) -> str:
    """`eager_groups` as a report shows it: with the finals among them where they were counted
    (`eager_final_groups`; records made before the counter have none), e.g. `582 (500 final)`."""
    finals = counters.get("eager_final_groups")
    return f"{eager_groups(counters)}" + ("" if finals is None else f" ({finals} final)")


# A replica's counters of its groups by kind (`Token2Wav.work`), in GROUP_KINDS order.
GROUP_KIND_KEYS = tuple(f"group_{k}" for k in GROUP_KINDS)


def kinds_per_step(counters: dict) -> list[float] | None:
    """A replica's chunk groups a step by the part of a stream's life they decode, in
    GROUP_KINDS order (`stages.code2wav.decode_work`); None without steps or where the counters
    predate them."""
    steps = counters.get("steps", 0)
    if not steps or not all(k in counters for k in GROUP_KIND_KEYS):
        return None
    return [counters[k] / steps for k in GROUP_KIND_KEYS]


def group_kinds(counters: dict) -> str | None:
    """`kinds_per_step` as the work lines show it, `first / growing / steady / final`."""
    kinds = kinds_per_step(counters)
    return None if kinds is None else " / ".join(f"{k:.2f}" for k in kinds)


def format_work(rows: list[dict]) -> list[str]:
    """One line per stage of a `work_delta`: busy %, ms and rows a step, backlog, graphs (captured /
    replayed / eager groups)."""
    lines = []
    for r in rows:
        if not r.get("steps"):
            lines.append(f"{r['stage']:>12}  idle")
            continue
        graphs = ""
        if r.get("graph_captures") or r.get("graph_replays"):
            graphs = (f"  graphs {r.get('graph_captures', 0)} captured / {r.get('graph_replays', 0)} replayed"
                      f" / {eager_label(r)} eager")
        groups = f"  {r['groups'] / r['steps']:.2f} groups a step" if "groups" in r else ""
        if (kinds := group_kinds(r)) is not None:
            groups += f" ({kinds} first / growing / steady / final)"
        ready = f" ({r['ready_per_step']:.1f} ready)" if r.get("ready_per_step") is not None else ""
        split = ""
        if r.get("busy_s") and "device_wait_s" in r:  # the talker engine's split of its busy time
            split = (f"  of busy: {r['device_wait_s'] / r['busy_s']:.0%} waiting for the device, "
                     f"{r.get('admit_s', 0.0) / r['busy_s']:.0%} admitting")
            if "device_span_s" in r:  # the device's own time for the steps (not on CPU)
                split += f"; device span {1000.0 * r['device_span_s'] / r['steps']:.1f} ms a step"
        elif r.get("busy_s") and "eager_launch_s" in r:  # a replica engine's split of its decodes
            split = (f"  of busy: {r['eager_launch_s'] / r['busy_s']:.0%} launching eager groups, "
                     f"{r.get('finish_s', 0.0) / r['busy_s']:.0%} finishing (device wait, copy back)")
        lines.append(
            f"{r['stage']:>12}  busy {r['busy']:6.1%}  {r['steps']:6d} steps  {r['ms_per_step']:7.1f} ms a step  "
            f"{r['rows_per_step']:5.1f} rows a step{ready}  backlog {r['backlog_per_step']:5.1f}{groups}{split}{graphs}"
        )
    return lines
