"""One rule per kind of input, everywhere: booleans, environment flags, text encodings.

- YAML (files and `--set`) reads booleans by YAML 1.2 core rules: only true/false; a bare
  `yes`/`on` stays a string, so a bool field rejects it naming the key and the accepted values
  (the stage-flag parser, `stages.flags`, accepts true/false/1/0 and rejects "yes" as well);
- environment flags the stage processes read are checked when a stage config is built, and their
  errors name the variable, not the file being loaded;
- a config file that is not UTF-8 is an exit-2 error naming the file and the line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.flags import FlagError, parse_bool_flag
from tts_bench.config import load_config
from tts_bench.errors import ConfigError, ExitStatus


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "y", "n", "Yes", "ON"])
def test_yaml_11_boolean_words_are_not_booleans_in_a_file(tmp_path, word):
    path = write(tmp_path / "a.yaml", f"bench:\n  disable_shuffle: {word}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "bench.disable_shuffle must be bool (true or false)" in msg and repr(word) in msg, msg
    assert str(path) in msg and info.value.exit_status == ExitStatus.USAGE


@pytest.mark.parametrize("word", ["yes", "on", "off"])
def test_yaml_11_boolean_words_are_not_booleans_in_set_or_in_stage_flags(word):
    with pytest.raises(ConfigError, match=r"bench.disable_shuffle must be bool \(true or false\)"):
        load_config(None, [f"bench.disable_shuffle={word}"])
    # The same word bare in --set and quoted reach the flag parser as the same string: refused.
    for value in (word, f"'{word}'"):
        with pytest.raises(ConfigError, match="talker_codec_fused_prelude"):
            load_config(None, [f"talker.extra.talker_codec_fused_prelude={value}"])
    with pytest.raises(FlagError):
        parse_bool_flag(word, key="x")


@pytest.mark.parametrize(("text", "value"), [("true", True), ("False", False), ("TRUE", True)])
def test_true_and_false_in_any_case_are_booleans(tmp_path, text, value):
    assert load_config(None, [f"bench.disable_shuffle={text}"]).bench.disable_shuffle is value
    assert load_config(write(tmp_path / "a.yaml", f"bench: {{disable_shuffle: {text}}}\n")).bench.disable_shuffle is value


def test_a_yes_in_a_string_field_stays_the_string():
    assert load_config(None, ["http.voice=yes"]).http.voice == "yes"


@pytest.mark.parametrize(
    ("name", "value"),
    [("TALKER_CODEC_FUSED_PRELUDE", "maybe"), ("VLLM_OMNI_DEVICE_SPK", "yes"),
     ("MINICPMO_CODE2WAV_TF32", "maybe")],
)
def test_bad_environment_flags_fail_at_config_load_naming_the_variable(tmp_path, monkeypatch, name, value):
    stages = write(tmp_path / "stages.yaml", "runner: {device: cpu}\n")
    path = write(tmp_path / "a.yaml", f"backend: embedded\nstages: {stages.name}\n")
    monkeypatch.setenv(name, value)
    for load in (lambda: load_config(path), lambda: load_config(None)):
        with pytest.raises(ConfigError) as info:
            load()
        msg = str(info.value)
        assert msg.startswith(f"error: environment variable {name} must be ") and "(environment)" in msg, msg
        assert "stage config extra" not in msg and str(tmp_path) not in msg  # not the file's fault
        assert info.value.exit_status == ExitStatus.USAGE


def test_good_environment_flags_load(monkeypatch):
    monkeypatch.setenv("TALKER_CODEC_FUSED_PRELUDE", "0")
    monkeypatch.setenv("MINICPMO_CODE2WAV_TF32", "flow")
    assert load_config(None).stages.runner.device == "auto"


def test_a_non_utf8_config_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"# configuration\nhttp:\n  voice: caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "not UTF-8" in msg and f"({path}:3)" in msg and "line 3" in msg, msg
    assert info.value.exit_status == ExitStatus.USAGE


def test_a_utf8_bom_in_a_config_is_ignored(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes("backend: synthetic\n".encode("utf-8-sig"))
    assert load_config(path).backend == "synthetic"


def test_a_directory_as_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
