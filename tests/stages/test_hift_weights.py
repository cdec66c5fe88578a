"""HiFT checkpoint loading: all four official spellings, strict errors, file lookup, meta build."""

from __future__ import annotations

import pytest
import torch

from stages.code2wav.config import HiFTConfig
from stages.code2wav.hift import HiFTGenerator
from stages.code2wav.hift_weights import (
    HiFTWeightsError,
    canonical_hift_state_dict,
    find_hift_checkpoint,
    load_hift,
    official_hift_state_dict,
)

TINY = HiFTConfig(base_channels=32, f0_predictor_channels=32)


def _model(seed: int) -> HiFTGenerator:
    torch.manual_seed(seed)
    model = HiFTGenerator(TINY).eval()
    with torch.no_grad():  # make every tensor seed-specific (biases start at zero/default)
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.01)
    return model


def _speech(model: HiFTGenerator, mel: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    return model.inference(mel, torch.zeros(1, 1, 0), generator=gen)[0]


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("spelling", ["parametrizations", "legacy"])
def test_checkpoint_round_trips_in_every_official_spelling(tmp_path, prefix, spelling):
    source, target = _model(0), _model(1)
    state = official_hift_state_dict(source, prefix=prefix, spelling=spelling)
    assert all(k.startswith("generator.") == prefix for k in state)
    assert any(k.endswith(".weight_g") for k in state) == (spelling == "legacy")
    path = tmp_path / "hift.pt"
    torch.save(state, path)
    mel = torch.randn(1, 80, 6)
    assert not torch.equal(_speech(source, mel), _speech(target, mel))
    load_hift(target, path)
    assert torch.equal(_speech(source, mel), _speech(target, mel))


def test_legacy_names_map_g_to_original0_and_v_to_original1():
    state = {"generator.conv_pre.weight_g": torch.ones(1), "generator.conv_pre.weight_v": torch.zeros(1)}
    assert set(canonical_hift_state_dict(state)) == {
        "conv_pre.parametrizations.weight.original0",
        "conv_pre.parametrizations.weight.original1",
    }


def test_missing_and_unexpected_keys_raise_typed_error_naming_them(tmp_path):
    state = official_hift_state_dict(_model(0), prefix=True, spelling="legacy")
    del state["generator.conv_post.bias"]
    state["generator.extra_head.weight"] = torch.zeros(2)
    torch.save(state, tmp_path / "hift.pt")
    with pytest.raises(HiFTWeightsError) as err:
        load_hift(_model(1), tmp_path / "hift.pt")
    msg = str(err.value)
    assert msg.startswith("error: ") and "conv_post.bias" in msg and "extra_head.weight" in msg


def test_wrong_shapes_are_reported(tmp_path):
    full = official_hift_state_dict(_model(0), prefix=False, spelling="parametrizations")
    full["conv_pre.bias"] = torch.zeros(7)
    torch.save(full, tmp_path / "hift.pt")
    with pytest.raises(HiFTWeightsError, match=r"wrong shape: conv_pre\.bias \(7,\)"):
        load_hift(_model(1), tmp_path / "hift.pt")


def test_unreadable_file_raises_typed_error(tmp_path):
    (tmp_path / "hift.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(HiFTWeightsError, match="cannot read HiFT checkpoint"):
        load_hift(_model(0), tmp_path / "hift.pt")


def test_original_hift_is_preferred_over_the_newer_causal_hift_pt(tmp_path):
    assets = tmp_path / "assets" / "token2wav"
    assets.mkdir(parents=True)
    (assets / "hift.pt").write_bytes(b"")
    assert find_hift_checkpoint(tmp_path) == assets / "hift.pt"
    (assets / "hift_original.pt").write_bytes(b"")
    assert find_hift_checkpoint(tmp_path) == assets / "hift_original.pt"
    with pytest.raises(HiFTWeightsError, match="no hift_original.pt or hift.pt"):
        find_hift_checkpoint(tmp_path / "elsewhere")


def test_model_built_on_meta_loads_with_assign_and_matches(tmp_path):
    source = _model(0)
    torch.save(official_hift_state_dict(source, prefix=True, spelling="legacy"), tmp_path / "hift.pt")
    with torch.device("meta"):
        target = HiFTGenerator(TINY)
    load_hift(target, tmp_path / "hift.pt")
    target.eval()
    assert not target.stft_window.is_meta
    mel = torch.randn(1, 80, 6)
    assert torch.equal(_speech(source, mel), _speech(target, mel))
