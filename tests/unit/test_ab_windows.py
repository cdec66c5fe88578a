"""`tts-bench ab` in duration mode and open loop: warm phases excluded, the mode in every table
and the JSON, per-block throughput for the verdict, --resume of a cut duration phase."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tts_bench.ab import AbRequest, run_session
from tts_bench.commands.ab import render_result
from tts_bench.rundir.records import read_records
from tts_bench.rundir.results import RunDir
from tts_bench.load.windows import PHASES_FILE, phase_throughputs, read_phases

SYNTH = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
         "synthetic.first_chunk_delay_s=0.004", "synthetic.chunk_delay_s=0.004"]
WINDOW = ["bench.duration_s=0.3", "bench.window_s=0.1", "bench.ramp_s=0.05"]
# Every run here on virtual time (tests/virtual_clock.py): windows, open-loop send times and the
# throughput they count are what the delays imply, on any machine load.
pytestmark = pytest.mark.usefixtures("virtual_clock")


def _session(tmp_path: Path, *sets: str, **kw):
    req = AbRequest(tiers="2x1", repeats=2, num_prompts=4, sets=[*SYNTH, *sets], result_dir=tmp_path, **kw)
    return run_session(req)


def test_duration_run_warms_each_arm_once_and_leaves_the_warm_phase_out_of_everything(tmp_path):
    s = _session(tmp_path, *WINDOW)
    records = read_records(s.run_dir)
    warm = [r for r in records if r.repeat == -1]
    assert {r.arm for r in warm} == {"base", "test"} and all(r.warmup for r in warm)
    phases = read_phases(s.run_dir)
    assert [(p["arm"], p["repeat"]) for p in phases][:2] == [("base", -1), ("test", -1)]
    measured = [r for r in records if not r.warmup]
    assert {r.repeat for r in measured} == {0, 1} and all(r.window == "window" for r in measured)
    for arm in ("base", "test"):
        assert s.result.tiers[0].arms[arm].completed == sum(r.arm == arm and r.ok for r in measured)
    thr = phase_throughputs(s.run_dir)
    assert set(thr) == {"2x1"} and all(len(v) == 2 and all(x > 0 for x in v) for v in thr["2x1"].values())
    assert s.measurement["warm_phases"] == 2 and s.result.valid


def test_every_table_and_the_json_say_which_mode_ran(tmp_path):
    duration = _session(tmp_path, *WINDOW)
    text = render_result(duration.result, "md", measurement=duration.measurement)
    assert "**audio RTF (lower is faster, duration mode)**" in text
    assert "**audio TTFP ms (duration mode)**" in text and "**per block (duration mode)**" in text
    assert "mode: duration (0.3 s window after a ramp of >= 0.05 s, 0.1 s sub-windows" in text
    doc = json.loads(render_result(duration.result, "json", measurement=duration.measurement))
    m = doc["measurement"]
    assert m["mode"] == "duration" and m["duration_s"] == 0.3 and m["window_s"] == 0.1
    assert set(m["tiers"]["2x1"]["base"]) >= {"throughput", "stable", "rtf_p50", "rtf_p90", "rtf_p99"}
    recorded = json.loads(duration.run_dir.run_json.read_text())["result"]["measurement"]
    assert recorded["mode"] == "duration"
    count = _session(tmp_path)
    text = render_result(count.result, "md", measurement=count.measurement)
    assert "**audio RTF (lower is faster, count mode)**" in text and "mode: count" in text
    assert count.measurement["warm_phases"] == 0  # no warm phase by default in count mode


def test_open_loop_sends_at_the_same_times_in_both_arms(tmp_path):
    s = _session(tmp_path, request_rate=40.0)
    sends = defaultdict(dict)
    for r in read_records(s.run_dir):
        if not r.warmup:
            sends[r.arm][(r.repeat, r.request_id.split(":", 1)[1])] = r.t_send_s
    assert sends["base"].keys() == sends["test"].keys()
    assert max(abs(sends["base"][k] - sends["test"][k]) for k in sends["base"]) < 0.05
    assert json.loads(s.run_dir.run_json.read_text())["ab"]["open_loop"] == {"request_rate": 40.0,
                                                                           "burstiness": 1.0}


def test_resume_runs_a_cut_duration_phase_again_and_measures_only_the_new_attempt(tmp_path):
    s = _session(tmp_path, *WINDOW)
    path = s.run_dir.path / PHASES_FILE
    lines = path.read_text().splitlines(keepends=True)
    cut = json.loads(lines[-1])  # the last phase: its requests are on disk, its record is not
    path.write_text("".join(lines[:-1]))
    resumed = run_session(AbRequest(resume=s.run_dir.path))
    run = RunDir.open(resumed.run_dir.path)
    again = [p for p in read_phases(run) if (p["arm"], p["repeat"]) == (cut["arm"], cut["repeat"])]
    assert len(again) == 1 and again[0]["phase_id"] != cut["phase_id"]
    measured = [r for r in read_records(run) if not r.warmup and r.arm == cut["arm"] and r.repeat == cut["repeat"]]
    fresh = [r for r in measured if r.phase_id == again[0]["phase_id"]]
    assert fresh and all(r.request_id.endswith(".1") for r in fresh)
    ok = sum(r.ok for r in fresh)
    others = sum(r.ok for r in read_records(run) if not r.warmup and r.arm == cut["arm"] and r.repeat != cut["repeat"])
    assert resumed.result.tiers[0].arms[cut["arm"]].completed == ok + others  # the cut attempt is left out
    assert resumed.result.valid


def test_the_throughput_verdict_of_a_duration_run_compares_the_window_figures(tmp_path):
    s = _session(tmp_path, *WINDOW)
    windows = phase_throughputs(s.run_dir)["2x1"]
    tier = s.result.tiers[0]
    for arm in ("base", "test"):
        assert [tier.block_throughputs[arm][r] for r in (0, 1)] == windows[arm]
