"""The deviation figures of `tts_bench.reference.fidelity` and the precision-drift table."""

from __future__ import annotations

import math

import pytest
import torch

from tts_bench.reference import fidelity as fd


def test_snr_of_a_known_error_is_its_energy_ratio_in_db():
    ref = torch.ones(1000)
    assert fd.snr_db(ref, ref + 0.01) == pytest.approx(40.0)
    assert fd.snr_db(ref, ref) == math.inf


def test_mel_lsd_is_the_rms_over_bins_of_the_db_difference():
    ref = torch.zeros(80, 10)
    assert fd.mel_lsd_db(ref, ref + 1.0) == pytest.approx(fd.DB_PER_NEPER)  # 1 neper = 8.686 dB
    assert fd.mel_lsd_db(ref, ref) == 0.0


def test_waveform_lsd_is_zero_for_equal_audio_and_grows_with_a_gain_change():
    wav = torch.randn(24000, generator=torch.Generator().manual_seed(0))
    assert fd.lsd_db(wav, wav) == 0.0
    assert fd.lsd_db(wav, 2 * wav) == pytest.approx(20 * math.log10(2), rel=1e-3)  # 6 dB everywhere


def test_a_mode_below_60_db_mel_snr_is_lossy():
    mel = torch.randn(80, 50, generator=torch.Generator().manual_seed(1))
    wav = torch.randn(24000, generator=torch.Generator().manual_seed(2))
    close = fd.deviation(mel, mel + 1e-4 * mel, wav, wav)
    far = fd.deviation(mel, mel + 0.01 * torch.randn(80, 50), wav, wav)
    assert not close.lossy and close.mel_snr_db == pytest.approx(80.0, abs=1e-3)
    assert far.lossy and far.as_dict()["lossy"] is True
    assert close.max_abs_wav == 0.0 and close.wav_snr_db == math.inf


def test_the_drift_table_names_skipped_modes_and_labels_lossy_ones():
    from scripts.precision_drift import table

    row = {"max_abs_mel": 0.5, "mel_snr_db": 21.0, "mel_lsd_db": 1.0, "max_abs_wav": 1e-3, "wav_snr_db": 40.0,
           "lsd_db": 2.0, "lossy": True}
    lines = table([{"mode": "bf16 DiT", **row}, {"mode": "tf32 all", "skipped": "CUDA only (device cpu)"}])
    assert lines[2] == "| bf16 DiT | 0.5 | 21 | 1 | 0.001 | 40 | 2 | lossy |"
    assert lines[3].startswith("| tf32 all | skipped: CUDA only (device cpu) |")
