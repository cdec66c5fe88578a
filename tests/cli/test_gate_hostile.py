"""`gate`, `baseline update` and `calibrate` refuse what they cannot do before they run anything.

Each refusal here used to come after the bench (results lost, a run directory left behind) or
not at all (an option ignored, a failed run judged "pass"). The runs are a tiny synthetic case
(3 ms per chunk, 8 prompts); "nothing ran" is checked as an empty --result-dir.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tts_bench.cli import app
from tts_bench.errors import ExitStatus
from tests.cli.gate_cases import record_baseline, synthetic_case
from tests.cli.in_process import invoke_app

ROOT = Path(__file__).resolve().parents[2]
FAST = ["synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
        "synthetic.first_chunk_delay_s=0.003", "synthetic.chunk_delay_s=0.003"]
TINY_CASE = ROOT / "configs/cases/tiny-embedded.yaml"
TINY_BASELINE = ROOT / "results/baselines/tiny-embedded.cpu-2core.json"


def invoke(*args: str):
    return invoke_app(app, *args, columns=160)


def made_runs(directory: Path) -> list[Path]:
    return sorted(directory.iterdir()) if directory.exists() else []


@pytest.fixture
def case(tmp_path: Path) -> Path:
    return synthetic_case(tmp_path / "synth.yaml", bench="{tiers: [2x1], num_prompts: 8, repeats: 1, warmup: 1}",
                          extra="min_samples: 4\n", overrides=FAST)


@pytest.fixture
def baseline(case: Path, tmp_path: Path) -> Path:
    return record_baseline(invoke, case, tmp_path / "synth.cpu-2core.json", run=1, result_dir=tmp_path / "base-runs")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def no_memory(monkeypatch):
    """A host with no free memory: the embedded stages' memory preflight refuses every arm."""
    import stages.platform

    monkeypatch.setattr(stages.platform, "host_available_bytes", lambda: 1)


def gate_run_case(case: Path, baseline: Path, runs: Path, *extra: str):
    return invoke("gate", "--run-case", str(case), "--baseline", str(baseline), "--profile", "cpu-2core",
                  "--result-dir", str(runs), *extra)


# -- 1. output locations are checked before the runs ----------------------------------------


def test_calibrate_out_that_is_a_file_is_refused_before_any_a_a(case, runs, tmp_path):
    file = tmp_path / "file.txt"
    file.write_text("hi")
    result, status = invoke("calibrate", str(case), "--runs", "1", "--out", str(file), "--result-dir", str(runs))
    assert status == ExitStatus.USAGE
    assert "--out" in str(result.exception) and str(file) in str(result.exception)
    assert made_runs(runs) == [] and file.read_text() == "hi"


def test_baseline_out_under_a_file_is_refused_before_the_runs(case, runs, tmp_path):
    file = tmp_path / "file.txt"
    file.write_text("hi")
    result, status = invoke("baseline", "update", "--case", str(case), "--run", "1", "--profile", "cpu-2core",
                            "--out", str(file / "x.json"), "--result-dir", str(runs))
    assert status == ExitStatus.USAGE
    assert "--out" in str(result.exception) and "is a file" in str(result.exception)
    assert made_runs(runs) == []


def test_tighten_only_over_a_non_json_file_is_refused_before_the_runs(case, runs, tmp_path):
    file = tmp_path / "old.json"
    file.write_text("not json")
    result, status = invoke("baseline", "update", "--case", str(case), "--run", "1", "--profile", "cpu-2core",
                            "--tighten-only", "--out", str(file), "--result-dir", str(runs))
    assert status == ExitStatus.USAGE
    assert "not valid JSON" in str(result.exception) and "(--out)" in str(result.exception)
    assert made_runs(runs) == []


def test_tighten_only_over_another_configs_baseline_is_refused_before_the_runs(case, baseline, runs, tmp_path):
    other = tmp_path / "slow.yaml"
    other.write_text(case.read_text().replace("overrides: [", "overrides: [synthetic.delay_scale=1.1, "))
    result, status = invoke("baseline", "update", "--case", str(other), "--run", "1", "--profile", "cpu-2core",
                            "--tighten-only", "--out", str(baseline), "--result-dir", str(runs))
    assert status == ExitStatus.USAGE
    assert "another config" in str(result.exception) and "--tighten-only" in str(result.exception)
    assert made_runs(runs) == []


# -- 2. gate's options are checked before the bench, and never ignored ----------------------


@pytest.mark.parametrize("extra, named", [
    (["--arm", "test"], "--arm"),
    (["--case", str(TINY_CASE)], "--case"),
])
def test_options_of_current_are_refused_with_run_case(case, baseline, runs, extra, named):
    result, status = gate_run_case(case, baseline, runs, *extra)
    assert status == ExitStatus.USAGE
    message = str(result.exception)
    assert f"{named} cannot be used with --run-case" in message and message.startswith("error: ")
    assert made_runs(runs) == []


def test_a_missing_wer_run_is_refused_before_the_bench_naming_wer_run(case, baseline, runs, tmp_path):
    result, status = gate_run_case(case, baseline, runs, "--wer-run", str(tmp_path / "nonexist"))
    assert status == ExitStatus.USAGE
    assert "(--wer-run)" in str(result.exception) and "--resume" not in str(result.exception)
    assert made_runs(runs) == []


def test_tiers_the_baseline_does_not_have_are_refused_before_the_bench(case, baseline, runs):
    result, status = gate_run_case(case, baseline, runs, "--set", "bench.tiers=[4x1]")
    assert status == ExitStatus.USAGE
    assert "bench.tiers" in str(result.exception) and "4x1" in str(result.exception)
    assert made_runs(runs) == []


@pytest.fixture
def recorded(case: Path, baseline: Path, tmp_path: Path) -> Path:
    runs = tmp_path / "recorded"
    result, status = gate_run_case(case, baseline, runs)
    assert status == ExitStatus.OK, result.output
    (run,) = made_runs(runs)
    return run


@pytest.mark.parametrize("extra, named", [
    (["--set", "garbage"], "--set"),
    (["--set", "synthetic.delay_scale=2"], "--set"),
    (["--result-dir", "elsewhere"], "--result-dir"),
])
def test_options_of_run_case_are_refused_with_current(recorded, baseline, extra, named):
    result, status = invoke("gate", "--current", str(recorded), "--baseline", str(baseline),
                            "--profile", "cpu-2core", *extra)
    assert status == ExitStatus.USAGE
    assert f"{named} cannot be used with --current" in str(result.exception)


# -- 3. gate --run-case and calibrate make ab's preflight before any run directory ----------


def test_gate_run_case_that_cannot_fit_leaves_no_run_directory(no_memory, runs):
    result, status = gate_run_case(TINY_CASE, TINY_BASELINE, runs)
    assert status == ExitStatus.USAGE
    assert "memory preflight" in str(result.exception)
    assert made_runs(runs) == []


def test_calibrate_that_cannot_fit_leaves_no_run_directory(no_memory, runs):
    result, status = invoke("calibrate", str(TINY_CASE), "--runs", "1", "--no-write", "--result-dir", str(runs))
    assert status == ExitStatus.USAGE
    assert "memory preflight" in str(result.exception)
    assert made_runs(runs) == []


def test_calibrate_records_each_a_a_as_complete(case, runs):
    result, status = invoke("calibrate", str(case), "--runs", "1", "--no-write", "--result-dir", str(runs),
                            "--set", "bench.min_effect_pct=50")
    assert status == ExitStatus.OK, result.output
    (run,) = made_runs(runs)
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


# -- 4. calibrate refuses what ab refuses ---------------------------------------------------


@pytest.mark.parametrize("extra, words", [
    (["--test-set", "bench.num_prompts=3"], "bench.*"),
    (["--test-set", "bench.repeats=3"], "bench.*"),
    (["--set", "bench.tiers=[2x1,2x1]"], "given twice"),
    (["--profile", "a/b"], "--profile"),
    (["--profile", ".."], "--profile"),
])
def test_calibrate_refuses_what_ab_refuses(case, runs, tmp_path, extra, words):
    result, status = invoke("calibrate", str(case), "--runs", "1", "--out", str(tmp_path / "out"),
                            "--result-dir", str(runs), *extra)
    assert status == ExitStatus.USAGE
    assert words in str(result.exception)
    assert made_runs(runs) == [] and not (tmp_path / "out").exists()


def test_gate_and_baseline_refuse_a_profile_that_is_not_a_file_name(case, baseline, runs):
    result, status = invoke("gate", "--run-case", str(case), "--profile", "a/b", "--result-dir", str(runs))
    assert status == ExitStatus.USAGE and "(--profile)" in str(result.exception)
    result, status = invoke("baseline", "update", "--case", str(case), "--run", "1", "--profile", "../x",
                            "--result-dir", str(runs))
    assert status == ExitStatus.USAGE and "(--profile)" in str(result.exception)
    assert made_runs(runs) == []


@pytest.mark.parametrize("profile", ["../evil", "a/b", ".hidden", ""])
def test_ab_refuses_a_profile_name_by_the_rule_of_gate_calibrate_and_baseline(case, runs, profile):
    ab, status = invoke("ab", "--config", str(ROOT / "configs/ab/synthetic.yaml"), "--tiers", "1x1",
                        "--num-prompts", "1", "--repeats", "1", "--profile", profile, "--result-dir", str(runs))
    assert status == ExitStatus.USAGE, ab.output
    gate, _ = invoke("gate", "--run-case", str(case), "--profile", profile, "--result-dir", str(runs))
    assert str(ab.exception) == str(gate.exception)  # one rule, one message
    assert f"bad profile {profile!r} (--profile)" in str(ab.exception)
    assert made_runs(runs) == []


def corrupt_calibrations() -> dict[str, tuple[str, str]]:
    """name: (file text, what the error must say), each a calibration no command can use."""
    good = {"calibration_version": 2, "case": "synth", "profile": "cpu-2core", "key": "k", "runs": 3,
            "tiers": {"2x1": {"metrics": {"audio_rtf": {"sd_mean": 0.01, "sd_median": 0.01, "df": 5}}}}}
    text = json.dumps(good)
    return {
        "no-tiers": (json.dumps({k: v for k, v in good.items() if k != "tiers"}), "it has no 'tiers'"),
        "truncated": (text[: len(text) // 2], "is not valid JSON"),
        "version-99": (json.dumps({**good, "calibration_version": 99}), "has calibration_version 99"),
        "tier-not-object": (json.dumps({**good, "tiers": {"2x1": [1]}}), "tiers.2x1 is [1], not an object"),
        "no-df": (text.replace(', "df": 5', ""), "it has no tiers.2x1.metrics.audio_rtf.'df'"),
        "nan-sd": (text.replace('"sd_mean": 0.01', '"sd_mean": NaN'), "sd_mean is nan, not a finite number"),
        "long-int": (text.replace('"runs": 3', '"runs": ' + "9" * 5000), "an integer of 5,000 digits at runs"),
    }


@pytest.mark.parametrize("name", list(corrupt_calibrations()))
def test_gate_refuses_a_broken_calibration_beside_the_baseline_before_the_run(case, baseline, runs, name, caplog):
    text, words = corrupt_calibrations()[name]
    cal = baseline.parent / "synth.cpu-2core.calibration.json"
    cal.write_text(text)
    result, status = gate_run_case(case, baseline, runs)
    assert status == ExitStatus.USAGE, result.output
    message = str(result.exception)
    assert message.startswith("error: ") and str(cal) in message and words in message, message
    assert f"(the calibration beside baseline {baseline})" in message or "(--calibration)" not in message
    assert "warning: error" not in caplog.text + result.output
    assert made_runs(runs) == []  # refused before the bench, not after it


@pytest.mark.parametrize("name", list(corrupt_calibrations()))
def test_ab_refuses_a_broken_calibration_by_the_same_rule(runs, tmp_path, name):
    text, words = corrupt_calibrations()[name]
    cal = tmp_path / "synth.cpu-2core.calibration.json"
    cal.write_text(text)
    result, status = invoke("ab", "--config", str(ROOT / "configs/ab/synthetic.yaml"), "--tiers", "2x1",
                            "--repeats", "1", "--profile", "cpu-2core", "--calibration", str(cal),
                            "--result-dir", str(runs))
    assert status == ExitStatus.USAGE, result.output
    message = str(result.exception)
    assert message.startswith("error: ") and str(cal) in message and words in message, message
    assert "(--calibration)" in message and made_runs(runs) == []


@pytest.mark.parametrize("where", ["n_runs", "tiers.2x1.audio_rtf.samples[0]"])
def test_gate_refuses_a_baseline_holding_a_5000_digit_integer_naming_file_and_key(case, baseline, runs, where):
    doc = json.loads(baseline.read_text())
    if where == "n_runs":
        doc["n_runs"] = "LONG"
    else:
        doc["tiers"]["2x1"]["audio_rtf"]["samples"][0] = "LONG"
    baseline.write_text(json.dumps(doc).replace('"LONG"', "7" * 5000))
    result, status = gate_run_case(case, baseline, runs)
    assert status == ExitStatus.USAGE, result.output
    assert str(result.exception) == (
        f"error: {baseline} holds an integer of 5,000 digits at {where} (--baseline); no value of a baseline "
        "has more than 20: restore it from git or re-record it")
    assert made_runs(runs) == []


# -- 5. gate --current judges complete runs only --------------------------------------------


@pytest.mark.parametrize("run_status", ["failed", "running", "interrupted"])
def test_gate_current_refuses_a_run_that_did_not_complete(recorded, baseline, tmp_path, run_status):
    run = tmp_path / f"copy-{run_status}"
    shutil.copytree(recorded, run)
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**doc, "status": run_status}))
    result, status = invoke("gate", "--current", str(run), "--baseline", str(baseline), "--profile", "cpu-2core")
    assert status == ExitStatus.INVALID_RUN
    assert repr(run_status) in str(result.exception) and "(--current)" in str(result.exception)
