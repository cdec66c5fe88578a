"""`tts-bench wer` checks what would fail after minutes of synthesis before synthesizing:
the ASR backend/model/normalizer, every selected prompt's reference wav, and memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tts_bench.commands import wer as wer_cmd
from tts_bench.errors import ConfigError
from tts_bench.wer.testing import TextCodeBackend

VOICE = Path(__file__).resolve().parents[2] / "tts_bench/data/seed-tts-en/prompts/ref_0.wav"


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)  # a group, so `wer` is a subcommand as in tts_bench.cli
    app.command("wer")(wer_cmd.wer)
    return app


@pytest.fixture
def world(tmp_path, monkeypatch):
    (tmp_path / "ref.wav").write_bytes(VOICE.read_bytes())  # a real voice: every prompt wav is read first
    meta = tmp_path / "meta.lst"
    meta.write_text("en_0001|ref|ref.wav|good morning\nen_0002|ref|gone.wav|good night\n")
    cfg = tmp_path / "wer.yaml"
    cfg.write_text(f"backend: synthetic\nprompts:\n  meta: {meta}\nbench:\n  disable_shuffle: true\n"
                   f"wer:\n  num_prompts: 1\n  history_dir: {tmp_path / 'history'}\n")
    started = []

    def backend(cfg):
        started.append(cfg.backend)
        return TextCodeBackend()

    monkeypatch.setattr("tts_bench.backends.make_backend", backend)
    return tmp_path, cfg, started


def run(tmp_path: Path, *args: str):
    # standalone_mode=False: the command's ExitStatus comes back as result.return_value.
    return CliRunner().invoke(_app(), ["wer", *args, "--result-dir", str(tmp_path / "runs"), "--format", "json"],
                              standalone_mode=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--asr-model", "/no/such/dir"], "unknown ASR model '/no/such/dir'"),
        (["--num-prompts", "2"], "does not exist"),
    ],
)
def test_bad_asr_model_or_missing_prompt_wav_fail_before_any_audio_is_generated(world, args, message):
    tmp_path, cfg, started = world
    result = run(tmp_path, "--config", str(cfg), *args)
    assert isinstance(result.exception, ConfigError), result.output
    assert message in str(result.exception)
    assert started == [] and not (tmp_path / "runs").exists()


def test_the_checks_pass_for_a_good_setup(world):
    tmp_path, cfg, started = world
    result = run(tmp_path, "--config", str(cfg), "--generate-only")
    assert result.return_value == 0, result.output
    assert started == ["synthetic", "synthetic"]
