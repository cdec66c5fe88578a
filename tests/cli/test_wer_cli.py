"""`tts-bench wer` through typer's CliRunner: exit codes 0/4/5, the JSON contract, the two phases
run separately, and one real end to end run (piper + faster-whisper tiny.en)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tts_bench.commands import wer as wer_cmd
from tts_bench.errors import ConfigError, ExitStatus, InvalidRunError
from tts_bench.wer import runner
from tts_bench.wer.testing import TextCodeBackend, TextCodeTranscriber, fake_provenance

TEXTS = ["the morning fog lifted slowly", "please close the window now", "she carried a basket of peaches",
         "good morning everybody"]

ROOT = Path(__file__).resolve().parents[2]


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root() -> None:  # a group, so `wer` is a subcommand as in tts_bench.cli
        pass

    app.command("wer")(wer_cmd.wer)
    return app


@pytest.fixture
def fake_world(tmp_path, monkeypatch):
    """A meta.lst + config on disk; the text-code backend and transcriber instead of piper/ASR."""
    # A real voice: every prompt wav is read as audio before anything is generated.
    (tmp_path / "ref.wav").write_bytes((ROOT / "tts_bench/data/seed-tts-en/prompts/ref_0.wav").read_bytes())
    meta = tmp_path / "meta.lst"
    meta.write_text("".join(f"en_{i:04d}|ref|ref.wav|{t}\n" for i, t in enumerate(TEXTS, 1)))
    cfg = tmp_path / "wer.yaml"
    cfg.write_text(
        f"backend: synthetic\nprompts:\n  meta: {meta}\nbench:\n  disable_shuffle: true\n"
        f"wer:\n  num_prompts: 4\n"
        f"  history_dir: {tmp_path / 'history'}\n  cache_dir: {tmp_path / 'cache'}\n"
    )

    def backend(cfg):  # piper.length_scale != 1 degrades; synthetic.fail_every=2 fails en_0002/4
        fail = {"en_0002", "en_0004"} if cfg.synthetic.fail_every == 2 else set()
        return TextCodeBackend(drop_last_word=cfg.piper.length_scale != 1.0, raise_for=fail)

    monkeypatch.setattr("tts_bench.backends.make_backend", backend)
    monkeypatch.setattr(runner, "make_transcriber", TextCodeTranscriber)
    monkeypatch.setattr(runner, "describe_asr", fake_provenance)
    return tmp_path, cfg


def _invoke(args: list[str]):
    # standalone_mode=False: the command's ExitStatus comes back as result.return_value, the way
    # tts_bench.cli.main turns it into the process exit code.
    return CliRunner().invoke(_app(), args, standalone_mode=False)


def _wer(args: list[str], tmp_path: Path):
    return _invoke(["wer", *args, "--result-dir", str(tmp_path / "runs"), "--format", "json"])


def test_identical_arms_pass_with_the_json_contract(fake_world):
    tmp_path, cfg = fake_world
    result = _wer(["--config", str(cfg)], tmp_path)
    assert result.return_value == 0, result.output
    doc = json.loads(result.stdout)
    base = doc["arms"]["base"]
    assert (base["mean_wer"], base["median_wer"], base["corpus_wer"], base["completed"]) == (0.0, 0.0, 0.0, 4)
    assert base["failures"] == {"request_failed": 0, "no_audio": 0, "asr_failed": 0, "empty_transcript": 0}
    assert doc["paired"]["identical_audio"] == 4 and doc["paired"]["delta_mean_wer_ci95"] == [0.0, 0.0]
    assert doc["asr"]["backend"] == "faster-whisper" and doc["asr"]["normalizer"] == "seed-tts"
    assert doc["asr"]["model"] == "text-code" and doc["verdict"] == "pass"


def test_degraded_arm_exits_4_and_the_table_shows_why(fake_world):
    tmp_path, cfg = fake_world
    result = _invoke(["wer", "--config", str(cfg), "--test-set", "piper.length_scale=1.2",
                      "--result-dir", str(tmp_path / "runs"), "--format", "md"])
    assert result.return_value == ExitStatus.ACCURACY_REGRESSION, result.output
    assert "| test" in result.stdout and "upper bound >= margin 3" in result.stdout
    assert "verdict: regression" in result.stdout


def test_failures_above_max_failures_exit_5(fake_world):
    tmp_path, cfg = fake_world
    result = _wer(["--config", str(cfg), "--set", "synthetic.fail_every=2"], tmp_path)
    assert result.return_value == ExitStatus.INVALID_RUN, result.output
    doc = json.loads(result.stdout)
    assert doc["arms"]["test"]["failures"]["request_failed"] == 2 and doc["verdict"] == "invalid"


def test_generate_only_then_transcribe_only(fake_world):
    tmp_path, cfg = fake_world
    gen = _wer(["--config", str(cfg), "--generate-only", "--arms", "base"], tmp_path)
    assert gen.return_value == 0, gen.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert len(list((run_dir / "wavs" / "base").glob("*.wav"))) == 4
    result = _wer(["--transcribe-only", str(run_dir)], tmp_path)
    assert result.return_value == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc["arms"]) == ["base"] and doc["paired"] is None


def test_history_with_another_normalizer_is_refused(fake_world):
    pytest.importorskip("whisper")
    tmp_path, cfg = fake_world
    assert _wer(["--config", str(cfg), "--accept"], tmp_path).return_value == 0
    assert list((tmp_path / "history").glob("*.json"))
    result = _wer(["--config", str(cfg), "--normalizer", "whisper"], tmp_path)
    assert isinstance(result.exception, InvalidRunError)  # tts_bench.cli.main maps it to exit 5
    assert result.exception.exit_status == ExitStatus.INVALID_RUN
    assert "not comparable" in str(result.exception)


@pytest.mark.slow
def test_piper_end_to_end_with_faster_whisper_tiny_en(tmp_path):
    root = Path(__file__).resolve().parents[2]
    result = _invoke([
        "wer", "--config", str(root / "configs/wer/seed-tts-en.yaml"), "--num-prompts", "3",
        "--arms", "base", "--result-dir", str(tmp_path / "runs"), "--format", "json",
        "--set", f"wer.history_dir={tmp_path / 'history'}", "--set", f"wer.cache_dir={tmp_path / 'cache'}",
    ])
    assert result.return_value == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["arms"]["base"]["completed"] == 3 and doc["arms"]["base"]["mean_wer"] < 0.2
    assert doc["asr"]["model"] == "tiny.en" and doc["asr"]["compute_type"] == "int8"


def test_a_wer_set_is_never_cycled_num_prompts_only_caps(fake_world):
    tmp_path, cfg = fake_world
    result = _wer(["--config", str(cfg), "--num-prompts", "10"], tmp_path)
    assert result.return_value == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["arms"]["base"]["total"] == 4  # the set's 4 utterances, each once
    ids = [u["request_id"] for u in doc["arms"]["base"].get("utterances", [])] or None
    assert ids is None or len(set(ids)) == 4


def test_non_inferiority_runs_say_first_whether_the_prompt_count_resolves_the_margin(fake_world):
    tmp_path, cfg = fake_world
    result = _wer(["--config", str(cfg), "--set", "wer.margin_points=3"], tmp_path)
    assert "wer: non-inferiority margin 3 points with 4 prompts" in result.output
    assert "NOT resolvable" in result.output
    exact = _wer(["--config", str(cfg), "--set", "wer.mode=exact"], tmp_path)
    assert "non-inferiority margin" not in exact.output and exact.return_value == 0


def test_generate_only_with_failures_above_max_failures_exits_5_and_says_why(fake_world):
    tmp_path, cfg = fake_world
    result = _wer(["--config", str(cfg), "--generate-only", "--arms", "base", "--set", "synthetic.fail_every=2"], tmp_path)
    assert result.return_value == ExitStatus.INVALID_RUN, result.output
    assert "base: 2 of 4 requests failed (request_failed 2) > max_failures 0" in result.output
    ok = _wer(["--config", str(cfg), "--generate-only", "--arms", "base", "--set", "synthetic.fail_every=2",
               "--set", "wer.max_failures=2"], tmp_path)
    assert ok.return_value == 0, ok.output


@pytest.mark.parametrize(
    "text, message",
    [
        ("简单地说，这相当于惠普把消费领域市场拱手相让了。", "has CJK letters"),
        ("Привет, как дела", "has Cyrillic letters"),
        ("& & @ $", "has no words after the seed-tts normalizer"),
        ("\U0001f600 \U0001f389 \U0001f44d", "has no words after the seed-tts normalizer"),
    ],
)
def test_texts_the_gate_cannot_score_are_refused_before_any_audio(fake_world, text, message):
    tmp_path, cfg = fake_world
    meta = tmp_path / "meta.lst"
    meta.write_text(meta.read_text() + f"odd_1|ref|ref.wav|{text}\n")
    result = _wer(["--config", str(cfg), "--set", "wer.num_prompts=5"], tmp_path)
    assert isinstance(result.exception, ConfigError), result.output  # tts_bench.cli.main: exit 2
    assert message in str(result.exception) and "'odd_1'" in str(result.exception)
    assert f"{meta}:5" in str(result.exception)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_transcribe_only_refuses_a_normalizer_that_empties_a_text_before_transcribing(fake_world, monkeypatch):
    tmp_path, cfg = fake_world
    assert _wer(["--config", str(cfg), "--generate-only", "--arms", "base"], tmp_path).return_value == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    from tts_bench.wer import normalize

    real = normalize.get_normalizer
    monkeypatch.setattr(normalize, "get_normalizer",
                        lambda name: (lambda t: "" if "peaches" in t else t) if name == "whisper" else real(name))
    monkeypatch.setattr(runner, "make_transcriber", lambda *a, **k: pytest.fail("transcribed before the check"))
    result = _wer(["--transcribe-only", str(run_dir), "--normalizer", "whisper"], tmp_path)
    assert "has no words after the whisper normalizer" in str(result.exception)


def test_options_that_would_be_ignored_or_contradict_are_refused(fake_world):
    tmp_path, cfg = fake_world
    both = _wer(["--config", str(cfg), "--generate-only", "--accept"], tmp_path)
    assert isinstance(both.exception, ConfigError) and "--accept records a scored run" in str(both.exception)
    assert _wer(["--config", str(cfg), "--generate-only", "--arms", "base"], tmp_path).return_value == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    for extra, named in ((["--arms", "base"], "--arms"), (["--num-prompts", "2"], "--num-prompts"),
                         (["--set", "bench.timeout_s=5"], "--set bench.timeout_s=5"),
                         (["--test-set", "piper.length_scale=1.2"], "--test-set")):
        result = _wer(["--transcribe-only", str(run_dir), *extra], tmp_path)
        assert isinstance(result.exception, ConfigError), (extra, result.output)
        assert f"so {named} would change nothing" in str(result.exception)
    assert _wer(["--transcribe-only", str(run_dir), "--set", "wer.max_failures=1"], tmp_path).return_value == 0


def test_transcribe_only_of_a_run_that_is_not_a_wer_run_is_a_usage_error(fake_world):
    tmp_path, cfg = fake_world
    assert _wer(["--config", str(cfg), "--generate-only", "--arms", "base"], tmp_path).return_value == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    doc = json.loads((run_dir / "run.json").read_text())
    del doc["wer_selection"]
    (run_dir / "run.json").write_text(json.dumps(doc))
    result = _wer(["--transcribe-only", str(run_dir)], tmp_path)
    assert isinstance(result.exception, ConfigError) and "is not a WER run" in str(result.exception)


def test_a_history_dir_that_cannot_be_written_is_refused_before_any_audio(fake_world, monkeypatch):
    tmp_path, cfg = fake_world
    (tmp_path / "afile").write_text("not a folder")
    started = []
    monkeypatch.setattr("tts_bench.backends.make_backend", lambda c: started.append(c) or TextCodeBackend())
    for where, said in ((tmp_path / "afile", "is a file (wer.history_dir, --accept)"),
                        (tmp_path / "afile" / "sub", "afile is a file (wer.history_dir, --accept)")):
        result = _wer(["--config", str(cfg), "--accept", "--set", f"wer.history_dir={where}"], tmp_path)
        assert isinstance(result.exception, ConfigError) and said in str(result.exception)
    assert started == [] and not (tmp_path / "runs").exists()


def test_a_generation_record_without_its_text_is_a_usage_error_naming_the_file(fake_world):
    tmp_path, cfg = fake_world
    assert _wer(["--config", str(cfg), "--generate-only", "--arms", "base"], tmp_path).return_value == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    lines = (run_dir / "requests.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    del first["text"]
    (run_dir / "requests.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    result = _wer(["--transcribe-only", str(run_dir)], tmp_path)
    assert isinstance(result.exception, ConfigError) and "damaged generation record" in str(result.exception)


def test_the_history_follows_the_result_dir_from_any_folder_and_its_absence_is_said(fake_world, monkeypatch):
    tmp_path, cfg = fake_world
    cfg.write_text(cfg.read_text().replace(f"  history_dir: {tmp_path / 'history'}\n", ""))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a working folder with no results/ of its own
    first = _wer(["--config", str(cfg), "--accept"], tmp_path)
    assert first.return_value == 0, first.output
    history = tmp_path / "wer-history"  # beside --result-dir tmp_path/runs
    assert f"no WER history at {history} (wer.history_dir)" in first.stderr
    assert json.loads(first.stdout)["history_written"].startswith(str(history))
    second = _wer(["--config", str(cfg)], tmp_path)
    assert second.return_value == 0 and "no WER history" not in second.stderr
    assert json.loads(second.stdout)["history"], "the second run is checked against the first"
    assert not (elsewhere / "results").exists()
