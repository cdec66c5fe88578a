"""HiFT vocoder: official sizes, shapes, source cache, weight-norm folding, streaming contract."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from stages.code2wav.config import HiFTConfig
from stages.code2wav.hift import HiFTGenerator, HiFTState, HiFTStream, fold_weight_norm

TINY = HiFTConfig(base_channels=32, f0_predictor_channels=32)
SPF = TINY.samples_per_frame  # 480
TAIL = TINY.source_cache_samples  # 3840


def _tiny(seed: int = 0, cfg: HiFTConfig = TINY) -> HiFTGenerator:
    torch.manual_seed(seed)
    return HiFTGenerator(cfg).eval()


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_full_size_matches_official_key_and_parameter_counts():
    with torch.device("meta"):
        model = HiFTGenerator(HiFTConfig())
    state = model.state_dict()
    assert len(state) == 328
    assert sum(v.numel() for v in state.values()) == 20_821_295
    assert sum(v.numel() for k, v in state.items() if k.startswith("f0_predictor.")) == 3_274_241
    for key in ("m_source.l_linear.weight", "conv_pre.parametrizations.weight.original0",
                "ups.2.parametrizations.weight.original1", "source_downs.0.weight",
                "source_resblocks.2.activations2.2.alpha", "resblocks.8.convs1.2.bias",
                "conv_post.bias", "f0_predictor.condnet.8.parametrizations.weight.original1",
                "f0_predictor.classifier.weight"):
        assert key in state, key


def test_inference_shapes_range_and_source_length():
    model = _tiny()
    mel = torch.randn(2, 80, 12)
    speech, source = model.inference(mel, torch.zeros(2, 1, 0), generator=_gen())
    assert speech.shape == (2, 12 * SPF) and source.shape == (2, 1, 12 * SPF)
    assert torch.isfinite(speech).all() and speech.abs().max() <= TINY.audio_limit


def test_same_generator_seed_gives_identical_audio_and_other_seed_differs():
    model, mel = _tiny(), torch.randn(1, 80, 10)
    a, _ = model.inference(mel, torch.zeros(1, 1, 0), generator=_gen(5))
    b, _ = model.inference(mel, torch.zeros(1, 1, 0), generator=_gen(5))
    c, _ = model.inference(mel, torch.zeros(1, 1, 0), generator=_gen(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_cache_source_overwrites_start_of_new_source():
    model, mel = _tiny(), torch.randn(1, 80, 10)
    cache = torch.full((1, 1, 2 * SPF), 0.25)
    _, source = model.inference(mel, cache, generator=_gen())
    assert torch.equal(source[:, :, : 2 * SPF], cache)
    assert not torch.equal(source[:, :, 2 * SPF : 3 * SPF], torch.full((1, 1, SPF), 0.25))


def test_folding_weight_norm_is_bit_identical():
    model, mel = _tiny(), torch.randn(2, 80, 9)
    before, _ = model.inference(mel, torch.zeros(2, 1, 0), generator=_gen())
    assert fold_weight_norm(model) == 82  # 3 ups + conv_pre/post + 72 resblock convs + 5 f0 convs
    after, _ = model.inference(mel, torch.zeros(2, 1, 0), generator=_gen())
    assert torch.equal(before, after)
    assert not any("parametrizations" in k for k in model.state_dict())


def test_batched_rows_match_single_rows_with_deterministic_source():
    # nsf_alpha = nsf_sigma = 0 removes the random source, so rows are comparable across batches;
    # batched conv kernels may sum in another order, hence allclose rather than equal.
    cfg = dataclasses.replace(TINY, nsf_alpha=0.0, nsf_sigma=0.0)
    model, mel = _tiny(cfg=cfg), torch.randn(2, 80, 8)
    both, _ = model.inference(mel, torch.zeros(2, 1, 0))
    one, _ = model.inference(mel[1:], torch.zeros(1, 1, 0))
    torch.testing.assert_close(both[1:], one, atol=1e-6, rtol=0)


# ---- streaming ---------------------------------------------------------------------------------


def test_first_chunk_emits_20160_and_steady_chunk_24000_samples():
    model, stream = _tiny(), HiFTStream(TINY)
    out, states = stream.decode(model, torch.randn(1, 80, 50), [None], [False], generator=_gen())
    assert [o.numel() for o in out] == [20160]
    assert states[0].mel_cache.shape == (80, 8) and states[0].source_cache.shape == (1, TAIL)
    assert states[0].speech_tail.shape == (TAIL,)
    out, states = stream.decode(model, torch.randn(1, 80, 50), states, [False], generator=_gen())
    assert [o.numel() for o in out] == [24000]
    out, states = stream.decode(model, torch.randn(1, 80, 50), states, [True], generator=_gen())
    assert [o.numel() for o in out] == [24000 + TAIL] and states == [None]


class _FixedVocoder:
    """Stands in for HiFT: returns a known waveform so the cross-fade arithmetic is checkable."""

    def __init__(self, speech: torch.Tensor):
        self.speech = speech
        self.seen_mel = None

    def inference(self, mel, cache_source, *, generator=None):
        self.seen_mel = mel
        return self.speech.clone(), torch.zeros(mel.shape[0], 1, mel.shape[2] * SPF)


def test_crossfade_uses_rising_hamming_on_new_and_falling_on_old():
    frames = 10
    new = torch.linspace(-0.5, 0.5, (frames + 8) * SPF)[None]
    old_tail = torch.linspace(0.3, -0.2, TAIL)
    state = HiFTState(torch.randn(80, 8), torch.zeros(1, TAIL), old_tail)
    fake, stream = _FixedVocoder(new), HiFTStream(TINY)
    mel = torch.randn(1, 80, frames)
    out, states = stream.decode(fake, mel, [state], [False])
    window = torch.hamming_window(2 * TAIL, periodic=False, dtype=torch.float64).float()
    expect = new[0].clone()
    expect[:TAIL] = new[0, :TAIL] * window[:TAIL] + old_tail * window[TAIL:]
    assert torch.equal(out[0], expect[:-TAIL])
    assert torch.equal(states[0].speech_tail, expect[-TAIL:])
    assert torch.equal(fake.seen_mel[0, :, :8], state.mel_cache)  # mel_in = [cached 8 | new]
    assert torch.equal(fake.seen_mel[0, :, 8:], mel[0])


def test_rows_with_mixed_first_and_continuing_states_are_rejected():
    model, stream = _tiny(), HiFTStream(TINY)
    _, states = stream.decode(model, torch.randn(1, 80, 10), [None], [False], generator=_gen())
    with pytest.raises(AssertionError):
        stream.decode(model, torch.randn(2, 80, 10), [states[0], None], [False, False])


def test_streamed_state_is_independent_of_later_calls():
    model, stream = _tiny(), HiFTStream(TINY)
    _, states = stream.decode(model, torch.randn(1, 80, 20), [None], [False], generator=_gen())
    snapshot = copy.deepcopy(states[0])
    stream.decode(model, torch.randn(1, 80, 20), states, [False], generator=_gen())
    assert torch.equal(states[0].speech_tail, snapshot.speech_tail)
    assert torch.equal(states[0].source_cache, snapshot.source_cache)


@pytest.mark.gpu
def test_cuda_inference_matches_cpu_with_shared_source():
    cfg = dataclasses.replace(TINY, nsf_alpha=0.0, nsf_sigma=0.0)  # deterministic source
    cpu = _tiny(cfg=cfg)
    fold_weight_norm(cpu)
    cuda = copy.deepcopy(cpu).to("cuda")
    cuda.init_buffers()
    mel = torch.randn(2, 80, 30)
    a, _ = cpu.inference(mel, torch.zeros(2, 1, 0))
    b, _ = cuda.inference(mel.cuda(), torch.zeros(2, 1, 0, device="cuda"))
    torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=0)
