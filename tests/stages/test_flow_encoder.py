"""Flow encoder + flow weights: shapes, chunked == masked one-shot, official key/param counts."""

from __future__ import annotations

import pytest
import torch

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.flow import FlowModel
from stages.code2wav.flow_encoder import UpsampleConformerEncoderV2, block_causal_mask
from stages.code2wav.weights import FlowWeightsError, load_flow_weights
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

CHUNK_TOL = 1e-5  # fp32: chunked vs one-shot differ only by summation order


def _encoder(seed: int = 0) -> UpsampleConformerEncoderV2:
    torch.manual_seed(seed)
    return UpsampleConformerEncoderV2(tiny_config().flow).eval()


def test_full_size_flow_matches_official_checkpoint_counts():
    with torch.device("meta"):
        flow = FlowModel(Code2WavConfig())
    parts = {
        name: sum(p.numel() for p in flow.get_submodule(name).parameters())
        for name in ("encoder", "decoder.estimator", "input_embedding", "spk_embed_affine_layer", "encoder_proj")
    }
    assert len(flow.state_dict()) == 605
    assert sum(p.numel() for p in flow.parameters()) == 155_802_352
    assert parts == {
        "encoder": 37_831_168,
        "decoder.estimator": 114_555_472,
        "input_embedding": 3_359_232,
        "spk_embed_affine_layer": 15_440,
        "encoder_proj": 41_040,
    }


def test_full_size_prompt_setup_shapes_and_att_bytes_per_frame_on_meta():
    """Real dims, no data: a 6 s prompt (150 tokens + 3 lookahead) fills caches of the spec's
    shapes, and estimator_att costs 1.25 MiB per frame per request in fp32 (spec §4.4)."""
    cfg = Code2WavConfig()
    with torch.device("meta"):
        flow = FlowModel(cfg)
        flow.decoder.noise = torch.empty(1, cfg.mel_bins, cfg.noise_frames)
        tokens = torch.zeros(1, 153, dtype=torch.long)
        enc = flow.encode_chunk(tokens, None, None, last_chunk=False)
        out = flow.decoder.solve(enc.mu, torch.empty(1, 80), enc.mu, cnn_cache=None, att_cache=None)
    assert enc.cnn_cache.shape == (1, 512, 6)
    assert enc.att_cache.shape == (10, 1, 8, 300, 128)
    assert out.cnn_cache.shape == (10, 16, 2, 1024, 2)
    assert out.att_cache.shape == (10, 16, 2, 8, 300, 128)
    att = out.att_cache
    bytes_per_frame = att.numel() * 4 // att.shape[4]  # fp32, one request (cond + uncond rows)
    assert bytes_per_frame == int(1.25 * 2**20)


def test_official_key_names_are_used():
    with torch.device("meta"):
        keys = set(FlowModel(Code2WavConfig()).state_dict())
    for key in (
        "encoder.embed.out.0.weight",
        "encoder.pre_lookahead_layer.conv1.weight",
        "encoder.encoders.5.self_attn.pos_bias_u",
        "encoder.up_layer.conv.weight",
        "encoder.up_encoders.3.feed_forward.w_2.bias",
        "encoder.after_norm.weight",
        "decoder.estimator.blocks.15.conv.block.6.weight",
        "decoder.estimator.final_layer.adaLN_modulation.1.weight",
        "decoder.estimator.t_embedder.mlp.2.weight",
    ):
        assert key in keys, key
    assert "encoder.encoders.0.self_attn.linear_pos.bias" not in keys


def test_chunk_shapes_and_packed_cache_layout():
    enc, cfg = _encoder(), tiny_config().flow
    xs = torch.randn(2, 28, cfg.input_size)
    out = enc.forward_chunk(xs, None, None, last_chunk=False)
    assert out.hidden.shape == (2, 50, cfg.input_size)
    assert out.cnn_cache.shape == (2, cfg.input_size, 6)
    layers = cfg.num_blocks + cfg.num_up_blocks
    assert out.att_cache.shape == (layers, 2, cfg.attention_heads, 50, 2 * cfg.head_dim)
    low = out.att_cache[: cfg.num_blocks]
    assert torch.equal(low[:, :, :, :25], low[:, :, :, 25:])  # token-rate layers tiled x2
    last = enc.forward_chunk(xs[:, :10], out.cnn_cache, out.att_cache, last_chunk=True)
    assert last.hidden.shape == (2, 20, cfg.input_size)
    assert last.att_cache.shape[3] == 70


def _chunked_vs_one_shot(n_chunks: int, tail: int, masked: bool) -> float:
    enc, d = _encoder(), tiny_config().flow.input_size
    lookahead = 3
    total = 25 * n_chunks + tail
    torch.manual_seed(1)
    xs = torch.randn(1, total + lookahead, d)
    cnn = att = None
    pieces = []
    with torch.no_grad():
        for k in range(n_chunks):
            out = enc.forward_chunk(xs[:, 25 * k : 25 * k + 25 + lookahead], cnn, att, last_chunk=False)
            cnn, att = out.cnn_cache, out.att_cache
            pieces.append(out.hidden)
        out = enc.forward_chunk(xs[:, 25 * n_chunks :], cnn, att, last_chunk=True)
        pieces.append(out.hidden)
        mask = block_causal_mask([25] * n_chunks + [tail + lookahead], xs.device) if masked else None
        ref = enc.forward_chunk(xs, None, None, last_chunk=True, token_mask=mask).hidden
    chunked = torch.cat(pieces, dim=1)
    assert chunked.shape == ref.shape
    return (chunked - ref).abs().max().item()


def test_chunked_encoder_equals_block_causal_one_shot():
    assert _chunked_vs_one_shot(n_chunks=3, tail=7, masked=True) < CHUNK_TOL


def test_one_shot_without_chunk_mask_differs_so_the_check_can_fail():
    assert _chunked_vs_one_shot(n_chunks=2, tail=4, masked=False) > 1e-3


def test_random_checkpoint_round_trip_gives_identical_outputs(tmp_path):
    cfg = tiny_config()
    torch.manual_seed(3)
    src = FlowModel(cfg).eval()
    path = tmp_path / "assets" / "token2wav"
    path.mkdir(parents=True)
    torch.save(src.state_dict(), path / "flow.pt")
    torch.manual_seed(4)
    dst = FlowModel(cfg).eval()
    load_flow_weights(dst, tmp_path)
    tokens = torch.randint(0, cfg.flow.vocab_size, (2, 28))
    a = src.encode_chunk(tokens, None, None, last_chunk=False)
    b = dst.encode_chunk(tokens, None, None, last_chunk=False)
    assert torch.equal(a.mu, b.mu) and torch.equal(a.att_cache, b.att_cache)
    spk = torch.randn(192)
    assert torch.equal(src.project_speaker(spk), dst.project_speaker(spk))


def test_checkpoint_errors_list_missing_and_unexpected_keys(tmp_path):
    cfg = tiny_config()
    model = FlowModel(cfg)
    state = model.state_dict()
    state.pop("encoder_proj.weight")
    state["decoder.estimator.extra.weight"] = torch.zeros(1)
    (tmp_path / "assets" / "token2wav").mkdir(parents=True)
    torch.save(state, tmp_path / "assets" / "token2wav" / "flow.pt")
    with pytest.raises(FlowWeightsError, match="missing keys: encoder_proj.weight.*unexpected keys: decoder"):
        load_flow_weights(model, tmp_path)
    with pytest.raises(FlowWeightsError, match="not found"):
        load_flow_weights(model, tmp_path / "nowhere")
