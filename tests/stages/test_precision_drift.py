"""`scripts/precision_drift.py` on the tiny dims on the CPU: the reference it names, the modes it
runs or skips, and the lossy label."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tts_bench.reference.official import official_available


@pytest.mark.parametrize("reference", ["auto", "project"])
def test_drift_reports_fp32_and_bf16_against_the_reference_and_labels_bf16_lossy(
    reference, tmp_path, monkeypatch, capsys, deterministic
):
    from scripts import precision_drift

    argv = ["precision_drift.py", "--tiny", "--device", "cpu", "--streams", "1", "--chunks", "1",
            "--modes", "fp32,bf16 DiT,tf32 all", "--reference", reference, "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    before = torch.get_num_threads()
    try:
        assert precision_drift.main() == 0
    finally:
        torch.set_num_threads(before)
    which = "official" if reference == "auto" and official_available() is None else "project"
    doc = json.loads((tmp_path / f"precision_drift_{which}_tiny.json").read_text())
    assert doc["reference_is_official"] is (which == "official")
    rows = {r["mode"]: r for r in doc["rows"]}
    assert rows["tf32 all"]["skipped"].startswith("CUDA only")
    if which == "official":
        assert rows["fp32"]["lossy"] is False and rows["fp32"]["mel_snr_db"] > 100  # measured 131 dB
    else:  # the project's fp32 path against itself: the same bits
        assert rows["fp32"]["max_abs_mel"] == 0.0 and rows["fp32"]["mel_snr_db"] == "inf"
    assert rows["bf16 DiT"]["lossy"] is True and rows["bf16 DiT"]["ran"]["dit_dtype"] == "bfloat16"  # 47 dB
    assert "| bf16 DiT |" in (tmp_path / f"precision_drift_{which}_tiny.md").read_text()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == doc["rows"]
