"""Shipped configs are package data: defaults and `configs/...` paths do not depend on the
working directory (the user who ran `tts-bench wer --meta my-set/meta.lst` from their own folder
got the full-size model on the CPU and the OOM killer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tts_bench.cli import app
from tts_bench.config import config_to_dict, load_arms, load_config
from tts_bench.errors import ConfigError
from tts_bench.config.shipped import resolve_config_path, shipped_config, shipped_dir, shipped_names

REPO = Path(__file__).resolve().parents[2]


def test_shipped_configs_live_in_the_package_and_the_repo_link_points_at_them():
    assert shipped_dir() == Path(__file__).resolve().parents[2] / "tts_bench" / "configs"
    assert "configs/ab/default.yaml" in shipped_names() and "configs/stages/minicpmo45-tiny.yaml" in shipped_names()
    assert (REPO / "configs").resolve() == shipped_dir().resolve()


def test_configs_paths_resolve_to_the_shipped_files_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("configs/ab/default.yaml") == shipped_config("ab/default.yaml")
    arms = load_arms(Path("configs/ab/default.yaml"))
    assert arms["base"].stages.talker.num_layers == 2  # its include (../stages/tiny) resolved too
    cfg = load_config(None, ["stages=configs/stages/minicpmo45.yaml"])
    assert cfg.stages.talker.num_layers == 20
    with pytest.raises(ConfigError, match=r"not found \(configs/ab/nope.yaml\).*shipped configs: (configs/ab/[a-z0-9-]+.yaml, )*configs/ab/default.yaml"):
        load_config("configs/ab/nope.yaml")


def test_a_file_of_your_own_wins_over_the_shipped_one(tmp_path, monkeypatch):
    mine = tmp_path / "configs" / "ab" / "default.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("backend: synthetic\n")
    monkeypatch.chdir(tmp_path)
    assert load_config("configs/ab/default.yaml").backend == "synthetic"


def test_ab_without_a_config_runs_the_shipped_default_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [
        "ab", "--set", "backend=synthetic", "--set", "synthetic.chunk_delay_s=0.001",
        "--set", "synthetic.first_chunk_delay_s=0.001", "--set", "bench.warmup=0", "--tiers", "1x1",
        "--num-prompts", "2", "--format", "json", "--result-dir", "runs"])
    assert result.exit_code == 0, result.output
    run = json.loads((Path(json.loads(result.stdout)["run_dir"]) / "run.json").read_text())
    base = run["configs"]["base"]
    assert base["stages"]["talker"]["num_layers"] == 2  # the shipped default.yaml's tiny stages
    assert base["stages"]["code2wav"]["extra"] == {"code2wav_batched_cache_split": False}  # its arms


def test_wer_default_config_is_the_shipped_one_from_another_folder(tmp_path, monkeypatch):
    from tts_bench.wer.session import load_wer_arms

    monkeypatch.chdir(tmp_path)
    arms = load_wer_arms(None, "base,test")
    assert arms["base"].backend == "piper" and arms["base"].wer.num_prompts == 80


FAST_SYNTH = ["synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1", "synthetic.first_chunk_delay_s=0.001",
              "synthetic.chunk_delay_s=0.001"]


def test_calibrate_finds_a_shipped_case_by_name_or_path_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for case in ("synthetic", "configs/cases/synthetic.yaml"):
        result = CliRunner().invoke(app, ["calibrate", case, "--runs", "1", "--no-write", "--result-dir", "runs",
                                          *[x for s in FAST_SYNTH for x in ("--set", s)]])
        assert result.exit_code == 0, result.output


def test_gate_finds_a_shipped_case_from_another_folder(tmp_path, monkeypatch):
    from tts_bench.gate.case import load_case

    monkeypatch.chdir(tmp_path)
    assert load_case("configs/cases/tiny-embedded.yaml").path == shipped_config("cases/tiny-embedded.yaml")
    result = CliRunner().invoke(app, ["gate", "--run-case", "configs/cases/synthetic.yaml", "--baseline", "none.json",
                                      "--profile", "cpu-2core", "--result-dir", "runs"])
    assert isinstance(result.exception, ConfigError), result.output  # exit 2 through tts_bench.cli.main
    assert "no baseline at none.json (--baseline)" in str(result.exception)  # the case was read: next check


# A/A configs: both arms the same on purpose (the last two name none: `--test-set` makes the B).
SAME_ARMS = {"configs/ab/runner-aa.yaml", "configs/ab/piper.yaml", "configs/ab/synthetic.yaml"}


@pytest.mark.parametrize("name", [n for n in shipped_names() if n.startswith("configs/ab/")])
def test_every_shipped_ab_config_loads_two_arms_that_differ_as_named(name):
    """A typo in a shipped A/B config (a key, a flag, a value) fails here, not on a GPU."""
    arms = load_arms(Path(name))
    assert len(arms) == 2, f"{name}: an A/B compares two arms"
    base, test = (config_to_dict(cfg) for cfg in arms.values())
    assert (base == test) == (name in SAME_ARMS), f"{name}: arms equal? {base == test}"


@pytest.mark.parametrize("name", ["ab/http-openai.yaml", "ab/http-vllm-omni.yaml"])
def test_http_examples_say_how_to_start_their_server(name):
    import re

    assert re.search(r"^#\s+(tts-bench serve|vllm serve) ", shipped_config(name).read_text(), re.M)


def test_the_openai_example_benches_a_server_in_pcm_against_mp3(tmp_path):
    from tts_bench.serve.app import running_server

    served = load_config(None, ["backend=synthetic", "synthetic.chunk_delay_s=0.001",
                                "synthetic.first_chunk_delay_s=0.001"])
    with running_server(served) as server:
        result = CliRunner().invoke(app, [
            "ab", "--config", "configs/ab/http-openai.yaml", "--set", f"http.base_url={server.url}",
            "--set", "bench.warmup=0", "--tiers", "1x1", "--num-prompts", "2", "--repeats", "1",
            "--format", "json", "--result-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = json.loads((Path(json.loads(result.stdout)["run_dir"]) / "run.json").read_text())
    assert {a: c["http"]["response_format"] for a, c in run["configs"].items()} == {"base": "pcm", "test": "mp3"}
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["failure_kind"] is None and r["audio_seconds"] > 0 for r in records)
