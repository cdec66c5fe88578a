"""`tts-bench ab --report RUN` (tts_bench.ab.report): a recorded run's complete blocks, tabled as
a finished run's, with nothing run and the run left as it was (a later --resume finishes it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tts_bench.ab import AbRequest, run_session
from tts_bench.ab.report import complete_blocks
from tts_bench.errors import ConfigError
from tts_bench.load.windows import PHASES_FILE, measured_phases
from tts_bench.rundir.records import read_records

SYNTH = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
         "synthetic.first_chunk_delay_s=0.004", "synthetic.chunk_delay_s=0.004"]
WINDOW = ["bench.duration_s=0.3", "bench.window_s=0.1", "bench.ramp_s=0.05"]
pytestmark = pytest.mark.usefixtures("virtual_clock")


def _run(tmp_path: Path, *sets: str, repeats: int = 3):
    return run_session(AbRequest(tiers="2x1", repeats=repeats, num_prompts=4, sets=[*SYNTH, *sets],
                                 result_dir=tmp_path))


def _files(run_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.path.iterdir()) if p.is_file()}


def _cut_last_phase(run_dir) -> dict:
    """As a kill in the last phase leaves it: its requests on disk, its phase record not."""
    path = run_dir.path / PHASES_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    return json.loads(lines[-1])


@pytest.mark.parametrize("window", [WINDOW, []], ids=["duration", "count"])
def test_report_of_a_finished_run_is_its_recorded_result(tmp_path, window):
    done = _run(tmp_path, *window, repeats=2)
    before = _files(done.run_dir)
    report = run_session(AbRequest(report=done.run_dir.path))
    assert report.result.to_dict() == done.result.to_dict()
    assert report.measurement == done.measurement and report.work == done.work
    assert _files(done.run_dir) == before  # read only: status, result, lock untouched


def test_a_cut_run_reports_its_complete_blocks_only_and_resumes_after(tmp_path):
    s = _run(tmp_path, *WINDOW)
    cut = _cut_last_phase(s.run_dir)
    assert cut["repeat"] == 2  # block 2's second phase: its first is a lone complete phase
    lone = next(arm for arm in ("base", "test") if arm != cut["arm"])
    assert (lone, "2x1", 2) in measured_phases(s.run_dir)
    s.run_dir.update(status="interrupted")
    before = _files(s.run_dir)

    report = run_session(AbRequest(report=s.run_dir.path))
    tier = report.result.tiers[0]
    assert tier.rtf.blocks == 2 and tier.throughput.blocks == 2
    measured = [r for r in read_records(s.run_dir) if not r.warmup and r.ok and r.window == "window"]
    for arm in ("base", "test"):
        assert tier.arms[arm].completed == sum(r.arm == arm and r.repeat < 2 for r in measured)
        assert set(tier.block_throughputs[arm]) == {0, 1}
        assert len(report.measurement["tiers"]["2x1"][arm]["throughput"]) == 2
    assert {w["repeat"] for w in report.work} <= {0, 1}
    assert _files(s.run_dir) == before and report.run_dir.doc["status"] == "interrupted"

    finished = run_session(AbRequest(resume=s.run_dir.path))
    assert finished.result.tiers[0].rtf.blocks == 3 and finished.run_dir.doc["status"] == "complete"
    # the cut attempt's requests stay on disk under their own phase_id: left out, as the resume did
    again = run_session(AbRequest(report=s.run_dir.path))
    assert again.result.to_dict() == finished.result.to_dict()


def test_complete_blocks_need_a_phase_of_every_arm():
    phases = {("a", "2x1", 0): {}, ("b", "2x1", 0): {}, ("a", "2x1", 1): {}, ("b", "4x2", 0): {}}
    assert complete_blocks(phases, ["a", "b"]) == {("2x1", 0)}
    assert complete_blocks(phases, ["a"]) == {("2x1", 0), ("2x1", 1)}


def test_a_run_without_a_complete_block_is_a_usage_error_naming_resume(tmp_path):
    s = _run(tmp_path, *WINDOW, repeats=1)
    _cut_last_phase(s.run_dir)
    with pytest.raises(ConfigError, match=r"no complete block yet \(1 phase\(s\) recorded.*--resume"):
        run_session(AbRequest(report=s.run_dir.path))


def test_report_and_resume_together_are_a_usage_error(tmp_path):
    with pytest.raises(ConfigError, match="--report reads a run and --resume finishes one"):
        run_session(AbRequest(report=tmp_path, resume=tmp_path))


def test_a_run_that_is_no_ab_is_refused_naming_report(tmp_path):
    from tts_bench.rundir.results import RunDir

    run = RunDir.create(tmp_path, "mem", command_line="tts-bench mem", configs={"base": {}, "test": {}}, lock=False)
    with pytest.raises(ConfigError, match=r"is not an A/B run \(--report\)"):
        run_session(AbRequest(report=run.path))


@pytest.mark.parametrize("line,what", [('{"arm": "base", garbage', "is not valid JSON"),
                                       ('["base", "2x1", 0]', "is not a phase record")])
def test_a_damaged_phase_record_is_a_usage_error_naming_its_line(tmp_path, line, what):
    s = _run(tmp_path, *WINDOW, repeats=1)
    path = s.run_dir.path / PHASES_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([lines[0], line + "\n", *lines[1:]]))
    with pytest.raises(ConfigError, match=rf"phases.jsonl:2 {what}.*\(run directory\)"):
        run_session(AbRequest(report=s.run_dir.path))
    if what == "is not valid JSON":  # the same bytes as an unterminated last line: torn, skipped
        path.write_text("".join([*lines, line]))
        assert run_session(AbRequest(report=s.run_dir.path)).result.tiers[0].rtf is not None
