"""`tts-bench ab --calibration FILE`: a file given explicitly passes the test the automatic lookup
applies (profile, calibration key with the measured prompt count) and covers every tier asked
for, or the A/B is refused (exit 2) naming what differs, before any run directory exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tts_bench.verdicts.calibration import RunConditions, calibration_key, find_calibration
from tts_bench.cli import app
from tts_bench.config import config_to_dict, load_arms
from tts_bench.errors import ExitStatus
from tests.cli.in_process import invoke_app

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs/ab/synthetic.yaml"
SETS = ["synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1", "synthetic.first_chunk_delay_s=0.003",
        "synthetic.chunk_delay_s=0.003", "bench.warmup=1"]
PROFILE = "cpu-test"
QUIET = RunConditions(load_1min=0.1, cpu_count=None, machine=None)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The run's load as a quiet machine's: the calibration's load check is tested on its own."""
    monkeypatch.setattr(RunConditions, "now", classmethod(lambda cls: QUIET))


def ab(tmp_path: Path, calibration: Path, *args: str):
    argv = ["ab", "--config", str(CONFIG), *[x for s in SETS for x in ("--set", s)], "--repeats", "1",
            "--profile", PROFILE, "--result-dir", str(tmp_path / "runs"), "--calibration", str(calibration),
            "--format", "json", *args]
    return invoke_app(app, *argv)


def run_key(num_prompts: int) -> str:
    arm = next(iter(load_arms(CONFIG, SETS).values()))
    return calibration_key(config_to_dict(arm), num_prompts=num_prompts)


def write_calibration(tmp_path: Path, *, key: str, profile: str = PROFILE, tiers=("2x1",),
                      num_prompts: int = 4, load: float | None = 0.5) -> Path:
    metric = {"sd_mean": 0.01, "sd_median": 0.01, "df": 50, "false_verdicts_one_block": {"count": 1, "of": 50}}
    doc = {"calibration_version": 2, "case": "synth", "profile": profile, "key": key, "runs": 25,
           "num_prompts": num_prompts, "conditions": {"load_1min_max": load},
           "tiers": {t: {"metrics": {"audio_rtf": metric, "audio_ttfp_ms": metric}} for t in tiers}}
    path = tmp_path / f"synth.{profile}.calibration.json"
    path.write_text(json.dumps(doc))
    return path


def assert_refused(tmp_path: Path, result, status, *words: str) -> None:
    assert status == ExitStatus.USAGE, result.output
    message = str(result.exception)
    assert message.startswith("error: ") and "--calibration" in message, message
    for word in words:
        assert word in message, message
    assert not (tmp_path / "runs").exists()  # refused before the run directory is made


def test_a_calibration_of_another_config_is_refused_naming_both_keys(tmp_path):
    cal = write_calibration(tmp_path, key="0123456789ab")
    result, status = ab(tmp_path, cal, "--tiers", "2x1", "--num-prompts", "4")
    assert_refused(tmp_path, result, status, "another config", "0123456789ab", run_key(4))


def test_a_shipped_calibration_of_another_case_is_refused(tmp_path):
    # The probe's case: the tiny runner's calibration (32% block SD) on the synthetic config.
    cal = ROOT / "results/baselines/tiny-embedded.cpu-2core.calibration.json"
    result, status = invoke_app(app, "ab", "--config", str(CONFIG), "--tiers", "2x1", "--num-prompts", "12",
                                "--repeats", "1", "--profile", "cpu-2core", "--calibration", str(cal),
                                "--result-dir", str(tmp_path / "runs"))
    assert_refused(tmp_path, result, status, "another config", "tiny-embedded")


def test_a_calibration_of_another_profile_is_refused_naming_both(tmp_path):
    cal = write_calibration(tmp_path, key=run_key(4), profile="h200")
    result, status = ab(tmp_path, cal, "--tiers", "2x1", "--num-prompts", "4")
    assert_refused(tmp_path, result, status, "h200", PROFILE, "--profile")


def test_a_calibration_measured_with_another_prompt_count_names_the_counts(tmp_path):
    cal = write_calibration(tmp_path, key=run_key(32), num_prompts=32)
    result, status = ab(tmp_path, cal, "--tiers", "2x1", "--num-prompts", "4")
    assert_refused(tmp_path, result, status, "32 prompts", "measures 4", "--num-prompts")


def test_a_tier_the_calibration_has_no_entry_for_is_refused(tmp_path):
    cal = write_calibration(tmp_path, key=run_key(4), tiers=("4x1",))
    result, status = ab(tmp_path, cal, "--tiers", "2x1,4x1", "--num-prompts", "4")
    assert_refused(tmp_path, result, status, "no entry for tier 2x1", "covers 4x1")


def test_a_matching_calibration_is_used_for_the_one_block_interval(tmp_path):
    cal = write_calibration(tmp_path, key=run_key(4))
    result, status = ab(tmp_path, cal, "--tiers", "2x1", "--num-prompts", "4")
    assert status == ExitStatus.OK, result.output
    out = result.stdout  # a log line may precede the JSON document
    tier = json.loads(out[out.index("{"):])["tiers"][0]
    assert tier["interval"] == "calibrated" and tier["calibration"] == str(cal)


@pytest.mark.parametrize("profile, num_prompts, found", [(PROFILE, 4, True), ("h200", 4, False), (PROFILE, 8, False)])
def test_the_automatic_lookup_applies_the_same_test(tmp_path, profile, num_prompts, found):
    write_calibration(tmp_path, key=run_key(4))
    configs = [config_to_dict(c) for c in load_arms(CONFIG, SETS).values()]
    cal = find_calibration(configs, profile=profile, num_prompts=num_prompts, directory=tmp_path)
    assert (cal is not None) == found


def test_the_automatic_lookup_skips_an_unreadable_calibration_with_one_warning(tmp_path, caplog):
    (tmp_path / f"broken.{PROFILE}.calibration.json").write_text('{"calibration_version": 2, "case"')
    good = write_calibration(tmp_path, key=run_key(4))
    arm = next(iter(load_arms(CONFIG, SETS).values()))
    with caplog.at_level("WARNING", logger="tts_bench.verdicts.calibration"):
        found = find_calibration([config_to_dict(arm)], profile=PROFILE, num_prompts=4, directory=tmp_path)
    assert found is not None and found.path == str(good)
    (record,) = caplog.records
    assert record.getMessage().startswith(f"skipped {tmp_path / f'broken.{PROFILE}.calibration.json'} is not valid JSON")


def test_a_calibration_made_at_a_lower_load_is_refused_naming_both_loads(tmp_path, monkeypatch):
    cal = write_calibration(tmp_path, key=run_key(4), load=0.5)
    monkeypatch.setattr(RunConditions, "now", classmethod(lambda cls: RunConditions(2.0, None, None)))
    result, status = ab(tmp_path, cal, "--tiers", "2x1", "--num-prompts", "4")
    assert_refused(tmp_path, result, status, "busier now (1-min load 2)", "at most 0.5")
    configs = [config_to_dict(c) for c in load_arms(CONFIG, SETS).values()]
    assert find_calibration(configs, profile=PROFILE, num_prompts=4, directory=tmp_path,
                            conditions=RunConditions(2.0, None, None)) is None
    assert find_calibration(configs, profile=PROFILE, num_prompts=4, directory=tmp_path,
                            conditions=RunConditions(0.7, None, None)) is not None  # within 1.25 x + 0.25


def test_a_calibration_without_its_load_or_on_other_hardware_is_refused(tmp_path):
    from tts_bench.verdicts.calibration import load_calibration

    cal = load_calibration(write_calibration(tmp_path, key=run_key(4), load=None))
    configs = [config_to_dict(c) for c in load_arms(CONFIG, SETS).values()]
    assert "does not record the load" in cal.mismatch(configs, profile=PROFILE, num_prompts=4, conditions=QUIET)
    cal = load_calibration(write_calibration(tmp_path, key=run_key(4)))
    assert "made on a" in cal.conditions.__class__(0.5, 2, "x86_64").mismatch(RunConditions(0.1, 2, "aarch64"))
    assert "2 CPUs" in cal.conditions.__class__(0.5, 2, None).mismatch(RunConditions(0.1, 128, None))


def test_a_one_block_verdict_needs_the_calibrations_own_rate_at_most_five_percent(tmp_path):
    from tts_bench.verdicts.calibration import load_calibration

    path = write_calibration(tmp_path, key=run_key(4))
    doc = json.loads(path.read_text())
    doc["tiers"]["2x1"]["metrics"]["audio_ttfp_ms"]["false_verdicts_one_block"] = {"count": 22, "of": 400}
    doc["tiers"]["2x1"]["metrics"]["audio_rtf"]["false_verdicts_one_block"] = {"count": 0, "of": 10}
    path.write_text(json.dumps(doc))
    cal = load_calibration(path)
    assert cal.spread("2x1", "audio_ttfp_ms") is None and "22/400" in cal.one_block_unusable("2x1", "audio_ttfp_ms")
    assert cal.spread("2x1", "audio_rtf") is None and "judged 10 blocks" in cal.one_block_unusable("2x1", "audio_rtf")
    assert cal.raw_spread("2x1", "audio_rtf").sd_mean == 0.01  # still there for MDE planning
