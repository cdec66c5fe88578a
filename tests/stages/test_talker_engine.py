"""TalkerEngine on a tiny CPU config: continuous batching, determinism, length, lifecycle."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from stages.talker.config import SamplingConfig, TalkerConfig
from stages.talker.engine import TalkerEngine, TalkerRequest, TalkerRequestError
from stages.talker.length import codec_budget, count_units
from stages.talker.model import TalkerModel
from stages.talker.weights import save_official_layout

TEXT_A = "The quick brown fox jumps over the lazy dog near the river bank."
TEXT_B = "Continuous batching lets new requests join between decode steps."
TEXT_C = "A third voice."


def tiny(**sampling) -> TalkerConfig:
    return TalkerConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                        intermediate_size=128, llm_dim=64, sampling=SamplingConfig(**sampling))


def engine(cfg=None, **kw) -> TalkerEngine:
    kw = {"max_batch": 4, "max_seq_len": 256, **kw}
    return TalkerEngine(cfg or tiny(), device=torch.device("cpu"), dtype=torch.float32, **kw)


def drain(eng: TalkerEngine, joins: dict[int, list[TalkerRequest]] | None = None):
    """Run to completion; `joins[k]` are added after step k. -> ({id: codes}, {id: finishes})."""
    codes, finishes, k = {}, {}, 0
    while eng.has_work() or (joins and any(s >= k for s in joins)):
        for req in (joins or {}).get(k, []):
            eng.add(req)
        for out in eng.step():
            if out.finished:
                assert out.code is None
                finishes[out.request_id] = finishes.get(out.request_id, 0) + 1
            else:
                codes.setdefault(out.request_id, []).append(out.code)
        k += 1
    return codes, finishes


def test_request_decoded_alone_equals_decoded_with_joining_neighbours():
    a = TalkerRequest("a", TEXT_A, seed=7, max_codes=60)
    alone, _ = drain(engine(), {0: [a]})
    together, fin = drain(engine(), {
        0: [TalkerRequest("b", TEXT_B, seed=1, max_codes=30)],  # finishes while "a" runs
        3: [a],
        10: [TalkerRequest("c", TEXT_C, seed=2)],
    })
    assert torch.equal(torch.tensor(together["a"]), torch.tensor(alone["a"]))
    assert fin == {"a": 1, "b": 1, "c": 1}  # each finished request reported exactly once


def test_two_engines_give_identical_codes_and_seeds_matter():
    reqs = {0: [TalkerRequest("a", TEXT_A, max_codes=30),
                TalkerRequest("b", TEXT_B, seed=5, max_codes=20)]}
    first, _ = drain(engine(), reqs)
    second, _ = drain(engine(), reqs)
    assert first == second and len(first["a"]) == 30
    reseeded, _ = drain(engine(), {0: [TalkerRequest("a", TEXT_A, seed=43, max_codes=30)]})
    assert reseeded["a"] != first["a"]
    other_init, _ = drain(engine(init_seed=1), {0: [TalkerRequest("a", TEXT_A, max_codes=30)]})
    assert other_init["a"] != first["a"]


def test_length_budget_is_honoured_and_eos_never_emitted():
    cfg = tiny()
    codes, _ = drain(engine(cfg), {0: [TalkerRequest("a", TEXT_A), TalkerRequest("c", TEXT_C),
                                       TalkerRequest("m", TEXT_A, max_codes=7)]})
    assert count_units(TEXT_A) == (13, 0)
    assert len(codes["a"]) == codec_budget(TEXT_A, cfg) == 130
    assert len(codes["c"]) == cfg.sampling.min_tokens  # 3 words -> 30, floored at min_tokens
    assert len(codes["m"]) == 7
    assert all(0 <= c < cfg.eos_token_id for cs in codes.values() for c in cs)


def test_text_without_words_finishes_at_once():
    eng = engine()
    eng.add(TalkerRequest("e", "..."))
    assert [(o.code, o.finished) for o in eng.step()] == [(None, True)]
    assert not eng.has_work()


def test_slots_are_reused_and_queue_waits_for_a_free_slot():
    eng = engine(max_batch=1)
    eng.add(TalkerRequest("x", TEXT_C, max_codes=2))
    eng.add(TalkerRequest("y", TEXT_C, max_codes=2))
    order = [(o.request_id, o.finished) for _ in range(6) for o in eng.step()]
    assert order == [("x", False), ("x", False), ("x", True),
                     ("y", False), ("y", False), ("y", True)]


def test_cancel_and_errors():
    eng = engine(max_seq_len=64)
    eng.add(TalkerRequest("a", TEXT_A, max_codes=20))
    with pytest.raises(TalkerRequestError, match="duplicate request id"):
        eng.add(TalkerRequest("a", TEXT_B))
    with pytest.raises(TalkerRequestError, match="max_seq_len"):
        eng.add(TalkerRequest("long", TEXT_A))  # 15 condition rows + 130 codes > 64
    eng.step()
    eng.cancel("a")
    assert not eng.has_work() and eng.step() == []


def test_real_weights_mode_stops_on_the_model_eos_after_min_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = tiny()
    model = TalkerModel(cfg)
    model.init_random_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():  # make EOS the overwhelming favourite at every step
        model.head_code[0].parametrizations.weight.original0[cfg.eos_token_id] = 0.0
        model.head_code[0].parametrizations.weight.original1[cfg.eos_token_id] = 0.0
        model.model.norm.weight.fill_(0.0)
        model.model.norm.weight[0] = 1.0
        model.head_code[0].parametrizations.weight.original1[:, 0] = -1.0
        model.head_code[0].parametrizations.weight.original1[cfg.eos_token_id, 0] = 1.0
        model.head_code[0].parametrizations.weight.original0.fill_(100.0)
    save_official_layout(model, tmp_path / "pytorch_model.bin")
    tok = Tokenizer(models.WordLevel({"hi": 5, "[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    eng = engine(cfg, weights_dir=str(tmp_path))
    codes, fin = drain(eng, {0: [TalkerRequest("r", "hi hi hi")]})
    assert len(codes["r"]) == cfg.sampling.min_tokens and fin == {"r": 1}


def test_stage_extra_flags_are_parsed_strictly_at_construction():
    from stages.flags import FlagError
    from stages.talker.prelude import penalty_temperature_eager

    cfg = dataclasses.replace(tiny(), extra={"talker_codec_fused_prelude": "false",
                                             "talker_decode_graph": " TRUE ",
                                             "talker_prefill_graph": "1"})
    eng = engine(cfg)
    assert eng.prelude is penalty_temperature_eager
    assert eng.graphs is None and eng.prefill_graphs is None  # no graph API on CPU: eager
    assert eng.describe()["decode_graph"] is False and eng.describe()["prefill_graph"] is False
    with pytest.raises(FlagError, match="talker_decode_graph"):
        engine(dataclasses.replace(tiny(), extra={"talker_decode_graph": "yes"}))
    with pytest.raises(FlagError, match="talker_prefill_graph"):
        engine(dataclasses.replace(tiny(), extra={"talker_prefill_graph": "on"}))
    with pytest.raises(FlagError, match="talker_prefill_graph"):  # a typo names the real key
        engine(dataclasses.replace(tiny(), extra={"talker_prefil_graph": True}))


def test_engine_logits_match_an_uncached_forward_over_the_emitted_codes():
    from stages.talker.prelude import penalty_temperature_eager
    from stages.talker.thinker_standin import standin_hidden

    seen = []

    def recording(logits, *args, out=None):
        seen.append(logits[0].clone())  # row 0 == slot 0 == request "a"
        return penalty_temperature_eager(logits, *args, out=out)

    eng = engine(prelude=recording)
    codes, _ = drain(eng, {0: [TalkerRequest("a", TEXT_C, max_codes=12)],
                           3: [TalkerRequest("b", TEXT_B, max_codes=30)]})
    model, ids = eng.model, eng.tokenizer.encode(TEXT_C)
    hidden = standin_hidden(ids, llm_dim=model.cfg.llm_dim, seed=eng.init_seed)
    cond = model.condition(torch.tensor(ids), hidden)
    with torch.no_grad():
        rows = torch.cat([cond, model.emb_code[0](torch.tensor(codes["a"]))])
        full = model.forward_full(rows[None])
        ref = model.code_logits(full[0, cond.shape[0] - 1 :])  # sample t reads row L-1+t
    torch.testing.assert_close(torch.stack(seen[:13]), ref, rtol=1e-4, atol=1e-4)


def test_decode_graph_buffers_and_row_buckets_reproduce_eager_codes():
    """CPU stand-in for a device graph: `replay` re-runs the captured forward into the same
    output buffer, so the static-input copies, row buckets and free-row handling are checked
    here; the real CUDA capture is checked in test_talker_gpu.py."""
    from types import SimpleNamespace

    from stages.talker.decode_graph import DecodeGraphs

    class ReplayGraphs(DecodeGraphs):
        def _capture(self, rows, kv_len):
            out = self._forward(rows, kv_len)
            graph = SimpleNamespace(replay=lambda: out.copy_(self._forward(rows, kv_len)))
            self.captured.append((rows, kv_len))
            return graph, out

    joins = {0: [TalkerRequest("a", TEXT_A, max_codes=70)],
             2: [TalkerRequest("b", TEXT_B, seed=3, max_codes=20)],
             4: [TalkerRequest("c", TEXT_C, seed=4, max_codes=30)]}
    eager, _ = drain(engine(max_batch=8), joins)
    eng = engine(max_batch=8)
    eng.graphs = ReplayGraphs(eng.model, SimpleNamespace(pool=lambda: None), max_batch=8,
                              device=torch.device("cpu"))
    eng.graphs.captured = []
    graphed, _ = drain(eng, joins)
    assert graphed == eager
    assert {rows for rows, _ in eng.graphs.captured} == {1, 2, 4}  # 3 rows ran in the 4-bucket


def test_prefill_length_rounds_up_to_the_bucket_and_never_past_the_cache():
    from stages.talker.engine import PREFILL_LEN_BUCKET, prefill_length

    assert [prefill_length(n, 256) for n in (1, 31, 32, 33)] == [32, 32, 32, 64]
    assert prefill_length(250, 256) == 256 and prefill_length(200, 220) == 220
    assert all(prefill_length(n, 1024) % PREFILL_LEN_BUCKET == 0 for n in range(1, 1000))


def test_prefill_graph_buffers_and_length_buckets_reproduce_eager_codes_and_cache():
    """CPU stand-in for a device graph (as for the decode graphs below): `replay` re-runs the
    captured forward on the static buffers into the same output tensor, so the padding, the
    slot tensor, the static-input copies and the read of the last real row are checked here;
    the real CUDA capture, bit for bit, in test_talker_gpu.py."""
    from types import SimpleNamespace

    from stages.talker.engine import prefill_length
    from stages.talker.prefill_graph import PrefillGraphs

    class ReplayGraphs(PrefillGraphs):
        def _capture(self, length):
            out = self._forward(length)
            graph = SimpleNamespace(replay=lambda: out.copy_(self._forward(length)))
            self.captured.append(length)
            return graph, out

    long_text = " ".join([TEXT_A] * 3)  # more condition rows than one bucket
    joins = {0: [TalkerRequest("a", TEXT_A, max_codes=40),
                 TalkerRequest("b", long_text, seed=3, max_codes=20)],
             2: [TalkerRequest("c", TEXT_C, seed=4, max_codes=30)],
             25: [TalkerRequest("d", TEXT_B, seed=5, max_codes=10)]}  # reuses a freed slot
    ref = engine(max_batch=3)
    eager, _ = drain(ref, joins)
    eng = engine(max_batch=3)
    eng.prefill_graphs = ReplayGraphs(eng.model, SimpleNamespace(pool=lambda: None), max_seq_len=256,
                                      device=torch.device("cpu"), dtype=torch.float32)
    eng.prefill_graphs.captured = []
    graphed, _ = drain(eng, joins)
    assert graphed == eager and set(graphed) == {"a", "b", "c", "d"}
    rows = [len(eng.tokenizer.encode(t)) + 2 for t in (TEXT_A, long_text, TEXT_C, TEXT_B)]
    assert sorted(set(eng.prefill_graphs.captured)) == sorted({prefill_length(n, 256) for n in rows})
    assert len(set(eng.prefill_graphs.captured)) >= 2  # the long text took a second bucket
    for layer, ref_layer in zip(eng.model.model.layers, ref.model.model.layers):
        assert torch.equal(layer.self_attn.kv_cache.k, ref_layer.self_attn.kv_cache.k)


def test_padding_a_prefill_leaves_its_own_rows_and_the_next_decode_as_unpadded():
    """The padded rows follow the request's rows: under causal attention its rows and its first
    decode match an unpadded prefill's (to fp32 noise: the shapes differ)."""
    from stages.talker.thinker_standin import standin_hidden

    eng = engine()
    model, ids = eng.model, eng.tokenizer.encode(TEXT_A)
    cond = model.condition(torch.tensor(ids), standin_hidden(ids, llm_dim=64, seed=0))
    n = cond.shape[0]
    padded = torch.cat([cond, torch.randn(40, cond.shape[1])])  # junk padding, even
    with torch.no_grad():
        plain = model.prefill_rows(cond, torch.tensor([1]))
        step_plain = model.decode(model.emb_code[0](torch.tensor([0, 7])), torch.tensor([0, n]), 128)[1]
        rows = model.prefill_rows(padded, torch.tensor([1]))[:n]
        step_padded = model.decode(model.emb_code[0](torch.tensor([0, 7])), torch.tensor([0, n]), 128)[1]
    torch.testing.assert_close(rows, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step_padded, step_plain, rtol=1e-5, atol=1e-5)


def test_step_counts_admission_and_device_wait_seconds():
    eng = engine()
    assert eng.work() == {"admit_s": 0.0, "device_wait_s": 0.0}
    drain(eng, {0: [TalkerRequest("a", TEXT_A, max_codes=5)]})
    counters = eng.work()
    assert counters["admit_s"] > 0 and counters["device_wait_s"] > 0
    assert "device_span_s" not in counters  # a CPU cannot time its own work apart from the host's
