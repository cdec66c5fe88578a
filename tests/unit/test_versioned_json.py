"""Baselines and calibrations share one versioned-JSON reader: errors in our words, exit 2."""

from __future__ import annotations

import json

import pytest

from tts_bench.verdicts.calibration import CALIBRATION_FILE, load_calibration
from tts_bench.errors import ConfigError
from tts_bench.gate.baseline import BASELINE_FILE, load_baseline, write_baseline


def test_missing_file_says_how_to_record_one(tmp_path):
    with pytest.raises(ConfigError, match=r"^error: no baseline at .* \(--baseline\); record one with "
                                          r"tts-bench baseline update"):
        load_baseline(tmp_path / "none.json")
    with pytest.raises(ConfigError, match=r"^error: no calibration at .* \(--calibration\); record one "
                                          r"with tts-bench calibrate"):
        load_calibration(tmp_path / "none.json")


def test_broken_json_is_a_config_error_not_a_traceback(tmp_path):
    path = tmp_path / "b.json"
    path.write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"is not valid JSON: .* \(--baseline\); restore it from git$"):
        load_baseline(path)


@pytest.mark.parametrize(("fmt", "load", "fix"), [
    (BASELINE_FILE, load_baseline, "re-record it"),
    (CALIBRATION_FILE, load_calibration, "rerun tts-bench calibrate"),
])  # fmt: skip
def test_another_version_names_both_versions_and_the_fix(tmp_path, fmt, load, fix):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({fmt.version_key: 0}), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value) == (f"error: {path} has {fmt.version_key} 0, this tts-bench reads "
                              f"{fmt.version} ({fmt.flag}); {fix}")  # fmt: skip


def test_written_baseline_reads_back_and_leaves_no_temporary(tmp_path):
    rtf = {"better": "lower", "statistic": "median", "center": 0.1, "samples": [0.1, 0.1]}
    doc = {**BASELINE_FILE.stamp(), "n_runs": 1, "sut_hash": "x", "backend": "embedded",
           "tiers": {"1x1": {"audio_rtf": rtf}}}
    decision = write_baseline(doc, tmp_path / "sub" / "b.json")
    assert decision.written and load_baseline(decision.path) == doc
    assert [p.name for p in decision.path.parent.iterdir()] == ["b.json"]


def test_an_integer_beyond_64_bits_in_a_center_is_judged_not_a_type_error(tmp_path):
    rtf = {"better": "lower", "statistic": "median", "center": 99999999999999999999, "samples": [0.1]}
    doc = {**BASELINE_FILE.stamp(), "n_runs": 1, "sut_hash": "x", "backend": "embedded",
           "tiers": {"1x1": {"audio_rtf": rtf}}}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    assert load_baseline(path)["tiers"]["1x1"]["audio_rtf"]["center"] == 99999999999999999999
    path.write_text(json.dumps(doc).replace("99999999999999999999", "9" * 21))
    with pytest.raises(ConfigError, match=r"holds an integer of 21 digits at tiers.1x1.audio_rtf.center "
                                          r"\(--baseline\)"):
        load_baseline(path)
