"""The talker on a CUDA device: cache paths, batching determinism, full-size bf16 smoke."""

from __future__ import annotations

import time

import pytest
import torch

from stages.talker.config import TalkerConfig
from stages.talker.engine import TalkerEngine, TalkerRequest
from stages.talker.kernels import TalkerKernels, decode_layers
from stages.talker.model import TalkerModel

pytestmark = pytest.mark.gpu

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
            llm_dim=64)


def codes_of(eng: TalkerEngine, joins: dict[int, list[TalkerRequest]]) -> dict[str, list[int]]:
    codes, k = {}, 0
    while eng.has_work() or any(s >= k for s in joins):
        for req in joins.get(k, []):
            eng.add(req)
        for out in eng.step():
            if out.code is not None:
                codes.setdefault(out.request_id, []).append(out.code)
        k += 1
    return codes


def test_cuda_cached_decode_matches_uncached_forward():
    device = torch.device("cuda")
    cfg = TalkerConfig(**TINY)
    model = TalkerModel(cfg)
    model.init_random_weights(torch.Generator().manual_seed(0))
    model = model.to(device).eval().requires_grad_(False)
    model.fold_weight_norm()
    model.setup_caches(max_batch=2, max_seq_len=64, device=device, dtype=torch.float32)
    cond = torch.randn(6, cfg.hidden_size, device=device)
    codes = torch.arange(4, device=device) * 100
    with torch.no_grad():
        full = model.forward_full(torch.cat([cond, model.emb_code[0](codes)])[None])[0]
        out = [model.prefill(cond, 1)]
        for t, code in enumerate(codes):
            x = model.emb_code[0](code.repeat(2))
            out.append(model.decode(x, torch.tensor([0, 6 + t], device=device), 64)[1])
    # TF32 may be on for matmuls: a loose tolerance, the CPU test pins 1e-5.
    torch.testing.assert_close(torch.stack(out), full[5:], rtol=2e-3, atol=2e-3)


def test_cuda_request_alone_equals_request_with_joining_neighbours():
    def engine():
        return TalkerEngine(TalkerConfig(**TINY), device=torch.device("cuda"),
                            dtype=torch.float32, max_batch=4, max_seq_len=256)

    text = "The quick brown fox jumps over the lazy dog."
    alone = codes_of(engine(), {0: [TalkerRequest("a", text, seed=3)]})
    together = codes_of(engine(), {0: [TalkerRequest("b", "Another one here.", seed=1)],
                                   2: [TalkerRequest("a", text, seed=3)]})
    assert torch.equal(torch.tensor(alone["a"]), torch.tensor(together["a"]))


def test_full_size_bf16_engine_emits_valid_codes():
    cfg = TalkerConfig()
    eng = TalkerEngine(cfg, device=torch.device("cuda"), dtype=torch.bfloat16, max_batch=8,
                       max_seq_len=512)
    for i in range(8):
        eng.add(TalkerRequest(f"r{i}", "Hello from the full size talker.", seed=i, max_codes=60))
    codes = codes_of(eng, {})
    assert sorted(codes) == [f"r{i}" for i in range(8)]
    assert all(len(c) == 60 and max(c) < cfg.eos_token_id for c in codes.values())


def test_cuda_batched_draw_equals_torch_multinomial_row_by_row():
    from stages.talker.sampling import draw_rows

    device = torch.device("cuda")
    probs = torch.softmax(torch.randn(4, 6562, device=device) * 3, dim=-1)

    def gens():
        return [torch.Generator(device=device).manual_seed(s) for s in (42, 1, 42, 9)]

    ours = draw_rows(probs, gens())
    ref = torch.stack([torch.multinomial(probs[r : r + 1], 1, generator=g)[0, 0]
                       for r, g in enumerate(gens())])
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("full_size", [False, True])
@pytest.mark.parametrize("decode,prefill", [(True, False), (False, True), (True, True)])
def test_cuda_graphs_give_the_same_codes_as_eager(full_size, decode, prefill):
    import dataclasses

    base = TalkerConfig() if full_size else TalkerConfig(**TINY)
    dtype = torch.bfloat16 if full_size else torch.float32
    long_text = " ".join(["A longer request takes a second prefill length bucket."] * 4)

    def run(decode: bool, prefill: bool) -> dict[str, list[int]]:
        cfg = dataclasses.replace(base, extra={"talker_decode_graph": decode,
                                               "talker_prefill_graph": prefill})
        eng = TalkerEngine(cfg, device=torch.device("cuda"), dtype=dtype, max_batch=8,
                           max_seq_len=256)
        assert (eng.graphs is not None, eng.prefill_graphs is not None) == (decode, prefill)
        joins = {0: [TalkerRequest("a", "The first request speaks here.", max_codes=70)],
                 5: [TalkerRequest(f"j{i}", "Joining later.", seed=i, max_codes=40)
                     for i in range(3)] + [TalkerRequest("long", long_text, seed=9, max_codes=30)]}
        codes = codes_of(eng, joins)
        if prefill:
            assert len(eng.prefill_graphs.graphs) == 2  # both lengths replayed a captured graph
        return codes

    assert run(decode, prefill) == run(False, False)


@pytest.mark.parametrize("full_size", [False, True])
def test_cuda_prefill_graph_replay_equals_eager_bit_for_bit(full_size):
    """A replayed prefill returns the eager prefill's hidden rows and writes the same cache rows
    (torch.equal), for a slot other than the one it was captured for."""
    from stages.platform.graphs import graph_api
    from stages.talker.prefill_graph import PrefillGraphs

    cfg = TalkerConfig() if full_size else TalkerConfig(**TINY)
    dtype = torch.bfloat16 if full_size else torch.float32
    dev = torch.device("cuda")
    model = TalkerModel(cfg)
    model.init_random_weights(torch.Generator().manual_seed(0))
    model = model.to(dev, dtype).eval()
    model.fold_weight_norm()
    model.setup_caches(max_batch=4, max_seq_len=128, device=dev, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    x1, x2 = (torch.randn(64, cfg.hidden_size, generator=gen).to(dev, dtype) for _ in range(2))
    slots = torch.arange(4, device=dev)
    graphs = PrefillGraphs(model, graph_api(dev), max_seq_len=128, device=dev, dtype=dtype)
    with torch.inference_mode():
        graphs.run(x1, slots[0:1])  # captured with slot 0 and x1
        replayed = graphs.run(x2, slots[2:3]).clone()
        caches = [layer.self_attn.kv_cache for layer in model.model.layers]
        cache = [(c.k[2].clone(), c.v[2].clone()) for c in caches]
        eager = model.prefill_rows(x2, slots[3:4])
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)
    for (k, v), layer in zip(cache, model.model.layers):
        assert torch.equal(k, layer.self_attn.kv_cache.k[3]) and torch.equal(v, layer.self_attn.kv_cache.v[3])


def test_cuda_step_span_is_the_devices_time_inside_the_steps():
    """The device span is timed on the talker's stream: positive, and never longer than the
    host's time inside the steps (a step starts and ends with the host)."""
    eng = TalkerEngine(TalkerConfig(**TINY), device=torch.device("cuda"), dtype=torch.float32,
                       max_batch=4, max_seq_len=128)
    assert eng.work()["device_span_s"] == 0.0
    t0 = time.perf_counter()
    codes_of(eng, {0: [TalkerRequest("a", "Hello there.", max_codes=12)],
                   3: [TalkerRequest("b", "And a second one.", max_codes=6)]})
    inside = time.perf_counter() - t0
    span = eng.work()["device_span_s"]
    assert 0.0 < span < inside



def test_cuda_admission_queues_its_copies_instead_of_waiting_for_the_talkers_work():
    """Admitting a request only queues work: with a long kernel ahead on the talker's stream the
    admission returns long before that kernel ends (a blocking host copy would wait for it), and
    the codes are those of an admission that waited."""
    def engine() -> TalkerEngine:
        return TalkerEngine(TalkerConfig(**TINY), device=torch.device("cuda"), dtype=torch.float32,
                            max_batch=4, max_seq_len=128)

    request = TalkerRequest("b", "And now the measured one.", seed=9, max_codes=6)
    waited = codes_of(engine(), {0: [request]})
    eng = engine()
    # The same text first: cuBLAS and the pinned host blocks of the sizes the admission needs.
    codes_of(eng, {0: [TalkerRequest("warm", request.text, seed=1, max_codes=3)]})
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(200_000_000)
    torch.cuda.synchronize()
    sleep_s = time.perf_counter() - t0
    torch.cuda._sleep(200_000_000)
    eng.add(request)
    before = eng.work()["admit_s"]
    outputs = eng.step()
    admit_s = eng.work()["admit_s"] - before
    assert sleep_s > 0.02 and admit_s < sleep_s / 2, (admit_s, sleep_s)
    codes = [o.code for o in outputs if o.code is not None] + codes_of(eng, {}).get("b", [])
    assert codes == waited["b"]


def test_cuda_a_step_waits_for_the_device_once():
    """A step's one host read is its sampled ids: admission (fills, copies) and the decode
    and sampling queue without waiting. `torch.cuda` sync debug mode reports each waiting call;
    a `t[i] = scalar` on a device tensor is one (a host copy from pageable memory)."""
    import warnings

    eng = TalkerEngine(TalkerConfig(**TINY), device=torch.device("cuda"), dtype=torch.float32,
                       max_batch=4, max_seq_len=128)
    codes_of(eng, {0: [TalkerRequest("warm", "Warm up the kernels.", seed=1, max_codes=3)]})
    eng.add(TalkerRequest("a", "Hello there.", seed=2, max_codes=5))
    eng.add(TalkerRequest("b", "And a second one.", seed=3, max_codes=5))
    torch.cuda.synchronize()
    waits = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for _ in range(4):  # the first step admits both, the others decode
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                eng.step()
            waits.append(sum("synchronizing" in str(w.message) for w in seen))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert waits == [1, 1, 1, 1], waits


# -- fused decode layers (stages.talker.layer_triton) -----------------------------------------


def _fused_pair(cfg: TalkerConfig, dtype, *, max_batch=8, max_seq_len=128):
    """Two copies of one model with equal (random) caches: the first decodes through the
    modules, the second through the fused layers."""
    dev = torch.device("cuda")
    models = []
    for fused in (False, True):
        model = TalkerModel(cfg)
        model.init_random_weights(torch.Generator().manual_seed(0))
        model = model.to(dev, dtype).eval().requires_grad_(False)
        model.fold_weight_norm()
        model.setup_caches(max_batch=max_batch, max_seq_len=max_seq_len, device=dev, dtype=dtype)
        layers = decode_layers(fused, model, dev)
        model.use_kernels(TalkerKernels(layers=layers))
        said = layers.reason
        assert said.startswith("fused" if fused else "unfused"), said
        gen = torch.Generator().manual_seed(7)
        for layer in model.model.layers:
            cache = layer.self_attn.kv_cache
            cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
            cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
        models.append(model)
    return models


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_rope_to_cache_is_the_modules_rope_and_write_bit_for_bit(dtype):
    """Compiled (round-to-nearest casts, no fma contraction): the kernel's q and cache rows are
    torch.equal to the modules' RoPE and KVCache.write on the same device."""
    from stages.talker.layer_triton import rope_to_cache
    from stages.talker.model import KVCache, apply_rope

    dev = torch.device("cuda")
    rows, heads, kv_heads, hd, seq = 64, 12, 12, 64, 256
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * hd, generator=gen).to(dev, dtype)
    positions = torch.randint(0, seq, (rows,), generator=gen).to(dev)
    angles = torch.randn(seq, hd, generator=gen).to(dev)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    ours, theirs = (KVCache((rows, kv_heads, seq, hd), device=dev, dtype=dtype) for _ in range(2))
    q = rope_to_cache(qkv, positions, cos, sin, ours.k, ours.v, heads)
    q_ref, k_ref, v_ref = (t.view(rows, 1, n, hd).transpose(1, 2) for t, n in
                           zip(qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], 1), (heads, kv_heads, kv_heads)))
    c, s = cos[positions][:, None, None], sin[positions][:, None, None]
    theirs.write(theirs.decode_rows(positions), apply_rope(k_ref, c, s), v_ref)
    assert torch.equal(q, apply_rope(q_ref, c, s))
    assert torch.equal(ours.k, theirs.k) and torch.equal(ours.v, theirs.v)


@pytest.mark.parametrize("full_size", [False, True])
def test_cuda_fused_decode_matches_the_modules_and_replays_bit_for_bit(full_size):
    """The fused decode agrees with the modules' to fp32 rounding, and its device graph's replay
    equals its eager call (logits and every cache row, torch.equal)."""
    from stages.platform.graphs import graph_api
    from stages.talker.decode_graph import DecodeGraphs

    cfg = TalkerConfig() if full_size else TalkerConfig(**TINY)
    dev = torch.device("cuda")
    plain, fused = _fused_pair(cfg, torch.float32)
    # 8 rows: a whole rows bucket, so the replay writes no free slot the eager call does not.
    ids = torch.arange(8, device=dev) * 11
    positions = torch.tensor([3, 0, 90, 17, 64, 5, 127, 1], device=dev)
    with torch.inference_mode():
        want = plain.code_logits(plain.decode(plain.emb_code[0](ids), positions, 128))
        got = fused.code_logits(fused.decode(fused.emb_code[0](ids), positions, 128))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for a, b in zip(plain.model.layers, fused.model.layers, strict=True):
            torch.testing.assert_close(b.self_attn.kv_cache.k, a.self_attn.kv_cache.k, rtol=1e-4, atol=1e-4)
        # The same step replayed from a graph on a copy of the fused model's pre-step caches.
        _, again = _fused_pair(cfg, torch.float32)
        graphs = DecodeGraphs(again, graph_api(dev), max_batch=8, device=dev)
        replayed = graphs.run(ids, positions, 128)
        assert torch.equal(replayed, got)
        for a, b in zip(fused.model.layers, again.model.layers, strict=True):
            assert torch.equal(a.self_attn.kv_cache.k, b.self_attn.kv_cache.k)
            assert torch.equal(a.self_attn.kv_cache.v, b.self_attn.kv_cache.v)


def test_cuda_fused_layers_cut_a_steps_kernels_by_more_than_half():
    """Full size, 32 rows, eager steps (no decode graph, so each kernel is counted): the fused
    layers' step launches fewer than half the kernels of the modules' step."""
    import dataclasses

    from stages.profiling.launches import count_launches

    def kernels(fused: bool) -> float:
        cfg = dataclasses.replace(TalkerConfig(), extra={"talker_fused_layers": fused, "talker_decode_graph": False,
                                                         "talker_prefill_graph": False})
        eng = TalkerEngine(cfg, device=torch.device("cuda"), dtype=torch.float32, max_batch=32, max_seq_len=256)
        for i in range(32):
            eng.add(TalkerRequest(f"r{i}", "Counting the kernels of one step.", seed=i, max_codes=40))
        eng.step()  # admission
        count = count_launches(eng.step, device=torch.device("cuda"), repeats=2)
        return count.per_call + count.copies_per_call

    plain, fused = kernels(False), kernels(True)
    print(f"kernels a step at B = 32: modules {plain:.0f}, fused {fused:.0f}")
    assert fused < plain / 2
