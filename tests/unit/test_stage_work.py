"""Stage work over a phase (tts_bench.load.stage_work): hooks, pooling of replicas, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tts_bench.rundir.results import RunDir
from stages.code2wav.decode_work import GROUP_KINDS, HOST_SPLIT
from stages.runner import GROUP_KIND_KEYS
from tts_bench.load.stage_work import DECODE_SPLIT, StageWorkHooks, pooled, work_table

ROOT = Path(__file__).resolve().parents[2]


def _stage(name, steps, rows, busy_s, wall_s, backlog=0, **extra):
    return {"stage": name, "steps": steps, "rows": rows, "busy_s": busy_s, "backlog": backlog,
            "wall_s": wall_s, **extra}


class _Backend:
    """Scripted counters: each call returns the next snapshot."""

    def __init__(self, *snapshots):
        self.snapshots = list(snapshots)

    def work_snapshot(self):
        return self.snapshots.pop(0)


def test_hooks_record_the_measured_interval_of_each_phase_in_the_run(tmp_path):
    run = RunDir.create(tmp_path, "ab", command_line=["test"], configs={})
    hooks = StageWorkHooks(run)
    backend = _Backend(
        [_stage("talker", 100, 5000, 9.0, 10.0), _stage("code2wav-0", 10, 40, 4.0, 10.0, groups=12)],
        [_stage("talker", 300, 15000, 27.0, 30.0), _stage("code2wav-0", 30, 200, 16.0, 30.0, groups=40)],
    )
    hooks.on_phase("base", "64x4", 0, "warmup", backend)  # not sampled: warmup traffic
    hooks.on_phase("base", "64x4", 0, "measure", backend)
    hooks.on_phase("base", "64x4", 0, "end", backend)
    (entry,) = RunDir.open(run.path).doc["stage_work"]
    assert (entry["arm"], entry["tier"], entry["repeat"]) == ("base", "64x4", 0)
    talker, replica = entry["stages"]
    assert talker["steps"] == 200 and talker["busy"] == pytest.approx(18.0 / 20.0)
    assert replica["rows_per_step"] == pytest.approx(8.0) and replica["groups"] == 28
    assert StageWorkHooks(RunDir.open(run.path)).entries == [entry]  # a resumed run keeps it


def test_backends_without_counters_and_abandoned_phases_record_nothing():
    hooks = StageWorkHooks()
    hooks.on_phase("base", "2x1", 0, "measure", object())
    hooks.on_phase("base", "2x1", 0, "end", object())
    backend = _Backend([_stage("talker", 1, 1, 0.1, 1.0)])
    hooks.on_phase("base", "2x1", 0, "measure", backend)
    hooks.abandon()
    hooks.on_phase("base", "2x1", 0, "end", backend)  # no snapshot left: it must not be asked
    silent = _Backend([], [_stage("talker", 5, 5, 0.5, 2.0)])  # no answer when the phase began
    hooks.on_phase("base", "2x1", 0, "measure", silent)
    hooks.on_phase("base", "2x1", 0, "end", silent)
    assert hooks.entries == [] and silent.snapshots  # an interval without a start is not counted


def test_replicas_pool_into_one_row_and_the_table_averages_repeats():
    stages = [
        {**_stage("talker", 10, 500, 9.0, 10.0), "busy": 0.9, "ms_per_step": 900.0, "rows_per_step": 50.0,
         "backlog_per_step": 0.0},
        {**_stage("code2wav-0", 4, 16, 2.0, 10.0, groups=6, graph_captures=0, graph_replays=4), "busy": 0.2},
        {**_stage("code2wav-1", 6, 24, 6.0, 10.0, backlog=12, groups=6, graph_captures=1, graph_replays=5),
         "busy": 0.6},
    ]
    talker, replicas = pooled(stages)
    assert talker["stage"] == "talker" and replicas["stage"] == "code2wav x2"
    assert replicas["busy"] == pytest.approx(0.4) and replicas["ms_per_step"] == pytest.approx(800.0)
    assert replicas["rows_per_step"] == pytest.approx(4.0) and replicas["backlog_per_step"] == pytest.approx(1.2)
    again = [dict(s, busy=s["busy"] / 2) for s in stages]
    table = work_table([{"arm": "a", "tier": "64x4", "repeat": r, "stages": s} for r, s in enumerate((stages, again))])
    rows = table.to_dict("records")
    assert [(r["Stage"], r["Repeats"]) for r in rows] == [("talker", 2), ("code2wav x2", 2)]
    assert rows[0]["Busy"] == "68%" and rows[1]["Busy"] == "30%"
    graphs = "graphs captured / replayed / eager"
    assert rows[1][graphs] == "2 / 18 / 6" and rows[0][graphs] == ""  # 24 groups, 18 of them replays
    assert rows[1]["groups a step"] == "1.20" and rows[0]["groups a step"] == ""
    assert rows[0]["device wait (of busy)"] == rows[1]["device wait (of busy)"] == ""  # no split counted
    assert rows[1]["ready a step"] == rows[0]["ready a step"] == ""  # recorded before the counter
    for s, finals in zip(stages[1:], (1, 2)):  # replicas that counted their eager finals
        s["eager_final_groups"] = finals
    (_, row) = work_table([{"arm": "a", "tier": "64x4", "repeat": 0, "stages": stages}]).to_dict("records")
    assert pooled(stages)[1]["eager_final_groups"] == 3 and row[graphs] == "1 / 9 / 3 (3 final)"
    by_kind = "groups a step: first / growing / steady / final"
    assert row[by_kind] == ""  # no replica counted its kinds
    for s, kinds in zip(stages[1:], ((1, 1, 2, 2), (2, 0, 4, 0))):
        s.update(zip(GROUP_KIND_KEYS, kinds))
    (_, row) = work_table([{"arm": "a", "tier": "64x4", "repeat": 0, "stages": stages}]).to_dict("records")
    assert row[by_kind] == "0.30 / 0.10 / 0.60 / 0.20"  # 12 groups over the replicas' 10 steps


def test_the_recorded_counter_names_are_the_replicas_own():
    assert GROUP_KIND_KEYS == tuple(f"group_{k}" for k in GROUP_KINDS)
    assert DECODE_SPLIT == HOST_SPLIT


def test_the_table_shows_ready_requests_a_step_when_every_replica_counted_them():
    stages = [{**_stage("code2wav-0", 4, 16, 2.0, 10.0), "busy": 0.2, "ready": 30},
              {**_stage("code2wav-1", 6, 24, 6.0, 10.0), "busy": 0.6, "ready": 30}]
    (replicas,) = pooled(stages)
    assert replicas["ready"] == 60 and replicas["ready_per_step"] == pytest.approx(6.0)
    (row,) = work_table([{"arm": "a", "tier": "64x4", "repeat": 0, "stages": stages}]).to_dict("records")
    assert row["rows a step"] == "4.0" and row["ready a step"] == "6.0"
    stages[1].pop("ready")  # one replica from before the counter: no pooled figure, not a partial one
    assert "ready" not in pooled(stages)[0]


def test_the_table_splits_a_replicas_busy_time_into_eager_launches_and_finishing():
    split = {"eager_launch_s": 1.0, "replay_launch_s": 0.2, "finish_s": 0.6}
    stages = [{**_stage("code2wav-0", 4, 16, 2.0, 10.0), "busy": 0.2, **split},
              {**_stage("code2wav-1", 6, 24, 6.0, 10.0), "busy": 0.6, **{k: 3 * v for k, v in split.items()}}]
    (replicas,) = pooled(stages)
    assert replicas["eager_launch_s"] == pytest.approx(4.0) and replicas["finish_s"] == pytest.approx(2.4)
    (row,) = work_table([{"arm": "a", "tier": "64x4", "repeat": 0, "stages": stages}]).to_dict("records")
    assert row["eager launches (of busy)"] == "50%" and row["finishing (of busy)"] == "30%"  # of 8 s busy
    (talker,) = work_table([{"arm": "a", "tier": "64x4", "repeat": 0,
                             "stages": [_stage("talker", 5, 5, 0.5, 2.0)]}]).to_dict("records")
    assert talker["eager launches (of busy)"] == talker["finishing (of busy)"] == ""


def test_the_table_shows_the_talkers_busy_time_split_averaged_over_repeats():
    def talker(wait: float, admit: float, span: float) -> dict:
        return {**_stage("talker", 10, 500, 8.0, 10.0), "busy": 0.8, "ms_per_step": 800.0,
                "rows_per_step": 50.0, "backlog_per_step": 0.0, "device_wait_s": wait, "admit_s": admit,
                "device_span_s": span}

    entries = [{"arm": "a", "tier": "64x4", "repeat": r, "stages": [talker(w, a, d)]}
               for r, (w, a, d) in enumerate(((6.0, 1.0, 2.0), (4.0, 2.0, 1.0)))]
    (row,) = work_table(entries).to_dict("records")
    assert row["device wait (of busy)"] == "62%" and row["admitting (of busy)"] == "19%"
    assert row["device span (of busy)"] == "19%"  # (2/8 + 1/8) / 2


@pytest.mark.slow
def test_an_embedded_ab_shows_and_records_where_each_arm_spent_its_time(tmp_path):
    from tts_bench.cli import app

    result = CliRunner().invoke(app, ["ab", "--tiers", "2x1", "--num-prompts", "2", "--repeats", "1",
                                      "--format", "md", "--result-dir", str(tmp_path)],
                                env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "stage work during the measured requests" in result.stdout
    assert "| talker" in result.stdout and "| code2wav x1" in result.stdout
    (run,) = tmp_path.iterdir()
    entries = json.loads((run / "run.json").read_text())["stage_work"]
    assert sorted(e["arm"] for e in entries) == ["base", "test"]
    for e in entries:
        talker, replica = e["stages"]
        assert talker["stage"] == "talker" and replica["stage"] == "code2wav-0"
        assert talker["steps"] > 0 and replica["rows"] >= 2  # both requests' payloads decoded
        assert 0 < talker["busy"] <= 1 and 0 < replica["busy"] <= 1
