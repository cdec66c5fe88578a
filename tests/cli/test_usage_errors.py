"""Usage errors exit 2 everywhere, name the offending option or key, print no traceback, and
leave no run directory behind (nothing is created before the inputs are checked).

Through `tts_bench.cli.main`, where exceptions become exit codes: in this process for speed
(`main_in_process`), and once as a real process (`python -m tts_bench.cli`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.in_process import main_in_process

ROOT = Path(__file__).resolve().parents[2]
SYNTH = ["--config", "configs/ab/synthetic.yaml"]




def cli(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "tts_bench.cli", *args], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["ab", *SYNTH, "--num-prompts", "abc"], "'--num-prompts'"),
        (["ab", *SYNTH, "--num-prompts", "0"], "'--num-prompts'"),
        (["ab", *SYNTH, "--repeats", "0"], "'--repeats'"),
        (["ab", *SYNTH, "--repeats=-2"], "'--repeats'"),
        (["ab", *SYNTH, "--prompts-per-client", "0"], "'--prompts-per-client'"),
        (["ab", *SYNTH, "--tiers="], "--tiers"),
        (["ab", *SYNTH, "--tiers=99999999999999999999x1"], "--tiers"),
        (["ab", *SYNTH, "--tiers=8x65"], "--tiers"),
        (["ab", *SYNTH, "--num-prompts", "100001"], "'--num-prompts'"),
        (["ab", *SYNTH, "--set", "bench.repeats=0"], "bench.repeats"),
        (["ab", *SYNTH, "--set", "bench.disable_shuffle=yes"], "bench.disable_shuffle"),
        (["ab", *SYNTH, "--no-such-option"], "--no-such-option"),
        (["mem", *SYNTH, "--num-prompts", "0"], "'--num-prompts'"),
        (["mem", *SYNTH, "--tier", ""], "mem.tier"),
        (["wer", *SYNTH, "--num-prompts", "-1"], "'--num-prompts'"),
        (["serve", *SYNTH, "--replicas", "0"], "'--replicas'"),
        (["baseline", "update", "--case", "configs/cases/synthetic.yaml", "--run", "-1"], "'--run'"),
        # The plan both arms share cannot differ per arm: it was recorded but never used.
        (["ab", *SYNTH, "--test-set", "bench.num_prompts=8"], "bench.*"),
        (["ab", *SYNTH, "--base-set", "bench.timeout_s=1"], "bench.*"),
        (["mem", *SYNTH, "--test-set", "mem.interval_s=5"], "mem.*"),
        (["wer", *SYNTH, "--test-set", "wer.num_prompts=3"], "wer.*"),
        (["ab", *SYNTH, "--until-resolved", "--max-repeats", "0"], "--max-repeats"),
        (["ab", *SYNTH, "--until-resolved", "--repeats", "5", "--max-repeats", "2"], "--repeats 5 is above --max-repeats 2"),
        (["ab", *SYNTH, "--until-resolved", "--set", "bench.repeats=5", "--max-repeats", "2"],
         "bench.repeats 5 is above --max-repeats 2"),
        (["wer", *SYNTH, "--arms", "nope"], "'nope'"),
        (["wer", *SYNTH, "--arms", "base,nope"], "'nope'"),
        (["ab", "--tiers", "1x1", "--set", "runner.devices=[99]"], "runner.devices"),  # embedded default
        (["ab", *SYNTH, "--tiers", "1x1,2x1,1x1"], "1x1 given twice"),
        (["ab", *SYNTH, "--voice-cache", "hit"], "synthetic backend does not report"),
        (["wer", *SYNTH, "--generate-only", "--transcribe-only", "."], "--generate-only and --transcribe-only"),
        (["serve", *SYNTH, "--port", "-1"], "bad --port -1"),
        (["profile", "--rows", "100000"], "--rows"),
        (["profile", "--rows", "1,1"], "--rows"),
        (["calibrate", "synthetic", "--runs", "1000000000"], "'--runs'"),
        (["calibrate", "synthetic", "--runs", "2", "--repeats", "101"], "'--repeats'"),
    ],
)
def test_usage_errors_exit_2_naming_the_option_without_a_traceback(tmp_path, monkeypatch, args, named):
    monkeypatch.chdir(tmp_path)
    extra = ["--result-dir", str(tmp_path / "runs")] if args[0] not in ("serve", "profile") else []
    proc = main_in_process(*args, *extra)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert named in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_bad_environment_flag_exits_2_naming_the_variable_before_anything_starts(tmp_path):
    proc = cli(tmp_path, "ab", "--result-dir", str(tmp_path / "runs"),
               env={"TALKER_CODEC_FUSED_PRELUDE": "maybe"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [lines[-1]] and "environment variable TALKER_CODEC_FUSED_PRELUDE" in lines[-1]
    assert not (tmp_path / "runs").exists()


def test_a_real_process_exits_2_for_a_bad_option_value(tmp_path):
    proc = cli(tmp_path, "ab", *SYNTH, "--num-prompts", "abc", "--result-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2 and "'--num-prompts'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_resume_of_a_file_is_a_usage_error(tmp_path):
    not_a_dir = tmp_path / "run.json"
    not_a_dir.write_text("{}")
    proc = main_in_process("ab", "--resume", str(not_a_dir))
    assert proc.returncode == 2, proc.stderr
    assert "not a run directory" in proc.stderr and str(not_a_dir) in proc.stderr
    assert "Traceback" not in proc.stderr and "NotADirectoryError" not in proc.stderr


def test_an_embedded_ab_refuses_a_missing_voice_before_the_run_exists(tmp_path, monkeypatch):
    # The stage runner clones each request's voice: a meta.lst naming a wav that is not there
    # used to start the stages and fail every request (exit 5); `wer` already refused it.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "meta.lst").write_text("u1|prompt|nope.wav|hello world\nu2|prompt|nope.wav|good morning\n")
    args = ["ab", "--tiers", "1x1", "--set", f"prompts.meta={tmp_path / 'meta.lst'}", "--result-dir", str(tmp_path / "runs")]
    proc = main_in_process(*args)
    assert proc.returncode == 2 and "'u1' does not exist" in proc.stderr and "meta.lst:1" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()
    # A backend that clones no voice never reads the wavs, so the same list runs there.
    synth = main_in_process(*args, *SYNTH, "--num-prompts", "2", "--repeats", "1", "--format", "json")
    assert synth.returncode == 0, synth.stderr


@pytest.mark.parametrize("args", [
    ["--prompts-per-client", "100000", "--tiers", "4096x1"],
    ["--prompts-per-client", "50000", "--tiers", "4x1"],
    ["--set", "bench.prompts_per_client=50000", "--tiers", "4x1"],
    ["--set", "bench.prompts_per_client=50000", "--tiers", "1x1,3x1"],
])
def test_the_per_tier_prompt_limit_applies_to_tiers_from_the_command_line(tmp_path, monkeypatch, args):
    from tts_bench.rundir.results import RunDir

    def no_run(*a, **k):  # what the limit prevents: a run of 200,000+ requests per tier
        raise AssertionError("a run directory was made")

    monkeypatch.setattr(RunDir, "create", no_run)
    proc = main_in_process("ab", *SYNTH, "--set", "bench.tiers=[1x1]", *args, "--result-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    line = proc.stderr.strip().splitlines()[-1]
    assert "bench.prompts_per_client x C of " in line and "must be in 1..100000" in line, line
    assert "(--tiers, --prompts-per-client or --set bench.prompts_per_client)" in line, line
