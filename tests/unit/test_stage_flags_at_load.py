"""Stage-extra flags are validated when a bench config is loaded: typos exit 2 before any
stage process starts, on every platform (no device is involved)."""

import pytest

from tts_bench.config import load_config
from tts_bench.errors import ConfigError


@pytest.mark.parametrize(
    "override",
    [
        "talker.extra.talker_codec_fused_prelude=ture",
        "code2wav.extra.token2wav_device_spk='\"maybe\"'",
        "code2wav.extra.token2wav_allow_tf32=ture",
    ],
)
def test_junk_flag_values_are_config_errors_naming_the_key(override):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert override.split(".")[2].split("=")[0] in str(err.value)


def test_unknown_stage_extra_key_suggests_the_nearest_name():
    with pytest.raises(ConfigError, match="did you mean 'token2wav_device_spk'"):
        load_config(None, ["code2wav.extra.token2wav_device_spc=false"])
    with pytest.raises(ConfigError, match="did you mean 'talker_codec_fused_prelude'"):
        load_config(None, ["talker.extra.talker_codec_fused_prelud=false"])


@pytest.mark.parametrize("value", ["false", "0", "' FALSE '", "null"])
def test_valid_and_null_flag_values_load(value):
    cfg = load_config(None, [f"talker.extra.talker_codec_fused_prelude={value}"])
    assert "talker_codec_fused_prelude" in cfg.stages.talker.extra
