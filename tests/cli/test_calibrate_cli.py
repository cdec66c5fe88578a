"""`tts-bench calibrate` on the synthetic backend: the file it writes, `ab` and `gate` reading it,
and the CI check failing when the arms differ."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tts_bench.verdicts.calibration import calibration_key, find_calibration, load_calibration
from tts_bench.cli import app
from tts_bench.config import config_to_dict
from tts_bench.errors import ExitStatus
from tts_bench.gate.calibrate import loo_false_verdicts
from tests.cli.in_process import invoke_app

ROOT = Path(__file__).resolve().parents[2]
# A small synthetic case: 3 ms per chunk, 8 prompts, one tier; an A/A takes a second or two.
FAST = ["--set", "synthetic.chunk_seconds=0.1", "--set", "synthetic.seconds_per_word=0.1",
        "--set", "synthetic.first_chunk_delay_s=0.003", "--set", "synthetic.chunk_delay_s=0.003"]


def invoke(*args: str):
    return invoke_app(app, *args, columns=160)


@pytest.fixture
def case(tmp_path: Path, virtual_clock) -> Path:
    """On virtual time (tests/virtual_clock.py): the A/As' spread is the same on any load."""
    path = tmp_path / "synth.yaml"
    path.write_text(
        f"name: synth\nconfig: {ROOT / 'configs/ab/synthetic.yaml'}\n"
        f"overrides: [{', '.join(FAST[1::2])}]\n"
        "bench: {tiers: [2x1], num_prompts: 8, repeats: 1, warmup: 1}\n"
        "thresholds: {audio_rtf: 10, audio_ttfp_ms: 20, audio_throughput: 10}\n"
    )
    return path


@pytest.fixture
def calibration(case: Path, tmp_path: Path) -> Path:
    # 10 A/As x 2 blocks: 20 one-block A/As judged, the fewest a one-block verdict may rest on.
    result, status = invoke("calibrate", str(case), "--runs", "10", "--profile", "cpu-2core",
                            "--out", str(tmp_path / "baselines"), "--set", "bench.min_effect_pct=25")
    assert status == ExitStatus.OK, result.output
    return tmp_path / "baselines" / "synth.cpu-2core.calibration.json"


def test_calibrate_writes_the_json_and_the_markdown(calibration):
    doc = json.loads(calibration.read_text())
    assert (doc["case"], doc["profile"], doc["runs"], doc["repeats"]) == ("synth", "cpu-2core", 10, 2)
    rtf = doc["tiers"]["2x1"]["metrics"]["audio_rtf"]
    assert rtf["df"] == 20 and rtf["sd_mean"] > 0  # 10 A/As x 2 blocks
    assert rtf["false_verdicts"]["of"] == 10 and len(rtf["false_verdicts"]["ci95"]) == 2
    assert doc["tiers"]["2x1"]["metrics"]["audio_throughput"]["df"] == 20
    assert doc["conditions"]["load_1min_max"] is not None and doc["conditions"]["tiers"] == ["2x1"]
    assert doc["false_verdicts"]["count"] == 0
    assert set(doc["tiers"]["2x1"]["phase_sd"]) == {"audio_rtf", "audio_ttfp_ms", "audio_throughput"}
    md = calibration.with_suffix(".md").read_text()
    assert md.startswith("**A/A calibration: synth on cpu-2core** (10 A/As x 2 repeats")
    assert "Clopper-Pearson" in md
    cal = load_calibration(calibration)
    assert cal.raw_spread("2x1").df == 20 and cal.mde_pct("2x1", blocks=1) > 0


def test_ab_with_one_repeat_uses_the_matching_calibration(calibration, tmp_path, monkeypatch):
    from tts_bench.verdicts.calibration import RunConditions

    # The load check has its own tests (test_ab_calibration_flag.py); here the machine is quiet.
    monkeypatch.setattr(RunConditions, "now", classmethod(lambda cls: RunConditions(0.0, None, None)))
    args = ["ab", "--config", str(ROOT / "configs/ab/synthetic.yaml"), *FAST, "--set", "bench.warmup=1",
            "--set", "bench.min_effect_pct=25", "--tiers", "2x1", "--num-prompts", "8", "--repeats", "1",
            "--result-dir", str(tmp_path / "runs"), "--calibration", str(calibration)]
    result, status = invoke(*args, "--format", "md")
    assert status == ExitStatus.OK, result.output
    assert "unresolved" not in result.stdout
    assert f"use the calibrated run-to-run SD of synth on cpu-2core ({calibration}, 10 A/As)" in result.stdout
    assert "calibration synth.cpu-2core 2x1: audio RTF MDE at 1/2/4/8 repeats" in result.stdout
    doc = json.loads(invoke(*args, "--format", "json")[0].stdout)
    tier = doc["tiers"][0]
    assert tier["interval"] == "calibrated" and tier["calibration"] == str(calibration)
    assert tier["ci95_pct"] is not None and tier["mde_pct"] is not None
    assert doc["calibration"]["case"] == "synth"


def test_the_calibration_is_found_by_key_and_profile(calibration, case):
    from tts_bench.config import load_arms

    arms = load_arms(ROOT / "configs/ab/synthetic.yaml", [*FAST[1::2], "bench.warmup=1", "bench.min_effect_pct=25"])
    configs = [config_to_dict(c) for c in arms.values()]
    found = find_calibration(configs, profile="cpu-2core", num_prompts=8, directory=calibration.parent)
    assert found is not None and found.path == str(calibration)
    assert find_calibration(configs, profile="h200", num_prompts=8, directory=calibration.parent) is None
    assert find_calibration(configs, profile="cpu-2core", num_prompts=16, directory=calibration.parent) is None
    # The key ignores the tier list and repeat count (the calibration is per tier; K is the run's).
    d = configs[0]
    assert calibration_key({**d, "bench": {**d["bench"], "repeats": 7, "tiers": ["9x9"]}}, num_prompts=8) \
        == calibration_key(d, num_prompts=8)


def test_the_ci_check_fails_when_the_arms_differ(case, tmp_path):
    # A 25% minimum effect keeps a load burst on a shared CPU from failing the A/A here; the
    # tripled delay (+200%) stays significant even with two blocks (t(0.975, 1) = 12.7).
    check = ["--runs", "1", "--no-write", "--fail-on-false-verdict", "--set", "bench.seed=0",
             "--set", "bench.min_effect_pct=25"]
    ok, status = invoke("calibrate", str(case), *check, "--out", str(tmp_path / "nothing"))
    assert status == ExitStatus.OK, ok.output
    assert not (tmp_path / "nothing").exists()
    bad, status = invoke("calibrate", str(case), *check, "--test-set", "synthetic.delay_scale=3.0")
    assert status == ExitStatus.PERF_REGRESSION
    assert "false verdicts (audio RTF faster/slower in an A/A, any tier) at 2 repeats: 1/1" in bad.stdout


def test_leave_one_out_false_verdicts_judge_each_block_by_the_others():
    d = np.log(np.r_[np.full(40, 1.01), np.full(40, 0.99), [1.5]])
    # The 1.5x block is far outside +-1.96 * SD of the others; the others are within.
    assert loo_false_verdicts(d, min_effect_pct=2.0) == 1
    assert loo_false_verdicts(d, min_effect_pct=60.0) == 0
    # Below 3 blocks nothing is judged: the column reads n/a, not "0/2 = 0.0%".
    assert loo_false_verdicts(d[:2], min_effect_pct=2.0) is None
    from tts_bench.gate.calibrate import _fmt_rate, _metric_doc

    assert _fmt_rate(_metric_doc(d[:2], d[:2], 2.0)["false_verdicts_one_block"]) == "n/a"
    assert _fmt_rate(_metric_doc(d, d, 2.0)["false_verdicts_one_block"]).startswith("1/81 = ")


def test_gate_reads_the_calibration_next_to_the_baseline(case, calibration, tmp_path):
    base = calibration.parent / "synth.cpu-2core.json"
    result, status = invoke("baseline", "update", "--case", str(case), "--run", "2", "--profile", "cpu-2core",
                            "--result-dir", str(tmp_path / "runs"), "--out", str(base))
    assert status == ExitStatus.OK, result.output
    result, status = invoke("gate", "--run-case", str(case), "--baseline", str(base), "--profile", "cpu-2core",
                            "--result-dir", str(tmp_path / "runs"), "--format", "md")
    assert status == ExitStatus.OK, result.output
    header = [c.strip() for c in result.stdout.splitlines()[2].strip("|").split("|")]
    assert header == ["tier", "metric", "baseline", "current", "delta", "threshold", "p-value", "run p", "mark"]
    assert "note: run-level test against the calibrated run-to-run SD" in result.stdout
