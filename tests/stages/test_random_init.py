"""Random code2wav weights keep the signal alive (random_init, D-INIT-1): the mel reaches the
audio, the f0 predictor voices frames, the audio sits at a speech level, and the draw is
reproducible per seed. The modules' own initialisations fail the first two (checked here too,
so the tests show what they guard against)."""

from __future__ import annotations

import pytest
import torch

from stages.code2wav.hift import HiFTGenerator, fold_weight_norm
from stages.code2wav.random_init import init_flow_, init_hift_
from stages.code2wav.flow import FlowModel
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

INT16_STEP = 1.0 / 32768.0


def _hift(*, scale_keeping: bool, seed: int = 1) -> HiFTGenerator:
    torch.manual_seed(seed)
    hift = HiFTGenerator(tiny_config().hift)
    fold_weight_norm(hift)
    if scale_keeping:
        init_hift_(hift, seed=seed)
    return hift.eval()


def _audio(hift: HiFTGenerator, mel: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    audio, _ = hift.inference(mel, mel.new_zeros(1, 1, 0), generator=gen)
    return audio[0]


def _mel() -> torch.Tensor:
    # Shaped like the random-weight flow's output (zero-mean, std ~1.7): slow bands that move
    # over 100 frames.
    t = torch.arange(100, dtype=torch.float32)
    bins = torch.arange(80, dtype=torch.float32)[:, None]
    return (3.0 * torch.sin(bins / 9.0 + t / 15.0) * torch.cos(t / 23.0))[None]


@pytest.mark.parametrize("scale_keeping", [True, False])
def test_the_mel_reaches_the_audio_only_with_scale_keeping_weights(scale_keeping):
    hift = _hift(scale_keeping=scale_keeping)
    diff = (_audio(hift, _mel()) - _audio(hift, torch.zeros(1, 80, 100))).abs().max().item()
    if scale_keeping:
        assert diff > 1000 * INT16_STEP
    else:  # the HiFi-GAN training init erases it: under one int16 step
        assert diff < INT16_STEP


def test_the_f0_predictor_voices_most_frames_and_follows_the_mel():
    hift = _hift(scale_keeping=True)
    with torch.inference_mode():
        f0 = hift.f0_predictor(_mel())[0]
        other = hift.f0_predictor(_mel().flip(2))[0]
    voiced = (f0 > hift.cfg.nsf_voiced_threshold).float().mean().item()
    assert voiced > 0.5
    assert 20.0 < f0.median().item() < 400.0
    assert (f0 - other.flip(0)).abs().max().item() > 1.0  # not a constant: the mel moves it
    with torch.inference_mode():
        assert _hift(scale_keeping=False).f0_predictor(_mel()).max().item() < hift.cfg.nsf_voiced_threshold


def test_the_audio_sits_at_a_speech_level_inside_the_clamp():
    audio = _audio(_hift(scale_keeping=True), _mel())
    rms = audio.pow(2).mean().sqrt().item()
    assert 0.01 < rms < 0.3
    assert audio.abs().max().item() < tiny_config().hift.audio_limit


def test_the_draw_is_a_function_of_the_seed():
    a, b, c = (_hift(scale_keeping=True, seed=s) for s in (3, 3, 4))
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.conv_pre.weight, c.conv_pre.weight)
    # The flow's Linear/Conv weights come from the seed alone, whatever the global RNG did.
    flows = []
    for global_seed in (5, 6):
        torch.manual_seed(global_seed)
        flows.append(init_flow_(FlowModel(tiny_config()), seed=5))
    drawn = [(n, m) for n, m in flows[0].named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d))]
    other = dict(flows[1].named_modules())
    assert drawn
    for name, module in drawn:
        assert torch.equal(module.weight, other[name].weight), name


def test_the_speaker_projection_keeps_a_unit_norm_embedding_at_unit_scale():
    flow = init_flow_(FlowModel(tiny_config()), seed=0)
    emb = torch.nn.functional.normalize(torch.randn(4, tiny_config().speaker.embedding_dim), dim=1)
    with torch.no_grad():
        row = flow.spk_embed_affine_layer(emb)
    assert 0.5 < row.std().item() < 2.0


def test_a_weight_normed_module_is_refused_until_folded():
    torch.manual_seed(0)
    hift = HiFTGenerator(tiny_config().hift)
    with pytest.raises(ValueError, match="fold weight norm first"):
        init_hift_(hift, seed=0)
