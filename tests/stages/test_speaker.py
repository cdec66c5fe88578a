"""Speaker embedding: CAM++ torch vs onnxruntime, branch selection, ONNX export cache, lifting."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch

from stages.code2wav.campplus import CAMPPlus, init_campplus_
from stages.code2wav.config import SpeakerConfig
from stages.code2wav.options import Code2WavOptions
from stages.code2wav.speaker import (
    DEVICE_SPK_ENV,
    SpeakerEmbedder,
    SpeakerWeightsError,
    export_onnx,
    lift_campplus_state,
    weights_digest,
)
from stages.flags import FlagError

TORCH_VS_ONNX_TOL = 1e-4  # measured ~1e-6 (fp32 kernel order differences only)


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """One export per module: XDG_CACHE_HOME points at a temp dir for every test here."""
    home = tmp_path_factory.mktemp("xdg")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(home))
        mp.delenv(DEVICE_SPK_ENV, raising=False)
        yield home


def _embedder(extra: dict, weights_dir: str | None = None) -> SpeakerEmbedder:
    """The embedder a code2wav stage with this `extra` builds: the flag parsed as the stage parses it."""
    device_spk = Code2WavOptions.from_extra(extra).device_spk
    return SpeakerEmbedder(SpeakerConfig(), device=torch.device("cpu"), device_spk=device_spk, weights_dir=weights_dir)


@pytest.fixture(scope="module")
def fbank():
    return torch.randn(320, 80, generator=torch.Generator().manual_seed(7))


def test_full_cam_plus_plus_has_192_dim_output():
    model = init_campplus_(CAMPPlus(SpeakerConfig()).eval(), 0)
    with torch.no_grad():
        out = model(torch.randn(2, 150, 80))
    assert out.shape == (2, 192)
    assert "xvector.block3.tdnnd16.cam_layer.linear_local.weight" in model.state_dict()


def test_torch_and_onnxruntime_paths_agree_on_same_weights(cache_home, fbank, caplog):
    with caplog.at_level(logging.INFO, logger="stages.code2wav.speaker"):
        dev = _embedder({})
        ort = _embedder({"token2wav_device_spk": "false"})
    assert dev.on_device and not ort.on_device
    assert "device-torch (cpu) branch" in caplog.text and "cpu-onnxruntime branch" in caplog.text
    for frames in (fbank, fbank[:137]):  # dynamic length, partial 100-frame segment
        a, b = dev.embed(frames), ort.embed(frames)
        assert a.shape == b.shape == (192,)
        diff = (a - b).abs().max().item()
        assert diff < TORCH_VS_ONNX_TOL, diff
    assert list(cache_home.glob("tts-bench/campplus-*.onnx"))


def test_export_is_cached_by_weight_hash(cache_home):
    model = init_campplus_(CAMPPlus(SpeakerConfig()).eval(), 0)
    first = export_onnx(model)  # already exported by the embedder above (same seed, same hash)
    stamp = first.stat().st_mtime_ns
    assert export_onnx(model) == first and first.stat().st_mtime_ns == stamp
    other = init_campplus_(CAMPPlus(SpeakerConfig()).eval(), 1)
    assert first.name == f"campplus-{weights_digest(model)}.onnx"
    assert weights_digest(other) != weights_digest(model)


def test_env_opt_out_selects_onnxruntime(cache_home, monkeypatch):
    monkeypatch.setenv(DEVICE_SPK_ENV, "0")
    assert not _embedder({"token2wav_device_spk": True}).on_device


def test_null_flag_keeps_device_default_and_junk_raises(cache_home):
    assert _embedder({"token2wav_device_spk": None}).on_device
    with pytest.raises(FlagError, match="token2wav_device_spk"):
        _embedder({"token2wav_device_spk": "flase"})


@pytest.mark.slow
def test_official_layout_runs_both_paths_from_one_onnx_file(cache_home, tmp_path, fbank):
    # With official assets nothing is seeded: the device branch must lift every weight out of the
    # graph (BN-folded convs included) or it could not match onnxruntime on the same file.
    assets = tmp_path / "assets" / "token2wav"
    assets.mkdir(parents=True)
    shutil.copy(export_onnx(init_campplus_(CAMPPlus(SpeakerConfig()).eval(), 0)), assets / "campplus.onnx")
    torch.manual_seed(123)  # the model's default init differs from the graph's weights
    dev = _embedder({}, str(tmp_path))
    ort = _embedder({"token2wav_device_spk": 0}, str(tmp_path))
    assert dev.on_device and not ort.on_device
    assert (dev.embed(fbank) - ort.embed(fbank)).abs().max().item() < TORCH_VS_ONNX_TOL


def test_unliftable_graph_raises_and_missing_file_is_a_typed_error(cache_home, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["embedding"])], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, None, 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, None, 80])],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph), os.fspath(path))
    with pytest.raises(SpeakerWeightsError, match="Conv nodes"):
        lift_campplus_state(path, CAMPPlus(SpeakerConfig()))
    with pytest.raises(SpeakerWeightsError, match="campplus.onnx"):
        _embedder({}, str(tmp_path))


@pytest.mark.gpu
def test_cuda_torch_path_matches_onnxruntime(cache_home, fbank):
    dev = SpeakerEmbedder(SpeakerConfig(), device=torch.device("cuda"))
    ort = SpeakerEmbedder(SpeakerConfig(), device=torch.device("cuda"), device_spk=False)
    a, b = dev.embed(fbank), ort.embed(fbank)
    assert a.device.type == b.device.type == "cuda"
    # TF32 may be on for convs on the device: a looser bound than the CPU fp32 comparison.
    assert (a - b).abs().max().item() < 5e-2
