"""Audio front ends: slaney filterbank, prompt mel, Kaldi fbank, Whisper log-mel, resampler."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from stages.code2wav.mel import (
    FbankConfig,
    MelConfig,
    kaldi_fbank,
    kaldi_mel_banks,
    prompt_mel,
    resample,
    slaney_mel_filterbank,
    whisper_log_mel,
)


def _tone(freq: float, sr: int, seconds: float, amp: float = 0.5) -> torch.Tensor:
    t = torch.arange(int(sr * seconds), dtype=torch.float64) / sr
    return (amp * torch.sin(2 * math.pi * freq * t)).float()


def test_slaney_filters_have_unit_area_and_cover_fmin_to_fmax():
    cfg = MelConfig()
    fb = slaney_mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax)
    assert fb.shape == (80, cfg.n_fft // 2 + 1) and fb.dtype == torch.float32
    bin_hz = cfg.sample_rate / cfg.n_fft
    area = fb.double().sum(dim=1) * bin_hz  # slaney norm: each triangle integrates to ~1
    torch.testing.assert_close(area[5:], torch.ones(75, dtype=torch.float64), atol=0.02, rtol=0)
    freqs = torch.arange(fb.shape[1]) * bin_hz
    assert fb[:, freqs > cfg.fmax].abs().max() == 0
    centers = freqs[fb.argmax(dim=1)]
    assert (centers.diff() >= 0).all()  # bands ascend
    # Below 1 kHz the slaney scale is linear: equal spacing of band centres (~37 Hz at 80/8 kHz).
    spacing = centers[:20].diff().float()
    assert spacing.max() - spacing.min() <= bin_hz


def test_prompt_mel_of_six_seconds_is_300_frames_and_peaks_at_tone():
    wav = _tone(1000.0, 24000, 6.0)
    mel = prompt_mel(wav)
    assert mel.shape == (300, 80)
    fb = slaney_mel_filterbank(24000, 1920, 80, 0.0, 8000.0)
    expected_band = int(fb[:, round(1000 / 12.5)].argmax())
    assert (mel[10:-10].argmax(dim=1) == expected_band).all()
    silent = prompt_mel(torch.zeros(24000))
    assert torch.allclose(silent, torch.full_like(silent, math.log(1e-5)))  # clamp floor


def test_kaldi_fbank_frames_mean_and_tone_bin():
    noise = 1e-3 * torch.randn(16000, generator=torch.Generator().manual_seed(0))
    wav = noise + torch.cat([_tone(2000.0, 16000, 0.5), torch.zeros(8000)])  # tone, then near-silence
    feats = kaldi_fbank(wav)
    assert feats.shape == (1 + (16000 - 400) // 160, 80)
    torch.testing.assert_close(feats.mean(dim=0), torch.zeros(80), atol=1e-4, rtol=0)
    banks = kaldi_mel_banks(FbankConfig(), 512)
    assert banks.shape == (80, 257) and banks[:, -1].abs().max() == 0
    tone_band = int(banks[:, round(2000 / (16000 / 512))].argmax())
    assert int(feats[20].argmax()) == tone_band  # tone frames: biggest rise above the mean
    assert int(feats[80].argmin()) == tone_band  # silent frames: biggest drop below it
    with pytest.raises(ValueError):
        kaldi_fbank(torch.zeros(100))


def _torchaudio_kaldi():
    """torchaudio.compliance.kaldi (what the official CosyVoice / CAM++ frontend calls), or skip.

    Loaded from its source file rather than by `import torchaudio`: PyPI's torchaudio wheel links
    the CUDA build of torch (libc10_cuda.so), so with the CPU torch that CI and the README's
    setup install, `import torchaudio` raises OSError while kaldi.py itself is plain torch (it
    touches the package only for MFCC's DCT matrix, which fbank never reaches)."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("torchaudio")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torchaudio is not installed (the `audio-reference` extra; CI installs it)")
    path = Path(spec.submodule_search_locations[0]) / "compliance" / "kaldi.py"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_torchaudio_kaldi", path))
    saved = sys.modules.get("torchaudio")
    sys.modules["torchaudio"] = types.ModuleType("torchaudio")  # kaldi.py's `import torchaudio`
    try:
        module.__spec__.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["torchaudio"]
        else:
            sys.modules["torchaudio"] = saved
    return module


REAL_SPEECH = sorted((Path(__file__).resolve().parents[2] / "tts_bench/data/seed-tts-en/prompts").glob("*.wav"))


@pytest.mark.parametrize("path", REAL_SPEECH, ids=lambda p: p.name)
def test_kaldi_fbank_matches_torchaudio_on_real_speech(path):
    # Why our own fbank stays (mel.py's docstring): torchaudio cannot be a dependency of the stages.
    # Measured on the three builtin prompts: max |diff| 2.3e-4 to 2.6e-4 of log energies spanning
    # about +-13 (in the quietest bands, float32 rounding), mean 2.5e-6.
    kaldi = _torchaudio_kaldi()
    from stages.audio import decode_audio

    wav, rate = decode_audio(path)
    wav16 = resample(torch.from_numpy(wav).mean(0), rate, 16000)
    ours = kaldi_fbank(wav16)
    ref = kaldi.fbank(wav16[None], num_mel_bins=80, dither=0.0, sample_frequency=16000)
    ref = ref - ref.mean(dim=0, keepdim=True)  # CosyVoice's frontend subtracts the time mean too
    diff = (ours - ref).abs()
    assert ours.shape == ref.shape == (598, 80)
    assert float(diff.max()) < 1e-3 and float(diff.mean()) < 1e-5, (float(diff.max()), float(diff.mean()))


def test_whisper_log_mel_shape_and_range():
    mel = whisper_log_mel(_tone(440.0, 16000, 6.0))
    assert mel.shape == (128, 600)  # 100 frames/s -> 150 tokens at 25 Hz
    # log10 power clipped to 8 decades below the peak, then (x + 4) / 4: a range of at most 2.
    assert 1.0 < float(mel.max() - mel.min()) <= 2.0 + 1e-6
    fb = slaney_mel_filterbank(16000, 400, 128, 0.0, 8000.0)
    assert int(mel[:, 300].argmax()) == int(fb[:, round(440 / 40)].argmax())


@pytest.mark.parametrize(
    "orig,new", [(16000, 24000), (22050, 24000), (24000, 16000), (44100, 24000), (48000, 16000), (48000, 24000)]
)
def test_resampler_keeps_in_band_tone_and_length(orig, new):
    wav = _tone(440.0, orig, 0.5)
    out = resample(wav, orig, new)
    assert out.shape == (math.ceil(wav.numel() * new / orig),)
    ref = _tone(440.0, new, 0.5)[: out.numel()]
    mid = slice(new // 20, out.numel() - new // 20)  # skip edge transients
    assert (out[mid] - ref[mid]).abs().max() < 5e-3


def test_resampler_removes_content_above_new_nyquist_and_keeps_batch_dims():
    wav = _tone(11000.0, 48000, 0.5)  # above 8 kHz Nyquist of 16 kHz
    out = resample(wav, 48000, 16000)
    assert out[800:-800].abs().max() < 0.01
    batch = torch.stack([_tone(300.0, 24000, 0.2), _tone(600.0, 24000, 0.2)])
    two = resample(batch, 24000, 16000)
    assert two.shape == (2, 3200)
    assert torch.allclose(two[1], resample(batch[1], 24000, 16000), atol=1e-6)
    assert resample(wav, 16000, 16000) is wav
