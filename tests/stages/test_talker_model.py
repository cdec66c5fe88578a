"""Talker modules on a tiny config (real vocab sizes and ids): shapes, cache paths, weight norm."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from stages.talker.config import TalkerConfig
from stages.talker.model import TalkerModel, apply_rope

# fp32 on CPU: the cached and uncached paths differ only in reduction order.
TOL = dict(rtol=1e-5, atol=1e-5)


def tiny(**kw) -> TalkerConfig:
    base = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                intermediate_size=128, llm_dim=64)
    return TalkerConfig(**{**base, **kw})


def build(cfg: TalkerConfig, seed: int = 0, fold: bool = True) -> TalkerModel:
    model = TalkerModel(cfg)
    model.init_random_weights(torch.Generator().manual_seed(seed))
    model.eval().requires_grad_(False)
    if fold:
        model.fold_weight_norm()
    return model


def test_condition_rows_end_with_text_eos_and_audio_bos():
    cfg = tiny()
    model = build(cfg)
    ids = torch.tensor([5, 17, 9])
    cond = model.condition(ids, torch.randn(3, cfg.llm_dim))
    assert cond.shape == (5, cfg.hidden_size)
    boundary = model.emb_text(torch.tensor([cfg.text_eos_token_id, cfg.audio_bos_token_id]))
    assert torch.equal(cond[3:], boundary)
    # Each text row is emb_text + a unit-norm projection.
    delta = cond[:3] - model.emb_text(ids)
    torch.testing.assert_close(delta.norm(dim=-1), torch.ones(3), **TOL)


def test_empty_condition_is_the_two_boundary_rows():
    cfg = tiny()
    model = build(cfg)
    cond = model.condition(torch.zeros(0, dtype=torch.long), torch.zeros(0, cfg.llm_dim))
    assert cond.shape == (2, cfg.hidden_size)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_cached_decode_matches_uncached_forward(kv_heads):
    cfg = tiny(num_kv_heads=kv_heads)
    model = build(cfg)
    model.setup_caches(max_batch=3, max_seq_len=64, device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    cond = torch.randn(7, cfg.hidden_size, generator=gen)
    codes = torch.randint(0, cfg.num_audio_tokens, (5,), generator=gen)
    full = model.forward_full(torch.cat([cond, model.emb_code[0](codes)])[None])[0]  # [12, D]
    slot = 1
    hiddens = [model.prefill(cond, slot)]
    for t, code in enumerate(codes):
        # Decode rows 0..slot: the other rows are free and must not disturb row `slot`.
        x = torch.zeros(slot + 1, cfg.hidden_size)
        x[slot] = model.emb_code[0](code)
        pos = torch.zeros(slot + 1, dtype=torch.long)
        pos[slot] = 7 + t
        hiddens.append(model.decode(x, pos, kv_len=64)[slot])
    torch.testing.assert_close(torch.stack(hiddens), full[6:], **TOL)


def test_decode_rows_at_different_positions_match_their_own_forward():
    cfg = tiny()
    model = build(cfg)
    model.setup_caches(max_batch=2, max_seq_len=32, device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    conds = [torch.randn(n, cfg.hidden_size, generator=gen) for n in (4, 9)]
    for slot, cond in enumerate(conds):
        model.prefill(cond, slot)
    x = torch.randn(2, cfg.hidden_size, generator=gen)
    out = model.decode(x, torch.tensor([4, 9]), kv_len=16)
    for slot, cond in enumerate(conds):
        ref = model.forward_full(torch.cat([cond, x[slot : slot + 1]])[None])[0, -1]
        torch.testing.assert_close(out[slot], ref, **TOL)


def test_head_code_uses_the_checkpoint_weight_norm_keys():
    keys = build(tiny(), fold=False).state_dict().keys()
    assert "head_code.0.parametrizations.weight.original0" in keys
    assert "head_code.0.parametrizations.weight.original1" in keys
    assert "projector_semantic.linear1.weight" in keys and "projector_semantic.linear2.bias" in keys
    assert "model.layers.1.self_attn.q_proj.weight" in keys and "emb_code.0.weight" in keys


def test_fold_weight_norm_keeps_logits_and_drops_the_parametrization():
    model = build(tiny(), fold=False)
    with torch.no_grad():  # make g differ from ||v|| so folding has work to do
        model.head_code[0].parametrizations.weight.original0.mul_(1.7)
    h = torch.randn(3, 64)
    before = model.code_logits(h)
    model.fold_weight_norm()
    assert "head_code.0.weight" in model.state_dict()
    torch.testing.assert_close(model.code_logits(h), before, **TOL)


def test_random_init_is_identical_for_the_same_seed_and_differs_otherwise():
    a, b, c = build(tiny(), 3), build(tiny(), 3), build(tiny(), 4)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.emb_text.weight, c.emb_text.weight)


def test_full_size_parameter_count_on_meta():
    cfg = TalkerConfig()
    with torch.device("meta"):
        model = TalkerModel(cfg)
    count = {name: sum(p.numel() for p in mod.parameters()) for name, mod in model.named_children()}
    d, f, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    assert count["model"] == n * (4 * d * d + 3 * d * f + 2 * d) + d  # 188,763,648 + norms
    assert 188e6 < count["model"] < 190e6
    assert count["emb_text"] == 152064 * 768  # 116.8 M
    assert count["emb_code"] == 6562 * 768
    assert count["head_code"] == 6562 * 768 + 6562  # v + g
    assert count["projector_semantic"] == 4096 * 768 + 768 + 768 * 768 + 768  # 3.74 M
    # 9 tensors per layer + final norm + emb_text + emb_code + head g/v + projector 2x(w, b);
    # the checkpoint adds 5 ignored `tts.` keys (embed_tokens, projector_spk.*).
    assert len(model.state_dict()) == 20 * 9 + 1 + 1 + 1 + 2 + 4 == 189


def test_kv_head_count_must_divide_heads():
    with pytest.raises(ValueError, match="num_kv_heads"):
        dataclasses.replace(tiny(), num_kv_heads=3)


def test_rope_scores_depend_only_on_relative_position():
    cfg = tiny()
    backbone = build(cfg).model
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 1, 1, 1, cfg.head_dim, generator=gen).unbind(0)  # [1, 1, 1, hd] each

    def score(pq: int, pk: int) -> torch.Tensor:
        cq, sq = backbone.rope(torch.tensor([[pq]]), torch.float32)
        ck, sk = backbone.rope(torch.tensor([[pk]]), torch.float32)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()

    torch.testing.assert_close(score(7, 3), score(104, 100), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(score(7, 3), score(7, 4), rtol=1e-4, atol=1e-4)


def test_rope_table_matches_on_the_fly_angles():
    cfg = tiny()
    model = build(cfg)
    positions = torch.tensor([[0, 5, 63]])
    fly = model.model.rope(positions, torch.float32)
    model.setup_caches(max_batch=1, max_seq_len=64, device="cpu", dtype=torch.float32)
    table = model.model.rope(positions, torch.float32)
    for a, b in zip(fly, table):
        torch.testing.assert_close(a, b, **TOL)
