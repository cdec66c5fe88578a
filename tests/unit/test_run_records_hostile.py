"""Damaged run records and unusable result directories are usage errors (exit 2) naming the file
or option, at the shared readers (`RunDir.open`, `RunDir.iter_requests`, `read_records`,
`RunDir.create`, ab's `plan_from_run`), never a raw KeyError / TypeError / OSError (exit 1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tts_bench.ab.session import plan_from_run
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.rundir.records import read_records
from tts_bench.rundir.results import RunDir


def make_run(root: Path, **kw) -> RunDir:
    run = RunDir.create(root, "ab", command_line=["tts-bench", "ab"],
                        configs={"base": {"backend": "synthetic"}, "test": {"backend": "synthetic"}},
                        extra={"ab": {"tiers": ["2x1"], "repeats": 1, "num_prompts": 2}}, **kw)
    run.append_request(rec("base", "a"))
    run.append_request(rec("test", "a"))
    run.close()
    run.release()
    return run


def rec(arm: str, rid: str, **extra) -> dict:
    return {"arm": arm, "tier": "2x1", "repeat": 0, "request_id": rid, "utt": rid, "warmup": False,
            "phase_id": "p", "t_send_s": 0.0, "t_end_s": 1.0, **extra}


def edit_run_json(run: RunDir, change) -> None:
    doc = json.loads(run.run_json.read_text())
    change(doc)
    run.run_json.write_text(json.dumps(doc))


def usage_error(call, *words: str) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    message = str(info.value)
    assert info.value.exit_status == ExitStatus.USAGE
    assert message.startswith("error: ") and "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


# --- run.json --------------------------------------------------------------------------------

def test_a_run_json_of_random_bytes_is_refused_naming_it(tmp_path):
    run = make_run(tmp_path)
    run.run_json.write_bytes(bytes(range(128, 256)) * 3)
    usage_error(lambda: RunDir.open(run.path), str(run.run_json), "not valid JSON")


@pytest.mark.parametrize("lock", [False, True])
def test_a_run_json_that_is_a_directory_is_refused_naming_it(tmp_path, lock):
    run = make_run(tmp_path)
    run.run_json.unlink()
    run.run_json.mkdir()
    usage_error(lambda: RunDir.open(run.path, lock=lock), str(run.run_json), "cannot read")


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("configs"), ["has no configs"]),
    (lambda d: d.update(configs=None), ["configs is null"]),
    (lambda d: d.update(configs=[1, 2]), ["configs is [1, 2]"]),
    (lambda d: d.update(configs={"base": None}), ["configs.base"]),
    (lambda d: d.pop("kind"), ["kind"]),
])
def test_a_run_json_without_its_header_is_refused_naming_what_is_missing(tmp_path, change, words):
    run = make_run(tmp_path)
    edit_run_json(run, change)
    usage_error(lambda: RunDir.open(run.path), str(run.run_json), "damaged", *words)


def test_a_lock_file_that_is_a_directory_is_refused_for_a_writer_and_ignored_by_a_reader(tmp_path):
    run = make_run(tmp_path)
    lock = run.path / "run.lock"
    if lock.exists():
        lock.unlink()
    lock.mkdir()
    usage_error(lambda: RunDir.open(run.path, lock=True), str(lock))
    assert len(RunDir.open(run.path).read_requests()) == 2  # readers take no lock


def test_an_ab_run_with_one_arm_cannot_be_resumed(tmp_path):
    run = make_run(tmp_path)
    edit_run_json(run, lambda d: d["configs"].pop("test"))
    usage_error(lambda: plan_from_run(RunDir.open(run.path)), str(run.run_json), "1 arm", "two")


def test_an_ab_run_with_a_damaged_plan_cannot_be_resumed(tmp_path):
    run = make_run(tmp_path)
    edit_run_json(run, lambda d: d["ab"].pop("repeats"))
    usage_error(lambda: plan_from_run(RunDir.open(run.path)), str(run.run_json), "ab plan")


# --- requests.jsonl --------------------------------------------------------------------------

def test_requests_jsonl_that_is_a_directory_is_refused_naming_it(tmp_path):
    run = make_run(tmp_path)
    run.requests_path.unlink()
    run.requests_path.mkdir()
    usage_error(lambda: RunDir.open(run.path), str(run.requests_path), "cannot read")


@pytest.mark.parametrize("line", ["[1,2]", "{}", '"text"', "7", '{"arm": "base", "tier": "2x1", '
                                  '"repeat": "x", "request_id": "b"}'])
def test_a_line_that_is_not_a_request_record_names_file_and_line(tmp_path, line):
    run = make_run(tmp_path)
    with open(run.requests_path, "a") as fh:
        fh.write(line + "\n")
    reader = RunDir.open(run.path)
    usage_error(reader.read_requests, f"{run.requests_path}:3", "not a request record")
    usage_error(lambda: read_records(reader), f"{run.requests_path}:3")


def test_a_bad_first_line_names_line_one_even_when_it_parses(tmp_path):
    run = make_run(tmp_path)
    lines = run.requests_path.read_text().splitlines()
    run.requests_path.write_text("\n".join(["[1,2]", *lines[1:]]) + "\n")
    usage_error(RunDir.open(run.path).read_requests, f"{run.requests_path}:1")


def test_bytes_that_are_not_text_in_the_middle_name_the_line(tmp_path):
    run = make_run(tmp_path)
    with open(run.requests_path, "ab") as fh:
        fh.write(b"\xff\xfe\x80junk\n" + json.dumps(rec("base", "b")).encode() + b"\n")
    usage_error(RunDir.open(run.path).read_requests, f"{run.requests_path}:3", "not valid JSON")


def test_a_torn_last_line_even_cut_inside_a_character_is_skipped_on_purpose(tmp_path):
    # A SIGKILL mid-write leaves half a line at the end, and only there: --resume reruns it.
    run = make_run(tmp_path)
    with open(run.requests_path, "ab") as fh:
        fh.write(b'{"arm": "base", "tier": "2x1", "rep\xe2')
    assert [r["request_id"] for r in run.read_requests()] == ["a", "a"]


def test_a_record_missing_a_measured_field_names_the_file_and_request(tmp_path):
    run = make_run(tmp_path)
    with open(run.requests_path, "a") as fh:
        fh.write(json.dumps({"arm": "base", "tier": "2x1", "repeat": 0, "request_id": "b"}) + "\n")
    usage_error(lambda: read_records(RunDir.open(run.path)), str(run.requests_path), "'b'", "utt")


# --- RunDir.create: --result-dir -------------------------------------------------------------

def test_a_result_dir_that_is_a_file_is_not_a_writable_directory(tmp_path):
    usage_error(lambda: make_run(Path(os.devnull)), "--result-dir", os.devnull, "not a writable directory")
    plain = tmp_path / "plain"
    plain.write_text("x")
    usage_error(lambda: make_run(plain), "--result-dir", "not a writable directory")
    usage_error(lambda: make_run(plain / "sub"), "--result-dir", str(plain / "sub"), "not a writable directory")


def test_an_empty_result_dir_is_refused_not_taken_as_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    usage_error(lambda: make_run(""), "--result-dir is empty")  # a library caller's empty string
    # (The command line's `--result-dir ''` is refused by the option: tests/cli/test_run_records_cli.py.)
    assert list(tmp_path.iterdir()) == []
    # An explicit "." is a choice, not an empty value.
    run = RunDir.create(Path("."), "ab", command_line=["tts-bench", "ab", "--result-dir", "."], configs={})
    run.release()
    assert run.path.parent == Path(".")
