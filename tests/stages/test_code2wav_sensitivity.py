"""scripts/code2wav_sensitivity.py on the tiny dims: the measurement that settled D-INIT-1 runs,
writes its JSON, and reads what the random-init tests assert (codes, voice and mel reach the
audio; f0 voiced)."""

from __future__ import annotations

import json

import pytest

from scripts.code2wav_sensitivity import main
from tests.stages.code2wav_tiny import single_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")


def test_the_tiny_measurement_sees_codes_voice_and_mel_in_the_audio(tmp_path, capsys):
    assert main(["--tiny", "--seconds", "1", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "code2wav_sensitivity_tiny.json").read_text())
    assert doc == json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["init"] == "project" and doc["dims"] == "tiny"
    for comparison in ("codes", "voice", "mel_vs_zero_mel"):
        assert doc[comparison]["audio"]["int16_differ"] > 0.5, comparison
    assert doc["f0"]["voiced_share"] > 0.5
    assert set(doc["mel_vs_zero_mel"]["trace_max_abs"]) == {"conv_pre", "up0", "up1", "up2", "conv_post"}
