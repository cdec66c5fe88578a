"""Official `tts.*` checkpoint layout: round trip, strict errors, ignored keys, tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from stages.talker.config import TalkerConfig
from stages.talker.model import TalkerModel
from stages.talker.tokenizer import HFTokenizer, TokenizerError, WordHashTokenizer, load_tokenizer
from stages.talker.weights import (
    TalkerWeightsError,
    load_talker_weights,
    read_tts_state_dict,
    save_official_layout,
)


def tiny() -> TalkerConfig:
    return TalkerConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                        intermediate_size=128, llm_dim=64)


def random_model(seed: int) -> TalkerModel:
    model = TalkerModel(tiny())
    model.init_random_weights(torch.Generator().manual_seed(seed))
    with torch.no_grad():  # g != ||v|| so the weight-norm pair really round-trips
        model.head_code[0].parametrizations.weight.original0.mul_(1.3)
    return model.eval().requires_grad_(False)


def outputs(model: TalkerModel) -> torch.Tensor:
    gen = torch.Generator().manual_seed(9)
    ids = torch.tensor([3, 1000, 151000])
    cond = model.condition(ids, torch.randn(3, model.cfg.llm_dim, generator=gen))
    return model.code_logits(model.forward_full(cond[None])[0])


def load_fresh(path) -> TalkerModel:
    with torch.device("meta"):
        fresh = TalkerModel(tiny())
    load_talker_weights(fresh, path)
    return fresh.eval()


def test_bin_checkpoint_round_trip_gives_identical_outputs(tmp_path):
    src = random_model(1)
    save_official_layout(src, tmp_path / "pytorch_model.bin")
    assert all(k.startswith("tts.") for k in torch.load(tmp_path / "pytorch_model.bin"))
    assert torch.equal(outputs(load_fresh(tmp_path)), outputs(src))


def test_sharded_safetensors_with_index_and_ignored_keys_round_trip(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    src = random_model(2)
    state = {"tts." + k: v.contiguous() for k, v in src.state_dict().items()}
    # Keys the checkpoint has but the talker does not use, plus a thinker key in another shard.
    state["tts.model.embed_tokens.weight"] = torch.zeros(32000, 64)
    state["tts.projector_spk.linear1.weight"] = torch.zeros(64, 64)
    keys = sorted(state)
    shards = {"model-00001-of-00003.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00003.safetensors": keys[len(keys) // 2 :]}
    weight_map = {k: name for name, ks in shards.items() for k in ks}
    for name, ks in shards.items():
        save_file({k: state[k] for k in ks}, str(tmp_path / name))
    save_file({"llm.lm_head.weight": torch.zeros(2, 2)},
              str(tmp_path / "model-00003-of-00003.safetensors"))
    weight_map["llm.lm_head.weight"] = "model-00003-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert torch.equal(outputs(load_fresh(tmp_path)), outputs(src))


def test_missing_keys_are_listed_in_a_typed_error(tmp_path):
    state = {"tts." + k: v for k, v in random_model(1).state_dict().items()}
    del state["tts.model.layers.1.mlp.up_proj.weight"]
    del state["tts.head_code.0.parametrizations.weight.original0"]
    state["tts.model.layers.9.bogus"] = torch.zeros(1)
    torch.save(state, tmp_path / "model.pt")
    with pytest.raises(TalkerWeightsError) as err:
        load_fresh(tmp_path)
    msg = str(err.value)
    assert msg.startswith("error: ") and "missing 2" in msg and "unexpected 1" in msg
    assert "model.layers.1.mlp.up_proj.weight" in msg and "model.layers.9.bogus" in msg
    assert "head_code.0.parametrizations.weight.original0" in msg


def test_wrong_shapes_and_config_mismatch_raise(tmp_path):
    big = TalkerModel(TalkerConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                                   intermediate_size=256, llm_dim=64))
    save_official_layout(big, tmp_path / "pytorch_model.bin")
    with pytest.raises(TalkerWeightsError, match=r"shape 6: .*mlp.gate_proj.weight"):
        load_fresh(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"tts_config": {"intermediate_size": 256}}))
    with pytest.raises(TalkerWeightsError, match="intermediate_size=128 vs intermediate_size=256"):
        load_fresh(tmp_path)


def test_empty_dir_raises_with_a_fix(tmp_path):
    with pytest.raises(TalkerWeightsError, match="no checkpoint files"):
        read_tts_state_dict(tmp_path)


def test_standin_tokenizer_ids_are_stable_and_in_range():
    tok = WordHashTokenizer(151643)
    ids = tok.encode("Hello, World hello")
    assert ids == [104328, 25423, 57420, 104328]  # pinned: a change here changes every benchmark
    assert all(0 <= i < 151643 for i in ids)


def test_checkpoint_tokenizer_json_is_used_when_given(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 7, "world": 9, "[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(str(tmp_path), 151643)
    assert isinstance(loaded, HFTokenizer) and loaded.encode("hello world") == [7, 9]
    with pytest.raises(TokenizerError, match="tokenizer.json not found"):
        load_tokenizer(str(tmp_path / "nope"), 151643)
