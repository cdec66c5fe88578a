"""The official token2wav modules (minicpmo-utils 1.0.7) as the reference decoder: they import
without their heavy optional dependencies, build at the project's dims, take the project's weights
key for key, and build with their own initialisation.

Without the official modules these tests skip with the install line as the reason; with
TTS_BENCH_REQUIRE_OFFICIAL=1 (`.ci/run` sets it and installs them) they fail instead.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import replace

import pytest
import torch

from tests.stages.code2wav_tiny import tiny_config
from tts_bench.reference import official
from tts_bench.reference.official import OfficialUnavailable, build_official, official_available


@pytest.fixture(scope="module")
def pair():
    """(the project's Token2Wav, the official modules with its weights), tiny dims, fp32."""
    why = official_available()
    if why is not None:
        if os.environ.get("TTS_BENCH_REQUIRE_OFFICIAL"):
            pytest.fail(why)
        pytest.skip(why)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    from stages.code2wav.token2wav import Token2Wav

    cfg = tiny_config(extra={"code2wav_dit_tf32x3": False, "code2wav_triton_attention": False})
    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True)
    yield t2w, build_official(cfg, init="project", project=t2w)
    torch.set_num_threads(before)


def test_project_weights_load_into_the_official_modules_key_for_key(pair):
    t2w, dec = pair
    assert set(dec.flow.state_dict()) == set(t2w.flow.state_dict())
    assert set(dec.hift.state_dict()) == set(t2w.hift.state_dict())
    for ours, theirs in ((t2w.flow, dec.flow), (t2w.hift, dec.hift)):
        for key, value in ours.state_dict().items():
            assert torch.equal(theirs.state_dict()[key], value), key
    assert torch.equal(dec.flow.decoder.rand_noise, t2w.flow.decoder.noise)


def test_official_init_builds_the_official_modules_own_weights_deterministically(pair):
    cfg = pair[0].cfg
    a, b = build_official(cfg, init="official", seed=3), build_official(cfg, init="official", seed=3)
    for key, value in a.flow.state_dict().items():
        assert torch.equal(value, b.flow.state_dict()[key]), key
    # upstream's adaLN-zero: the final layer and every block's modulation start at zero
    assert not a.flow.decoder.estimator.final_layer.linear.weight.any()
    assert not a.flow.decoder.estimator.blocks[0].adaLN_modulation[-1].weight.any()
    assert not torch.equal(a.flow.decoder.rand_noise, pair[1].flow.decoder.rand_noise)


def test_importing_the_official_modules_leaves_torch_dynamo_settings_alone(pair):
    dynamo = torch._dynamo.config
    saved = dynamo.suppress_errors, dynamo.cache_size_limit
    official.official_modules.__wrapped__()
    assert (dynamo.suppress_errors, dynamo.cache_size_limit) == saved


def test_a_missing_distribution_raises_a_typed_error_naming_the_install_line(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(OfficialUnavailable, match=r"minicpmo-utils is not installed.*pip install --no-deps minicpmo-utils==1\.0\.7"):
        official.official_modules.__wrapped__()


def test_an_unknown_init_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="official, project"):
        build_official(replace(tiny_config()), init="xavier")
