"""The strict stage flag parser (stages/flags.py): the whole accept/reject matrix."""

from __future__ import annotations

import pytest

from stages.flags import FlagError, parse_bool_flag, read_bool_flag, read_env_opt_out

TRUE_VALUES = [True, 1, "true", "1", "True", "TRUE", " true ", "\ttrue\n"]
FALSE_VALUES = [False, 0, "false", "0", "False", " FALSE ", " 0 "]
REJECTED = [
    "ture", "yes", "no", "on", "off", "maybe", "", " ", "t", "f", "2",
    2, -1, 1.0, 0.0, 1.5, [], {}, (), b"true",
]


@pytest.mark.parametrize("value", TRUE_VALUES, ids=repr)
def test_true_spellings_read_true(value):
    assert parse_bool_flag(value, key="k") is True


@pytest.mark.parametrize("value", FALSE_VALUES, ids=repr)
def test_false_spellings_read_false(value):
    assert parse_bool_flag(value, key="k") is False


@pytest.mark.parametrize("value", REJECTED, ids=repr)
def test_non_boolean_values_are_rejected_with_the_key_named(value):
    with pytest.raises(FlagError) as info:
        parse_bool_flag(value, key="token2wav_device_spk")
    msg = str(info.value)
    assert "'token2wav_device_spk'" in msg and msg.startswith("error: ")
    assert isinstance(info.value, ValueError)  # config loaders turn ValueError into exit 2


def test_quoted_false_turns_default_on_flag_off():
    # The bug this parser exists for: bool("false") is True.
    assert read_bool_flag({"x": "false"}, "x", True) is False


@pytest.mark.parametrize("extra", [None, {}, {"x": None}, {"other": False}])
def test_missing_or_null_flag_keeps_default(extra):
    assert read_bool_flag(extra, "x", True) is True
    assert read_bool_flag(extra, "x", False) is False


def test_read_bool_flag_rejects_typo_naming_key():
    with pytest.raises(FlagError, match="'talker_codec_fused_prelude'"):
        read_bool_flag({"talker_codec_fused_prelude": "ture"}, "talker_codec_fused_prelude", True)


@pytest.mark.parametrize(
    ("raw", "opted_out"),
    [("0", True), ("false", True), (" FALSE ", True), ("1", False), ("true", False), ("", False)],
)
def test_env_opt_out_reads_false_as_opt_out(monkeypatch, raw, opted_out):
    monkeypatch.setenv("TTS_BENCH_TEST_FEATURE", raw)
    assert read_env_opt_out("TTS_BENCH_TEST_FEATURE") is opted_out


def test_env_opt_out_unset_is_no_opt_out(monkeypatch):
    monkeypatch.delenv("TTS_BENCH_TEST_FEATURE", raising=False)
    assert read_env_opt_out("TTS_BENCH_TEST_FEATURE") is False


def test_env_opt_out_typo_raises_naming_variable(monkeypatch):
    monkeypatch.setenv("TTS_BENCH_TEST_FEATURE", "ture")
    with pytest.raises(FlagError, match="TTS_BENCH_TEST_FEATURE"):
        read_env_opt_out("TTS_BENCH_TEST_FEATURE")


def test_option_flags_become_quoted_set_overrides_and_unset_flags_are_left_out():
    from tts_bench.commands._common import Yaml, flag_sets

    sets = flag_sets([("wer.asr_model", 'a: "b" #c', "--asr-model"), ("wer.num_prompts", 3, "--num-prompts"),
                      ("mem.interval_s", 0.5, "--interval"), ("bench.disable_shuffle", True, "--disable-shuffle"),
                      ("mem.warm_tier", Yaml("null"), "--warm-tier"), ("mem.tier", None, "--tier")])
    assert sets == ['wer.asr_model="a: \\"b\\" #c"', "wer.num_prompts=3", "mem.interval_s=0.5",
                    "bench.disable_shuffle=true", "mem.warm_tier=null"]
    assert [s.flag for s in sets] == ["--asr-model", "--num-prompts", "--interval", "--disable-shuffle", "--warm-tier"]


def test_an_error_about_an_option_names_the_option_not_set():
    from tts_bench.commands._common import flag_sets
    from tts_bench.config import BenchConfig, apply_overrides
    from tts_bench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"mem.interval_s must be >= 0.01 s, got 0.0 \(--interval\)"):
        apply_overrides(BenchConfig(), flag_sets([("mem.interval_s", 0, "--interval")]))
    with pytest.raises(ConfigError, match=r"\(--set\)"):  # the same value through --set says --set
        apply_overrides(BenchConfig(), ["mem.interval_s=0"])
