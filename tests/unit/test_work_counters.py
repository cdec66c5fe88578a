"""The runner's work counters and their deltas (stages.runner.work)."""

from __future__ import annotations

import pytest

from stages.runner.work import WorkCounters, format_work, work_delta


def test_counters_add_steps_rows_time_and_backlog():
    w = WorkCounters()
    w.add(8, 0.25, backlog=3)
    w.add(2, 0.05)
    snap = w.snapshot({"groups": 4})
    assert (snap["steps"], snap["rows"], snap["backlog"], snap["groups"]) == (2, 10, 3, 4)
    assert snap["busy_s"] == pytest.approx(0.30)
    assert snap["wall_s"] >= 0


def test_ready_requests_are_counted_only_where_a_stage_reports_them():
    talker, replica = WorkCounters(), WorkCounters()
    talker.add(64, 0.02)
    assert "ready" not in talker.snapshot()
    replica.add(8, 0.4, backlog=9, ready=12)  # the cap (8) bound this step: 12 requests had work
    replica.add(3, 0.2, backlog=2, ready=3)
    snap = replica.snapshot()
    assert snap["ready"] == 15 and snap["rows"] == 11
    (d,) = work_delta([], [{"stage": "code2wav-0", **snap}])
    assert d["ready_per_step"] == pytest.approx(7.5) and d["rows_per_step"] == pytest.approx(5.5)
    assert "5.5 rows a step (7.5 ready)" in format_work([d])[0]
    split = replica.snapshot({"eager_launch_s": 0.3, "finish_s": 0.15})
    (s,) = work_delta([], [{"stage": "code2wav-0", **split}])
    assert "of busy: 50% launching eager groups, 25% finishing" in format_work([s])[0]
    (t,) = work_delta([], [{"stage": "talker", **talker.snapshot()}])
    assert t["ready_per_step"] is None and "ready" not in format_work([t])[0]


def test_delta_derives_busy_share_and_per_step_figures_over_the_interval():
    before = [{"stage": "talker", "steps": 10, "rows": 100, "busy_s": 1.0, "backlog": 0, "wall_s": 5.0}]
    after = [{"stage": "talker", "steps": 30, "rows": 500, "busy_s": 4.0, "backlog": 40, "wall_s": 9.0}]
    (d,) = work_delta(before, after)
    assert (d["steps"], d["rows"], d["backlog"]) == (20, 400, 40)
    assert d["busy"] == pytest.approx(3.0 / 4.0)
    assert d["ms_per_step"] == pytest.approx(150.0)
    assert d["rows_per_step"] == pytest.approx(20.0)
    assert d["backlog_per_step"] == pytest.approx(2.0)


def test_a_stage_missing_before_counts_from_its_start_and_an_idle_one_has_no_rates():
    after = [
        {"stage": "code2wav-0", "steps": 4, "rows": 8, "busy_s": 2.0, "backlog": 0, "wall_s": 4.0, "groups": 6},
        {"stage": "code2wav-1", "steps": 0, "rows": 0, "busy_s": 0.0, "backlog": 0, "wall_s": 4.0},
    ]
    before = [{"stage": "code2wav-1", "steps": 0, "rows": 0, "busy_s": 0.0, "backlog": 0, "wall_s": 1.0}]
    new, idle = work_delta(before, after)
    assert new["busy"] == pytest.approx(0.5) and new["groups"] == 6
    assert idle["busy"] == 0.0 and idle["ms_per_step"] is None and idle["rows_per_step"] is None
    lines = format_work([new, idle])
    assert "busy  50.0%" in lines[0] and "1.50 groups a step" in lines[0]
    assert lines[1].split() == ["code2wav-1", "idle"]
    # With graphs on, the groups that did not replay ran eagerly (final chunks, first runs).
    graphs = {**after[0], "graph_captures": 1, "graph_replays": 4}
    (line,) = format_work(work_delta([], [graphs]))
    assert line.endswith("graphs 1 captured / 4 replayed / 2 eager")
    (line,) = format_work(work_delta([], [{**graphs, "eager_final_groups": 1}]))  # one of the two a final
    assert line.endswith("graphs 1 captured / 4 replayed / 2 (1 final) eager")
    kinds = {"group_first": 1, "group_growing": 1, "group_steady": 2, "group_final": 2}
    (line,) = format_work(work_delta([], [{**after[0], **kinds}]))  # 6 groups over 4 steps
    assert "1.50 groups a step (0.25 / 0.25 / 0.50 / 0.50 first / growing / steady / final)" in line


def test_the_talker_line_splits_its_busy_time_into_device_wait_and_admission():
    before = [{"stage": "talker", "steps": 0, "rows": 0, "busy_s": 0.0, "backlog": 0, "wall_s": 0.0,
               "admit_s": 0.0, "device_wait_s": 0.0}]
    after = [{"stage": "talker", "steps": 100, "rows": 6400, "busy_s": 8.0, "backlog": 0, "wall_s": 10.0,
              "admit_s": 1.0, "device_wait_s": 6.0}]
    (line,) = format_work(work_delta(before, after))
    assert "of busy: 75% waiting for the device, 12% admitting" in line


def test_the_talker_line_gives_its_device_span_a_step_where_the_device_timed_it():
    before = [{"stage": "talker", "steps": 0, "rows": 0, "busy_s": 0.0, "backlog": 0, "wall_s": 0.0,
               "admit_s": 0.0, "device_wait_s": 0.0, "device_span_s": 1.0}]
    after = [{"stage": "talker", "steps": 100, "rows": 6400, "busy_s": 8.0, "backlog": 0, "wall_s": 10.0,
              "admit_s": 1.0, "device_wait_s": 6.0, "device_span_s": 1.5}]
    (line,) = format_work(work_delta(before, after))
    assert line.endswith("12% admitting; device span 5.0 ms a step")  # (1.5 - 1.0) s / 100 steps
