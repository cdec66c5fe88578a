"""`tts-bench profile` through typer's CliRunner on the default (tiny) A/B config, B = 1 and 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tts_bench.commands.profile import parse_rows, profile
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.profile.run import STEPS

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--config", str(ROOT / "configs/ab/default.yaml"), "--rows", "1,2", "--chunks", "1"]


def _app() -> typer.Typer:
    # The command as cli.py registers it; a local app keeps this test independent of the others.
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)
    app.command("profile")(profile)
    return app


def invoke(*args: str):
    result = CliRunner().invoke(_app(), ["profile", *FAST, *args],
                                env={"NO_COLOR": "1", "COLUMNS": "120"}, standalone_mode=False)
    if result.exception is not None:
        raise result.exception
    return result


def test_md_and_json_render_the_same_counts():
    md = invoke("--format", "md")
    assert md.return_value == ExitStatus.OK
    lines = md.stdout.splitlines()
    assert lines[0].startswith("**launches per call on ")
    assert lines[0].endswith("(1 profiled calls each; cache split: base per-row, test batched)**")
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header == ["B", "step", "unit", "base", "test", "delta", "delta %"]
    splits = [[c.strip() for c in line.strip("|").split("|")] for line in lines if "| cache_split " in line]
    # per-row: 4 stores per row (the estimator's cond and uncond rows apart); batched: 3
    assert [cells[:1] + cells[3:6] for cells in splits] == [["1", "4", "3", "-1"], ["2", "8", "3", "-5"]]

    doc = json.loads(invoke("--format", "json").stdout)  # one document, nothing else on stdout
    assert doc["arms"] == ["base", "test"] and doc["rows"] == [1, 2] and doc["chunks"] == 1
    assert doc["columns"][:3] == ["B", "step", "unit"]
    assert [(r["B"], r["step"]) for r in doc["table"]] == [(b, s) for b in ("1", "2") for s in STEPS]
    by_step = {(p["arm"], p["rows"]): p["counts"] for p in doc["profiles"]}
    split = [by_step[(arm, 2)]["cache_split"]["per_call"] for arm in ("base", "test")]
    assert split == [8.0, 3.0]
    talker = {arm: by_step[(arm, 1)]["talker_step"]["per_call"] for arm in ("base", "test")}
    assert talker["base"] == talker["test"] > 0


def test_bad_rows_and_format_are_usage_errors():
    assert parse_rows("1,4,8") == (1, 4, 8)
    for text in ("0", "a,b", "", "4,-1"):
        with pytest.raises(ConfigError, match=r"^error: bad batch sizes .*\(--rows\)"):
            parse_rows(text)
    with pytest.raises(ConfigError, match="--format"):
        invoke("--format", "xml")


def test_tier_split_rows_shares_and_ranges():
    # --tier 4x2: talker at B = 4 (an extra run), code2wav at b = min(8, ceil(4 / 2)) = 2 (reused).
    doc = json.loads(invoke("--tier", "4x2", "--format", "json").stdout)
    split = doc["tier_split"]
    assert split["unit"] == "cpu_ms" and split["tier"] == "4x2"
    rows = {r["component"]: r for r in split["rows"]}
    assert list(rows) == ["talker", "flow encoder", "CFM", "HiFT", "code2wav other"]
    assert [rows[c]["rows"] for c in rows] == [4, 2, 2, 2, 2]
    for arm in ("base", "test"):
        assert sum(r["percent"][arm] for r in rows.values()) == pytest.approx(100.0)
        for c in ("talker", "flow encoder", "CFM", "HiFT"):
            assert rows[c]["per_call_ms"][arm] > 0
            assert rows[c]["per_audio_s_ms"][arm] == pytest.approx(
                rows[c]["per_call_ms"][arm] * rows[c]["calls_per_s"]
            )
    # Every range ran exactly once per profiled call: a renamed range reads 0 here.
    seen = {(t["arm"], t["step"], t["rows"]): t["times"]["occurrences"] for t in doc["timings"]}
    assert set(seen[("base", "talker_step", 4)].items()) == {("talker.decode_step", 1.0)}
    assert seen[("test", "code2wav_step", 2)] == {
        "code2wav.decode": 1.0, "code2wav.flow_encoder": 1.0, "code2wav.cfm": 1.0, "code2wav.hift": 1.0,
    }
    assert [r["component"] for r in doc["split_table"]][-1] == "total"
    assert doc["split_title"].startswith("cpu_ms per second of audio for all streams at tier 4x2")
    assert doc["table"] and doc["profiles"][0]["counts"]["talker_step"]["per_call"] > 0


def test_tier_split_renders_after_the_launch_table_in_md():
    lines = invoke("--rows", "1", "--tier", "1x1", "--format", "md").stdout.splitlines()
    titles = [line for line in lines if line.startswith("**")]
    assert len(titles) == 2 and titles[0].startswith("**launches per call on ")
    assert "at tier 1x1: talker 25 steps of B=1; code2wav C/b = 1 decodes" in titles[1]
    header = [c.strip() for c in lines[lines.index(titles[1]) + 2].strip("|").split("|")]
    assert header[:3] == ["component", "B", "calls/s"] and header[-1] == "test %"


def test_bad_tier_and_context_are_usage_errors(monkeypatch):
    with pytest.raises(ConfigError, match=r"^error: bad tier '12y8' \(--tier\)"):
        invoke("--tier", "12y8")
    with pytest.raises(ConfigError, match=r"but runner.max_seq_len is \d+ \(--talker-context / --chunks\)"):
        invoke("--talker-context", "5000")
    # Too many profiled steps is the same error, raised before any stage is built.
    monkeypatch.setattr("tts_bench.profile.run.build_talker", lambda *a, **k: pytest.fail("built a talker first"))
    with pytest.raises(ConfigError, match=r"need \d+ cache positions .*\(--talker-context / --chunks\)"):
        CliRunner().invoke(_app(), ["profile", *FAST[:4], "--chunks", "5000"], standalone_mode=False,
                           catch_exceptions=False)


@pytest.fixture
def no_builds(monkeypatch):
    """Building a stage fails the test: what the checks below must stop happens before any build."""
    import tts_bench.profile.run as prof

    def built(*a, **k):
        raise AssertionError("stages were built")

    monkeypatch.setattr(prof, "build_talker", built)
    monkeypatch.setattr(prof, "build_code2wav", built)


def _run(*args: str):
    return CliRunner().invoke(_app(), ["profile", *args], env={"NO_COLOR": "1", "COLUMNS": "120"},
                              standalone_mode=False)


def test_full_size_stages_at_4096_rows_fail_the_memory_preflight_before_any_build(no_builds):
    result = _run("--set", "stages=configs/stages/minicpmo45.yaml", "--rows", "4096")
    assert isinstance(result.exception, ConfigError), result.exception
    message = str(result.exception)
    assert message.startswith("error: the embedded stages of arm 'base' profiled at B = 4096 (--rows, --tier) need "
                              "about "), message
    assert "(memory preflight, before any stage process starts;" in message and "TTS_BENCH_SKIP_MEMORY_CHECK" in message


def test_profile_runs_the_preflight_of_ab_and_serve(no_builds, monkeypatch):
    import stages.platform

    monkeypatch.setattr(stages.platform, "host_available_bytes", lambda: 1)  # nothing free: even tiny fails
    result = _run(*FAST, "--tier", "8x2")
    assert isinstance(result.exception, ConfigError) and "memory preflight" in str(result.exception)


@pytest.mark.parametrize("config", ["configs/ab/synthetic.yaml", "configs/ab/piper.yaml"])
def test_profile_of_a_config_without_embedded_stages_is_refused(no_builds, config):
    result = _run("--config", str(ROOT / config), "--rows", "1")
    assert isinstance(result.exception, ConfigError), result.exception
    message = str(result.exception)
    assert message.startswith("error: profile needs an embedded config: arm 'base' runs the "), message
    assert "backend: embedded" in message
