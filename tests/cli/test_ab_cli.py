"""`tts-bench ab` through typer's CliRunner (and a real process for exit codes and SIGKILL)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli.held_cli import HELD_CLI
from tts_bench.cli import app
from tts_bench.errors import ExitStatus
from tts_bench.rundir.results import RunDir

ROOT = Path(__file__).resolve().parents[2]
SYNTH = ["--config", str(ROOT / "configs/ab/synthetic.yaml"), "--repeats", "1",
         "--set", "backend=synthetic", "--set", "synthetic.chunk_seconds=0.1",
         "--set", "synthetic.seconds_per_word=0.1", "--set", "synthetic.first_chunk_delay_s=0.003",
         "--set", "synthetic.chunk_delay_s=0.003", "--set", "bench.warmup=2"]


def invoke(tmp_path: Path, *args: str):
    # standalone_mode=False: the command's ExitStatus comes back as result.return_value, the way
    # tts_bench.cli.main turns it into the process exit code.
    result = CliRunner().invoke(
        app, ["ab", *SYNTH, "--result-dir", str(tmp_path), *args],
        env={"NO_COLOR": "1", "COLUMNS": "120"}, standalone_mode=False,
    )
    if result.exception is not None:
        raise result.exception
    return result


def test_markdown_table_is_shaped_like_the_seed(tmp_path):
    result = invoke(tmp_path, "--tiers", "2x1,4x2", "--num-prompts", "4", "--repeats", "2", "--format", "md")
    assert result.return_value == ExitStatus.OK
    lines = result.stdout.splitlines()
    assert lines[0] == "**audio RTF (lower is faster, count mode)**"
    cells = [c.strip() for c in lines[2].strip("|").split("|")]  # widths follow the numbers
    assert cells == ["Tier (conc x repl)", "base mean / median", "test mean / median", "delta (mean)",
                     "95% CI", "verdict", "MDE"]
    assert re.fullmatch(r"\| -+ \| -+ \| -+ \| -+ \| -+ \| -+ \| -+ \|", lines[3])
    row = re.compile(r"\| 2 x 1 +\| \d\.\d{4} / \d\.\d{4} +\| \d\.\d{4} / \d\.\d{4} +\| [+-]\d+\.\d% +"
                     r"\| \[[+-]\d+\.\d%, [+-]\d+\.\d%\] +\| (within noise(; could not resolve < ~?\d+\.\d%"
                     r"( \(MDE from 2 blocks\))?|; below the 2% minimum effect)?|faster|slower) +\| ~?\d+\.\d% +\|")
    assert row.fullmatch(lines[4]), lines[4]
    assert lines[5].startswith("| 4 x 2 ")
    assert "**audio TTFP ms (count mode)**" in lines
    assert "identical outputs (test vs base): 2x1: 8/8, 4x2: 8/8" in lines
    assert "\x1b[" not in result.stdout  # NO_COLOR, not a TTY


def test_one_repeat_is_unresolved_and_says_why_and_two_are_not(tmp_path):
    one = invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--format", "md")
    assert one.stdout.splitlines()[-2].startswith("note: 1 repeat: one block has no run-to-run spread")
    row = one.stdout.splitlines()[4]
    assert "| n/a " in row and "unresolved (1 repeat)" in row
    doc = json.loads(invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--format", "json").stdout)
    (tier,) = doc["tiers"]
    assert tier["verdict"] == "unresolved (1 repeat)" and tier["ci95_pct"] is None and tier["mde_pct"] is None
    two = invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--format", "md", "--repeats", "2")
    assert "note: 1 repeat" not in two.stdout
    doc = json.loads(invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--repeats", "2",
                            "--format", "json").stdout)
    assert doc["repeats"] == 2


def test_json_is_one_document_with_the_documented_keys(tmp_path):
    result = invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--format", "json", "--repeats", "2",
                    "--test-set", "synthetic.delay_scale=1.1")
    doc = json.loads(result.stdout)
    (tier,) = doc["tiers"]
    assert tier["tier"] == "2x1"
    for arm in ("base", "test"):
        assert {"mean_audio_rtf", "median_audio_rtf", "completed", "failed"} <= set(tier["arms"][arm])
        assert tier["arms"][arm]["completed"] == 8
    assert isinstance(tier["delta_mean_pct"], float) and len(tier["ci95_pct"]) == 2
    assert tier["verdict"] in ("faster", "slower", "within noise")
    assert isinstance(tier["mde_pct"], float) and tier["blocks"] == 2 and tier["interval"] == "t"
    assert tier["verdict_detail"].startswith(tier["verdict"])
    assert isinstance(tier["ttfp"]["mde_pct"], float)
    run = RunDir.open(doc["run_dir"])
    assert run.doc["status"] == "complete" and run.doc["result"]["tiers"][0]["tier"] == "2x1"
    assert all(r["audio_sha256"] for r in run.read_requests())


def test_csv_format_and_invalid_run_exit_code(tmp_path):
    result = invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--format", "csv",
                    "--test-set", "synthetic.fail_every=2")
    assert result.return_value == ExitStatus.INVALID_RUN
    assert result.stdout.startswith("Tier (conc x repl),base mean / median,")


def test_resume_via_the_cli_completes_a_truncated_run(tmp_path):
    first = json.loads(invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "6", "--format", "json").stdout)
    run = RunDir.open(first["run_dir"])
    lines = run.requests_path.read_text().splitlines(keepends=True)
    run.requests_path.write_text("".join(lines[:5]))
    again = json.loads(invoke(tmp_path, "--resume", first["run_dir"], "--format", "json").stdout)
    assert again["tiers"][0]["arms"]["base"]["completed"] == 6
    ids = [r["request_id"] for r in run.read_requests()]
    assert len(ids) == len(lines) and max(Counter(ids).values()) == 1


def test_report_via_the_cli_tables_a_recorded_run_and_changes_nothing(tmp_path):
    first = json.loads(invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--repeats", "2",
                              "--format", "json").stdout)
    run = RunDir.open(first["run_dir"])
    before = run.run_json.read_bytes()
    # --report ignores the other options (here: the config's, given by invoke) as --resume does
    result = invoke(tmp_path, "--report", first["run_dir"], "--format", "json")
    assert result.return_value == ExitStatus.OK
    doc = json.loads(result.stdout)
    assert doc["tiers"] == first["tiers"] and doc["run_dir"] == first["run_dir"]
    assert run.run_json.read_bytes() == before


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:  # a hang guard
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "tts_bench.cli", "ab", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_unknown_set_key_exits_2_and_names_the_key(tmp_path):
    proc = _cli("--config", "configs/ab/synthetic.yaml", "--set", "bench.num_promts=3",
                "--result-dir", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "bench.num_promts" in proc.stderr and "num_prompts" in proc.stderr
    assert proc.stdout == ""


def test_sigkill_mid_tier_then_resume_matches_an_uninterrupted_run(tmp_path):
    args = [*SYNTH, "--set", "synthetic.first_chunk_delay_s=0.02", "--tiers", "2x1,4x1",
            "--num-prompts", "12", "--format", "json", "--result-dir", str(tmp_path)]
    # The 21st request of 56 (the first tier's second arm) is held until the kill: the kill lands
    # mid-tier by an event, however slow the machine (a clock here raced the run's end).
    marker = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "HOLD_AFTER": "20", "HOLD_MARKER": str(marker)}
    proc = subprocess.Popen([sys.executable, HELD_CLI, "ab", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # a hang guard only
        while not marker.exists():
            assert proc.poll() is None, f"the run ended ({proc.returncode}) before its 21st request"
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (jsonl,) = tmp_path.glob("*/requests.jsonl")
    partial = len(jsonl.read_text().splitlines())
    done = _cli("--resume", str(jsonl.parent), "--format", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    for tier in doc["tiers"]:
        for arm in ("base", "test"):
            assert tier["arms"][arm]["completed"] == 12 and tier["arms"][arm]["failed"] == 0
    ids = [r["request_id"] for r in RunDir.open(jsonl.parent).read_requests()]
    assert max(Counter(ids).values()) == 1
    assert len(ids) > partial
    assert sum(not i.split(":")[-1].startswith("w") for i in ids) == 2 * 2 * 12


def test_disable_shuffle_sends_prompts_in_file_order_to_both_arms(tmp_path):
    from tts_bench.inputs.prompts import load_prompts

    doc = json.loads(invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "5", "--disable-shuffle",
                            "--format", "json").stdout)
    records = [r for r in RunDir.open(doc["run_dir"]).read_requests() if not r["warmup"]]
    expected = [p.utt for p in load_prompts("builtin:seed-tts-en")[:5]]
    for arm in ("base", "test"):
        mine = sorted((r for r in records if r["arm"] == arm), key=lambda r: r["request_id"])
        assert [r["utt"] for r in mine] == expected


def test_until_resolved_says_what_stopped_it_in_the_table_and_the_json(tmp_path):
    md = invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--format", "md", "--until-resolved",
                "--max-repeats", "4", "--set", "bench.min_effect_pct=0.0001")
    line = next(x for x in md.stdout.splitlines() if x.startswith("until-resolved:"))
    assert line.startswith("until-resolved: stopped by max repeats (target half-width < 5e-05%, max repeats 4)")
    assert "repeats 2x1 4" in line
    doc = json.loads(invoke(tmp_path, "--tiers", "2x1", "--num-prompts", "4", "--format", "json",
                            "--until-resolved", "--set", "bench.min_effect_pct=400").stdout)
    # Resolved at once, but never before bench.until_resolved_min_repeats (4) blocks.
    assert doc["until_resolved"]["stopped_by"] == "resolved" and doc["until_resolved"]["repeats"] == {"2x1": 4}
    assert RunDir.open(doc["run_dir"]).doc["ab"]["until_resolved"]["target_half_width_pct"] == 200.0


def test_until_resolved_options_are_checked(tmp_path):
    from tts_bench.errors import ConfigError

    with pytest.raises(ConfigError, match="only apply with --until-resolved"):
        invoke(tmp_path, "--tiers", "2x1", "--budget", "5")
    with pytest.raises(ConfigError, match="max-repeats must be in \\[2, 100\\], got 1"):
        invoke(tmp_path, "--tiers", "2x1", "--until-resolved", "--max-repeats", "1")
