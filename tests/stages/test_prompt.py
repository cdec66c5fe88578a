"""Prompt features: default voice, normalisation, caching, both tokenizer paths (decoding the
voice itself: tests/stages/test_audio.py)."""

from __future__ import annotations

import dataclasses
import math
import struct

import numpy as np
import pytest
import torch

from stages.audio import decode_audio
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.mel import resample, whisper_log_mel
from stages.code2wav.prompt import (
    DEFAULT_REF_WAV,
    PromptBuilder,
    PromptError,
    StandInTokenizer,
    normalize_reference,
)

CFG = Code2WavConfig()


def _builder(extra: dict | None = None, **kw) -> PromptBuilder:
    """A builder for a code2wav stage with this `extra` (it reads the parsed `cfg.options`)."""
    args = dict(device=torch.device("cpu"), dtype=torch.float32, weights_dir=None)
    args.update(kw)
    return PromptBuilder(dataclasses.replace(CFG, extra=extra or {}), **args)


def _tone(freq: float, sr: int, seconds: float) -> torch.Tensor:
    t = torch.arange(int(sr * seconds), dtype=torch.float64) / sr
    return (0.3 * torch.sin(2 * math.pi * freq * t)).float()


def _write_float_wav(path, wav: torch.Tensor, sr: int) -> None:
    data = wav.t().contiguous().numpy().astype("<f4").tobytes()  # [C, N] -> interleaved
    ch = wav.shape[0]
    fmt = struct.pack("<HHIIHH", 3, ch, sr, sr * ch * 4, ch * 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


def test_default_voice_gives_150_tokens_300_mel_frames_and_192_dim_speaker():
    wav, sr = decode_audio(DEFAULT_REF_WAV)
    assert sr == 24000 and wav.shape == (1, 144000)  # the packaged voice: 6.0 s mono 24 kHz
    builder = _builder()
    prompt = builder.build(None)
    assert prompt.tokens.shape == (150,) and prompt.tokens.dtype == torch.long
    assert 0 <= int(prompt.tokens.min()) and int(prompt.tokens.max()) < CFG.flow.vocab_size
    assert len(set(prompt.tokens.tolist())) > 5  # audio-dependent, not constant
    assert prompt.mel.shape == (300, 80) and prompt.spk_embedding.shape == (192,)
    assert builder.build(None) is prompt  # cached


def test_normalisation_mixes_to_mono_resamples_and_pads_or_truncates():
    stereo = torch.stack([_tone(300, 16000, 2.0), torch.zeros(32000)])
    out = normalize_reference(stereo, 16000, CFG, where="test")
    assert out.shape == (144000,)
    expected = resample(stereo.mean(0), 16000, 24000)
    assert torch.equal(out[: expected.numel()], expected) and out[expected.numel() :].abs().max() == 0
    long = normalize_reference(_tone(300, 24000, 8.0), 24000, CFG, where="test")
    assert torch.equal(long, _tone(300, 24000, 8.0)[:144000])


@pytest.mark.parametrize(
    "wav,match",
    [(torch.zeros(1, 0), "empty"), (torch.tensor([0.1, float("nan"), 0.2]), "NaN"), (torch.zeros(9, 10), "9 channels; give 1-8")],
)
def test_empty_non_finite_or_too_many_channels_raise_prompt_error(wav, match):
    with pytest.raises(PromptError, match=match):
        normalize_reference(wav, 24000, CFG, where="test")


def test_cache_follows_file_content_and_waveform_path_matches_file_path(tmp_path):
    builder = _builder()
    path = tmp_path / "ref.wav"
    _write_float_wav(path, _tone(220, 16000, 3.0)[None], 16000)
    first = builder.build(path)
    assert builder.build(path) is first
    wav, sr = decode_audio(path)
    assert torch.equal(builder.build_waveform(torch.from_numpy(wav), sr).mel, first.mel)
    _write_float_wav(path, _tone(330, 16000, 3.0)[None], 16000)
    second = builder.build(path)
    assert second is not first and not torch.equal(second.mel, first.mel)
    with pytest.raises(PromptError, match="not found"):
        builder.build(tmp_path / "missing.wav")


def test_stand_in_tokens_are_deterministic_per_seed_and_25_hz():
    wav16 = _tone(180, 16000, 6.0) + 0.05 * torch.randn(96000, generator=torch.Generator().manual_seed(0))
    a = StandInTokenizer(CFG.flow.vocab_size, CFG.token_rate_hz, seed=0)(wav16)
    b = StandInTokenizer(CFG.flow.vocab_size, CFG.token_rate_hz, seed=0)(wav16)
    c = StandInTokenizer(CFG.flow.vocab_size, CFG.token_rate_hz, seed=1)(wav16)
    assert a.shape == (150,) and torch.equal(a, b) and not torch.equal(a, c)


def _fake_official_assets(root, n_tokens: int) -> None:
    """Official layout with stand-in graphs of the official I/O signatures."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    assets = root / "assets" / "token2wav"
    assets.mkdir(parents=True)
    # S3 tokenizer: feats [1, 128, T] + feats_length [1] -> argmax over mel bins of every 4th frame
    s3 = helper.make_graph(
        [
            helper.make_node("Slice", ["feats", "starts", "ends", "axes", "steps"], ["picked"]),
            helper.make_node("ArgMax", ["picked"], ["tokens"], axis=1, keepdims=0),
        ],
        "s3",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, None]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, None])],
        initializer=[numpy_helper.from_array(np.array([v], dtype=np.int64), name)
                     for name, v in (("starts", 0), ("ends", 4 * n_tokens), ("axes", 2), ("steps", 4))],
    )
    opset = [helper.make_opsetid("", 17)]
    onnx.save(helper.make_model(s3, opset_imports=opset), str(assets / "speech_tokenizer_v2_25hz.onnx"))
    proj = np.random.default_rng(0).standard_normal((80, 192)).astype(np.float32)
    spk = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["m"], axes=[1], keepdims=0),
         helper.make_node("MatMul", ["m", "proj"], ["embedding"])],
        "spk",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, None, 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 192])],
        initializer=[numpy_helper.from_array(proj, "proj")],
    )
    onnx.save(helper.make_model(spk, opset_imports=opset), str(assets / "campplus.onnx"))


def test_official_assets_feed_whisper_mel_to_s3_tokenizer_and_crop_mel(tmp_path):
    _fake_official_assets(tmp_path, n_tokens=140)
    builder = _builder(weights_dir=str(tmp_path), extra={"token2wav_device_spk": False})
    wav = _tone(250, 24000, 6.0)
    prompt = builder.build_waveform(wav, 24000)
    feats = whisper_log_mel(resample(wav, 24000, 16000))
    assert torch.equal(prompt.tokens, feats[:, : 4 * 140 : 4].argmax(dim=0))
    assert prompt.mel.shape == (280, 80)  # cropped to 2 x prompt tokens
    assert prompt.spk_embedding.shape == (192,)


def test_official_dir_without_tokenizer_is_a_typed_error(tmp_path):
    _fake_official_assets(tmp_path, n_tokens=150)
    (tmp_path / "assets" / "token2wav" / "speech_tokenizer_v2_25hz.onnx").unlink()
    with pytest.raises(PromptError, match="speech tokenizer not found"):
        _builder(weights_dir=str(tmp_path), extra={"token2wav_device_spk": "false"})
