"""Code2wav stage extra: strict booleans, unknown keys, TF32 mode resolution (once, any platform)."""

from __future__ import annotations

import pytest
import torch

from stages.code2wav.options import Code2WavOptions, resolve_tf32_mode
from stages.precision import region_scope
from stages.code2wav.token2wav import Token2Wav
from stages.flags import FlagError
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

NO_ENV: dict[str, str] = {}


def test_quoted_false_turns_default_on_flag_off():
    opts = Code2WavOptions.from_extra({"code2wav_batched_cache_split": " FALSE "}, NO_ENV)
    assert opts.batched_cache_split is False
    assert Code2WavOptions.from_extra({"token2wav_device_spk": "0"}, NO_ENV).device_spk is False


def test_quoted_true_turns_default_off_mode_on():
    assert resolve_tf32_mode({"token2wav_allow_tf32": "true"}, NO_ENV) == "all"
    assert resolve_tf32_mode({"code2wav_allow_tf32": "1"}, NO_ENV) == "all"


def test_null_keeps_defaults():
    opts = Code2WavOptions.from_extra(
        {"code2wav_batched_cache_split": None, "token2wav_device_spk": None,
         "token2wav_allow_tf32": None, "code2wav_allow_tf32": None}, NO_ENV)  # fmt: skip
    assert opts == Code2WavOptions(batched_cache_split=True, device_spk=True, tf32_mode="off")


def test_null_primary_falls_through_to_alias_then_default():
    assert resolve_tf32_mode({"token2wav_allow_tf32": None, "code2wav_allow_tf32": "flow"}, NO_ENV) == "flow"
    assert resolve_tf32_mode({"token2wav_allow_tf32": False, "code2wav_allow_tf32": "flow"}, NO_ENV) == "off"
    assert resolve_tf32_mode({}, {"MINICPMO_CODE2WAV_TF32": "flow"}) == "flow"
    assert resolve_tf32_mode({"code2wav_allow_tf32": "all"}, {"MINICPMO_CODE2WAV_TF32": "flow"}) == "flow"
    assert resolve_tf32_mode({"code2wav_allow_tf32": "all"}, {"MINICPMO_CODE2WAV_TF32": "  "}) == "all"


@pytest.mark.parametrize("value", ["ture", "maybe", 2, 1.5, []])
def test_junk_boolean_raises_naming_the_key(value):
    with pytest.raises(FlagError, match="code2wav_batched_cache_split"):
        Code2WavOptions.from_extra({"code2wav_batched_cache_split": value}, NO_ENV)


@pytest.mark.parametrize("key", ["token2wav_allow_tf32", "code2wav_allow_tf32"])
def test_tf32_typo_raises_even_in_the_unused_alias(key):
    extra = {"token2wav_allow_tf32": "off", key: "ture"}
    with pytest.raises(FlagError, match=key):
        resolve_tf32_mode(extra, NO_ENV)
    with pytest.raises(FlagError, match="MINICPMO_CODE2WAV_TF32"):
        resolve_tf32_mode({}, {"MINICPMO_CODE2WAV_TF32": "fast"})


def test_unknown_key_suggests_the_nearest_name():
    with pytest.raises(FlagError, match="did you mean 'code2wav_batched_cache_split'"):
        Code2WavOptions.from_extra({"code2wav_batched_cache_splt": True}, NO_ENV)


def test_junk_raises_at_construction_on_cpu():
    for extra in ({"code2wav_batched_cache_split": "nope"}, {"token2wav_allow_tf32": "ture"}, {"typo_key": 1}):
        with pytest.raises(FlagError):
            Token2Wav(tiny_config(extra=extra), device=torch.device("cpu"), dtype=torch.float32)


def test_mode_is_resolved_once_at_construction(monkeypatch):
    extra = {"token2wav_allow_tf32": "flow"}
    t2w = Token2Wav(tiny_config(extra=extra), device=torch.device("cpu"), dtype=torch.float32)
    extra["token2wav_allow_tf32"] = "junk"  # later edits are never re-read
    monkeypatch.setenv("MINICPMO_CODE2WAV_TF32", "junk")
    assert t2w.options.tf32_mode == "flow"
    assert t2w.options.batched_cache_split is True


def test_region_scope_is_a_no_op_off_cuda():
    before = torch.backends.cuda.matmul.allow_tf32
    with region_scope("all", torch.device("cpu"), region="flow"):
        assert torch.backends.cuda.matmul.allow_tf32 == before


@pytest.mark.gpu
def test_region_scope_sets_and_restores_on_cuda():
    dev = torch.device("cuda")
    before = torch.backends.cuda.matmul.allow_tf32
    with region_scope("flow", dev, region="flow"):
        assert torch.backends.cuda.matmul.allow_tf32 is True
    with region_scope("flow", dev, region="hift"):
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is True  # "flow" keeps cuDNN's TF32 convolutions
    with region_scope("off", dev, region="hift"):
        assert torch.backends.cudnn.allow_tf32 is False
    assert torch.backends.cuda.matmul.allow_tf32 == before
