"""Every command that reads a recorded run (`ab --resume`, `gate --current`, `wer
--transcribe-only`, `baseline update --from`) answers a damaged run with exit 2 and one line naming
the file, and every command that makes runs refuses an unusable `--result-dir` with exit 2; both
come from the shared readers in tts_bench/rundir/results.py, so one real process entry point
(`tts_bench.cli.main`, in-process) per command is checked here."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli.in_process import main_in_process

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--set", "synthetic.chunk_seconds=0.1", "--set", "synthetic.seconds_per_word=0.1",
        "--set", "synthetic.first_chunk_delay_s=0.003", "--set", "synthetic.chunk_delay_s=0.003"]
AB = ["ab", "--config", str(ROOT / "configs/ab/synthetic.yaml"), *FAST, "--set", "bench.warmup=1",
      "--tiers", "2x1", "--num-prompts", "2", "--repeats", "1"]
WER = ["wer", "--config", str(ROOT / "configs/wer/seed-tts-en.yaml"), "--set", "backend=synthetic", *FAST,
       "--num-prompts", "2", "--generate-only"]


def made_run(root: Path, argv: list[str]) -> Path:
    proc = main_in_process(*argv, "--result-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"ab": made_run(root / "ab", AB), "wer": made_run(root / "wer", WER)}


def readers(run: Path, out: Path) -> dict[str, list[str]]:
    return {
        "ab --resume": ["ab", "--resume", str(run)],
        "gate --current": ["gate", "--current", str(run), "--baseline",
                           str(ROOT / "results/baselines/synthetic.cpu-2core.json")],
        "wer --transcribe-only": ["wer", "--transcribe-only", str(run)],
        "baseline update --from": ["baseline", "update", "--case", str(ROOT / "configs/cases/synthetic.yaml"),
                                   "--from", str(run), "--out", str(out / "baseline.json")],
    }


def _random_bytes(run: Path) -> Path:
    (run / "run.json").write_bytes(bytes(range(128, 256)) * 2)
    return run / "run.json"


def _a_directory(name: str):
    def damage(run: Path) -> Path:
        (run / name).unlink()
        (run / name).mkdir()
        return run / name
    return damage


def _edit_run_json(change):
    def damage(run: Path) -> Path:
        doc = json.loads((run / "run.json").read_text())
        change(doc)
        (run / "run.json").write_text(json.dumps(doc))
        return run / "run.json"
    return damage


def _first_line(text: str):
    def damage(run: Path) -> Path:
        lines = (run / "requests.jsonl").read_text().splitlines()
        (run / "requests.jsonl").write_text("\n".join([text, *lines[1:]]) + "\n")
        return run / "requests.jsonl"
    return damage


RUN_JSON_DAMAGE = {
    "random bytes": _random_bytes,
    "run.json a directory": _a_directory("run.json"),
    "no configs": _edit_run_json(lambda d: d.pop("configs")),
    "configs null": _edit_run_json(lambda d: d.update(configs=None)),
}
LINE_DAMAGE = {
    "requests.jsonl a directory": _a_directory("requests.jsonl"),
    "a list line": _first_line("[1,2]"),
    "an empty object line": _first_line("{}"),
}


def assert_usage_error(proc, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("damage", RUN_JSON_DAMAGE.values(), ids=RUN_JSON_DAMAGE.keys())
@pytest.mark.parametrize("command", ["ab --resume", "gate --current", "wer --transcribe-only",
                                     "baseline update --from"])
def test_a_damaged_run_json_is_a_usage_error_naming_it_for_every_reader(runs, tmp_path, damage, command):
    run = Path(shutil.copytree(runs["ab"], tmp_path / "run"))
    file = damage(run)
    assert_usage_error(main_in_process(*readers(run, tmp_path)[command]), str(file))


@pytest.mark.parametrize("damage", LINE_DAMAGE.values(), ids=LINE_DAMAGE.keys())
@pytest.mark.parametrize("command, kind", [("ab --resume", "ab"), ("gate --current", "ab"),
                                           ("wer --transcribe-only", "wer"), ("baseline update --from", "ab")])
def test_damaged_request_records_are_a_usage_error_naming_the_file(runs, tmp_path, damage, command, kind):
    run = Path(shutil.copytree(runs[kind], tmp_path / "run"))
    file = damage(run)
    assert_usage_error(main_in_process(*readers(run, tmp_path)[command]), str(file))


def test_a_lock_file_that_is_a_directory_stops_a_resume_naming_it(runs, tmp_path):
    run = Path(shutil.copytree(runs["ab"], tmp_path / "run"))
    lock = run / "run.lock"
    if lock.exists():
        lock.unlink()
    lock.mkdir()
    assert_usage_error(main_in_process("ab", "--resume", str(run)), str(lock))


def test_an_ab_run_with_one_arm_cannot_be_resumed(runs, tmp_path):
    run = Path(shutil.copytree(runs["ab"], tmp_path / "run"))
    _edit_run_json(lambda d: d["configs"].pop("test"))(run)
    assert_usage_error(main_in_process("ab", "--resume", str(run)), "1 arm", "--resume")


@pytest.mark.parametrize("argv", [AB, WER, ["mem", "--config", str(ROOT / "configs/ab/synthetic.yaml"), *FAST,
                                            "--sampler", "rss", "--tier", "1x1", "--num-prompts", "1",
                                            "--warm-tier", "none"]],
                         ids=["ab", "wer", "mem"])
def test_a_result_dir_that_cannot_hold_runs_is_a_usage_error_naming_the_option(tmp_path, argv):
    plain = tmp_path / "plain"
    plain.write_text("x")
    for bad in (os.devnull, str(plain / "sub")):
        assert_usage_error(main_in_process(*argv, "--result-dir", bad), "--result-dir", bad,
                           "not a writable directory")


def test_an_empty_result_dir_is_refused_not_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Refused by the option itself (click would turn '' into '.'): a usage error, exit 2.
    proc = main_in_process(*AB, "--result-dir", "")
    assert proc.returncode == 2 and "'--result-dir': is empty" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []
