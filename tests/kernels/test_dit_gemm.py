"""The DiT's Triton GEMM with 3xTF32 products (`stages.code2wav.dit_gemm`) and its selection.

CPU cases run the kernel under the Triton interpreter against an fp64 GEMM; the `gpu` cases run
it compiled: its error against fp64 must stay at fp32's level (3xTF32), below one-pass TF32's by
two orders, and a DiT with it must match cuBLAS fp32 and replay a captured graph bit for bit.

Run: python -m pytest tests/kernels/test_dit_gemm.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from stages.code2wav import kernels
from stages.code2wav.dit import torch_linear
from stages.code2wav.kernels import gemm_kernel, norm_kernel, resolve
from stages.code2wav.options import Code2WavOptions
from stages.flags import FlagError
from tests.stages.code2wav_tiny import check_a_dit_path_on_cuda, random_dit, use

CPU, CUDA, F32 = torch.device("cpu"), torch.device("cuda"), torch.float32

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _case(rows: int, n: int, k: int, *, bias=True, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k**0.5
    b = torch.randn(n, generator=gen) if bias else None
    return x.to(device), w.to(device), None if b is None else b.to(device)


def _fp64(x, w, b, gelu):
    y = F.linear(x.double(), w.double(), None if b is None else b.double())
    return F.gelu(y, approximate="tanh") if gelu else y


def _tf32(on: bool):
    from stages.platform import tf32_scope

    return tf32_scope(torch.device("cuda"), on)


def _rel_err(y, ref) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize(
    "rows, n, k, bias, gelu",
    [(7, 48, 40, True, False), (33, 80, 64, False, False), (20, 96, 32, True, True), (1, 16, 72, True, True)],
    ids=["masked-rows-and-k", "no-bias", "gelu", "one-row"],
)
def test_linear_matches_an_fp64_gemm_on_the_interpreter(interpret, rows, n, k, bias, gelu):
    from stages.code2wav import dit_gemm

    x, w, b = _case(rows, n, k, bias=bias)
    y = dit_gemm.linear(x, w, b, gelu=gelu)
    assert y.shape == (rows, n) and y.dtype == torch.float32 and y.is_contiguous()
    assert _rel_err(y, _fp64(x, w, b, gelu)) < 1e-5
    # The torch twin it replaces agrees too (same function: GELU-tanh, not torch's CPU
    # `_addmm_activation`, whose GELU is the erf one).
    torch.testing.assert_close(y, torch_linear(x, w, b, gelu=gelu), rtol=1e-5, atol=1e-5)
    if gelu:
        assert not torch.allclose(y, F.gelu(F.linear(x, w, b)), rtol=1e-5, atol=1e-5)


def test_linear_reads_views_it_cannot_take_as_they_are(interpret):
    """A transposed view (the DiT's in_proj input) and a view at an odd offset are copied first:
    the compiled kernel assumes contiguous, 16-byte aligned rows."""
    from stages.code2wav import dit_gemm

    _, w, b = _case(1, 24, 20)
    base = torch.randn(3, 20, 9)
    transposed = base.transpose(1, 2)  # [3, 9, 20], not contiguous
    y = dit_gemm.linear(transposed, w, b)
    assert y.shape == (3, 9, 24)
    torch.testing.assert_close(y, F.linear(transposed, w, b), rtol=1e-5, atol=1e-5)
    flat = torch.randn(1 + 5 * 20)
    odd = flat[1:].view(5, 20)  # 4 bytes past an aligned start
    assert odd.data_ptr() % 16 != 0
    torch.testing.assert_close(dit_gemm.linear(odd, w, b), F.linear(odd, w, b), rtol=1e-5, atol=1e-5)


def test_linear_with_no_rows_returns_an_empty_result(interpret):
    from stages.code2wav import dit_gemm

    _, w, b = _case(1, 8, 16)
    assert dit_gemm.linear(torch.empty(0, 16), w, b).shape == (0, 8)


@pytest.mark.parametrize(
    "case, message",
    [("bf16", "fp32 only"), ("wrong-k", "last dim"), ("wide-bias", "bias"), ("strided-weight", "contiguous")],
)
def test_linear_refuses_what_it_cannot_compute(interpret, case, message):
    from stages.code2wav import dit_gemm

    x, w, b = _case(4, 8, 16)
    if case == "bf16":
        x = x.bfloat16()
    elif case == "wrong-k":
        x = torch.randn(4, 12)
    elif case == "wide-bias":
        b = torch.randn(9)
    elif case == "strided-weight":
        w = torch.randn(16, 8).t()
    with pytest.raises(ValueError, match=message):
        dit_gemm.linear(x, w, b)


def test_the_tile_table_covers_every_row_count_with_one_tile_per_bucket():
    pytest.importorskip("triton")
    from stages.code2wav import dit_gemm

    tiles = [dit_gemm.tile_for(r) for r in range(1, 8000, 7)]
    # Monotone in the row count (never a smaller tile for more rows), and every tile of the
    # table (what warm_up compiles, so nothing compiles inside a graph capture) is handed out.
    sizes = [t.block_m * t.block_n for t in tiles]
    assert sizes == sorted(sizes)
    assert set(tiles) == {tile for _, tile in dit_gemm.TILES}


@pytest.mark.parametrize("split_k, bias, gelu", [(2, True, False), (4, False, False), (2, True, True)],
                         ids=["two-parts", "four-parts-no-bias", "two-parts-gelu"])
def test_a_split_k_sum_matches_an_fp64_gemm_on_the_interpreter(interpret, split_k, bias, gelu):
    """The k-sum in parts (added by a second launch, then bias and GELU): the unsplit GEMM's
    function to fp32 rounding, and the same bytes on every run."""
    from stages.code2wav import dit_gemm

    x, w, b = _case(9, 40, 256, bias=bias)
    tile = dit_gemm.Tile(16, 32, 32, 4, 2)  # 8 K-blocks: 2 or 4 parts
    y = dit_gemm.linear(x, w, b, gelu=gelu, tile=tile, split_k=split_k)
    assert _rel_err(y, _fp64(x, w, b, gelu)) < 1e-5
    torch.testing.assert_close(y, dit_gemm.linear(x, w, b, gelu=gelu, tile=tile, split_k=1), rtol=1e-5, atol=1e-5)
    assert torch.equal(y, dit_gemm.linear(x, w, b, gelu=gelu, tile=tile, split_k=split_k))
    with pytest.raises(ValueError, match="whole 32-deep blocks"):
        dit_gemm.linear(x, w, b, tile=tile, split_k=3)


def test_only_gemms_that_leave_the_device_idle_split_their_k_sum():
    pytest.importorskip("triton")
    from stages.code2wav import dit_gemm

    def split(rows, n, k):
        return dit_gemm.split_for(rows, n, k, dit_gemm.tile_for(rows))

    assert split(100, 512, 2048) == 4  # fc2, one request: 56 programs of 32 K-blocks -> 224 of 8
    assert split(400, 512, 2048) == 2  # fc2, four requests: 112 programs of 64 -> 224 of 32
    assert split(6400, 512, 2048) == 1  # many rows fill the device
    assert split(100, 1536, 512) == 1  # q|k|v: 168 programs already
    assert split(100, 512, 512) == 1  # proj: 8 K-blocks, too few to halve
    assert split(100, 512, 320) == 1  # in_proj: K is not whole blocks of a part


def test_warm_up_compiles_every_tile_and_split_a_dit_chunk_can_pick(monkeypatch):
    """Nothing may compile inside a graph capture: every (tile, split) that `linear` chooses for
    the full-size DiT's shapes at any row count is one `warm_up` compiled first."""
    pytest.importorskip("triton")
    from stages.code2wav import dit_gemm
    from stages.code2wav.config import DiTConfig

    compiled = set()

    def record(x, weight, bias, *, gelu=False, tile=None, split_k=None):
        compiled.add((weight.shape[0], weight.shape[1], bias is not None, gelu, tile, split_k))

    monkeypatch.setattr(dit_gemm, "linear", record)
    shapes = kernels.linear_shapes(DiTConfig())
    dit_gemm.warm_up(torch.device("cpu"), shapes)
    for n, k, has_bias, gelu in shapes:
        for rows in list(range(1, 4000)) + list(range(4000, 40000, 97)):
            tile = dit_gemm.tile_for(rows)
            assert (n, k, has_bias, gelu, tile, dit_gemm.split_for(rows, n, k, tile)) in compiled, (n, k, rows)
    assert any(key[-1] > 1 for key in compiled)


def test_dit_with_the_gemm_matches_torch_on_the_interpreter(interpret):
    dit = random_dit(seed=3)
    x_in, t = torch.randn(2, 320, 6), torch.rand(2)
    with torch.no_grad():
        want = dit.forward_chunk(x_in, t, None, None)
        assert use(dit, gemm=gemm_kernel(True, dit.cfg, CPU, F32, tf32_flow=False)).gemm.reason.startswith("Triton")
        assert dit.gemm_kernel == "tf32x3"
        assert dit.blocks[-1].mlp.gemm is dit.blocks[0].attn.gemm is dit.final_layer.gemm is dit.gemm
        got = dit.forward_chunk(x_in, t, None, None)
        for fused in (False, True):  # both attention prologues take their q|k|v through it
            use(dit, norm=norm_kernel(fused, dit.cfg, CPU, F32))
            torch.testing.assert_close(dit.forward_chunk(x_in, t, None, None).velocity, want.velocity,
                                       rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.velocity, want.velocity, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.att_cache, want.att_cache, rtol=1e-4, atol=1e-4)


def test_select_gemm_says_why_torch_stays(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    dit = random_dit()

    def said(tf32x3, device=CPU, *, tf32_flow=False, dtype=F32):
        return gemm_kernel(tf32x3, dit.cfg, device, dtype, tf32_flow=tf32_flow).reason

    assert "code2wav_dit_tf32x3 is false" in said(False)
    assert "TRITON_INTERPRET" in said(True)
    assert "not CUDA (meta)" in said(True, torch.device("meta"))
    assert "token2wav_allow_tf32" in said(True, tf32_flow=True)
    assert "bfloat16" in said(True, dtype=torch.bfloat16)
    use(dit, gemm=gemm_kernel(True, dit.cfg, CPU, F32, tf32_flow=False))
    assert dit.gemm_kernel == "torch" and dit.blocks[0].mlp.gemm is torch_linear


def test_tf32_in_the_flow_stands_the_3xtf32_gemms_down_in_resolve_only(interpret):
    """The cross-flag rule: `token2wav_allow_tf32` flow/all (TF32 GEMMs in the flow) keeps
    torch's linears whatever `code2wav_dit_tf32x3` says; conv/off leave the 3xTF32 GEMMs on."""
    cfg = random_dit().cfg
    for mode, want in (("off", "tf32x3"), ("conv", "tf32x3"), ("flow", "torch"), ("all", "torch")):
        gemm = resolve(Code2WavOptions(tf32_mode=mode), cfg, CPU, F32).gemm
        assert gemm.name == want, (mode, gemm.reason)
    assert "token2wav_allow_tf32" in resolve(Code2WavOptions(tf32_mode="flow"), cfg, CPU, F32).gemm.reason


def test_a_gemm_that_fails_to_compile_leaves_torch(monkeypatch, caplog):
    pytest.importorskip("triton")
    from stages.code2wav import dit_gemm
    from stages.platform.device import platform_override

    def broken(*args, **kwargs):
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(dit_gemm, "warm_up", broken)
    monkeypatch.setattr("stages.code2wav.kernels.is_cuda", lambda device: True)
    monkeypatch.setattr("stages.code2wav.kernels.tf32_tensor_cores", lambda device: True)
    dit = random_dit()
    with platform_override(triton=True), caplog.at_level(logging.WARNING):
        said = use(dit, gemm=gemm_kernel(True, dit.cfg, CUDA, F32, tf32_flow=False)).gemm.reason
    assert "ptxas died" in said and dit.gemm_kernel == "torch"
    assert any("ptxas died" in r.getMessage() for r in caplog.records)


def test_a_gpu_without_tf32_tensor_cores_keeps_torch(monkeypatch):
    """3xTF32 needs TF32 tensor cores (compute capability 8.0+): an older GPU keeps cuBLAS."""
    monkeypatch.setattr("stages.code2wav.kernels.is_cuda", lambda device: True)
    monkeypatch.setattr("stages.code2wav.kernels.tf32_tensor_cores", lambda device: False)
    dit = random_dit()
    assert "no TF32 tensor cores" in use(dit, gemm=gemm_kernel(True, dit.cfg, CUDA, F32, tf32_flow=False)).gemm.reason
    assert dit.gemm_kernel == "torch"


def test_the_flag_is_strict_and_on_by_default():
    assert Code2WavOptions.from_extra({}).dit_tf32x3 is True
    assert Code2WavOptions.from_extra({"code2wav_dit_tf32x3": "false"}).dit_tf32x3 is False
    with pytest.raises(FlagError, match="code2wav_dit_tf32x3"):
        Code2WavOptions.from_extra({"code2wav_dit_tf32x3": "maybe"})
    with pytest.raises(FlagError, match="code2wav_dit_tf32x3"):
        Code2WavOptions.from_extra({"code2wav_dit_tf32x4": True})


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("rows", [100, 800, 6400])
@pytest.mark.parametrize("n, k, gelu", [(1536, 512, False), (2048, 512, True), (512, 2048, False)],
                         ids=["qkv", "fc1-gelu", "fc2"])
def test_cuda_3xtf32_is_as_accurate_as_fp32(rows, n, k, gelu):
    """Against fp64: within 4x cuBLAS fp32's error (the sweep read 3xTF32 at 2-4e-7, cuBLAS fp32
    at 0.3-2e-6) and 100x below one-pass TF32's (3e-4); twice on the same input, the same bytes."""
    from stages.code2wav import dit_gemm

    x, w, b = _case(rows, n, k, device="cuda")
    ref = _fp64(x, w, b, gelu)
    y = dit_gemm.linear(x, w, b, gelu=gelu)
    with _tf32(False):
        fp32 = torch_linear(x, w, b, gelu=gelu)
    with _tf32(True):
        tf32 = torch_linear(x, w, b, gelu=gelu)
    assert _rel_err(y, ref) < 4 * max(_rel_err(fp32, ref), 2.5e-7)
    assert _rel_err(y, ref) * 100 < _rel_err(tf32, ref)
    assert torch.equal(dit_gemm.linear(x, w, b, gelu=gelu), y)


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_with_the_gemm_matches_cublas_and_replays_bit_identically():
    def switch(dit):
        assert use(dit, gemm=gemm_kernel(True, dit.cfg, CUDA, F32, tf32_flow=False)).gemm.reason.startswith("Triton")

    check_a_dit_path_on_cuda(switch, rows=6)


@pytest.mark.gpu
@needs_cuda
def test_cuda_dit_launches_the_gemm_once_per_linear():
    """Under the profiler, a DiT call with the Triton GEMM launches `_linear_kernel` once per
    routed linear: in_proj, four a block (fused q|k|v, proj, fc1 + GELU, fc2), final."""
    from torch.profiler import ProfilerActivity, profile

    dit = random_dit(seed=2, device="cuda")
    use(dit, norm=norm_kernel(True, dit.cfg, CUDA, F32))
    assert use(dit, gemm=gemm_kernel(True, dit.cfg, CUDA, F32, tf32_flow=False)).gemm.reason.startswith("Triton")
    x_in = torch.randn(2, 320, 50, device="cuda")
    mod = dit.step_modulation(0.5, x_in)  # precomputed, as the CFM does: no adaLN GEMMs in the call
    with torch.no_grad():
        dit.forward_chunk(x_in, None, None, None, mod=mod)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            dit.forward_chunk(x_in, None, None, None, mod=mod)
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert sum(n == "_linear_kernel" for n in names) == 2 + 4 * len(dit.blocks)


@pytest.mark.parametrize("fused", [False, True], ids=["unfused-attention", "fused-attention"])
def test_with_the_gemm_selected_no_linear_goes_through_torch(interpret, monkeypatch, fused):
    """Every linear of a DiT call (in_proj, q|k|v or q, k, v, proj, fc1, fc2, final) goes through
    the Triton GEMM once selected: torch's linear entry points are never called."""
    dit = random_dit(seed=6)
    use(dit, norm=norm_kernel(fused, dit.cfg, CPU, F32))
    assert use(dit, gemm=gemm_kernel(True, dit.cfg, CPU, F32, tf32_flow=False)).gemm.reason.startswith("Triton")
    x_in = torch.randn(2, 320, 4)
    mod = dit.step_modulation(0.5, x_in)

    def refuse(*args, **kwargs):
        raise AssertionError("a DiT linear went through torch")

    monkeypatch.setattr(F, "linear", refuse)
    monkeypatch.setattr(torch, "_addmm_activation", refuse)
    with torch.no_grad():
        assert dit.forward_chunk(x_in, None, None, None, mod=mod).velocity.shape == (2, 80, 4)


def test_the_mlp_is_fc1_gelu_tanh_fc2_on_the_cpu():
    """The MLP's one-GEMM-plus-epilogue form is the checkpoint's fc1 -> GELU(tanh) -> fc2: on
    the CPU it once went through torch's `_addmm_activation`, whose CPU GELU is the erf one."""
    mlp = random_dit(seed=4).blocks[0].mlp
    x = torch.randn(2, 5, mlp.fc1.in_features)
    with torch.no_grad():
        assert torch.equal(mlp(x), mlp.fc2(mlp.act(mlp.fc1(x))))


@pytest.mark.gpu
@needs_cuda
def test_cuda_gelu_epilogue_is_the_tanh_one():
    x, w, b = _case(100, 2048, 512, device="cuda")
    with _tf32(False):
        got = kernels.torch_linear_epilogue(x, w, b, gelu=True)
        torch.testing.assert_close(got, F.gelu(F.linear(x, w, b), approximate="tanh"), rtol=1e-5, atol=1e-5)


def test_an_engine_says_which_linears_run(monkeypatch):
    """The run record's `dit_gemm`: torch's on the CPU (no interpreter), whatever the flag."""
    from stages.code2wav.token2wav import Token2Wav
    from tests.stages.code2wav_tiny import tiny_config

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    t2w = Token2Wav(tiny_config(), device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    assert t2w.options.dit_tf32x3 is True and t2w.describe()["dit_gemm"] == "torch"


def test_the_benchmark_sweep_measures_every_tile_and_shape_the_dit_uses():
    """scripts/bench_dit_gemm.py is where the table's tiles come from: a tile the table holds, or
    a full-size DiT linear, that the sweep no longer times could not be re-checked on a device."""
    pytest.importorskip("triton")
    from scripts import bench_dit_gemm
    from stages.code2wav import dit_gemm
    from stages.code2wav.config import DiTConfig

    sweep = bench_dit_gemm._sweep_tiles("tiles")
    assert len(set(sweep)) == len(sweep) and bench_dit_gemm._sweep_tiles("none") == []
    assert {tile for _, tile in dit_gemm.TILES} <= set(sweep)
    timed = {(n, k, gelu) for _, n, k, gelu in bench_dit_gemm.SHAPES}
    assert timed == {(n, k, gelu) for n, k, _, gelu in kernels.linear_shapes(DiTConfig())}


def test_the_warmed_shapes_are_the_dit_modules_linears():
    """`kernels.linear_shapes` reads the dims off the config; it must name every linear the DiT's
    modules route through its gemm (a shape it missed would compile inside a graph capture)."""
    from stages.code2wav.config import DiTConfig
    from stages.code2wav.dit import DiT

    for cfg in (DiTConfig(), random_dit().cfg):
        dit = DiT(cfg)
        block = dit.blocks[0]
        layers = [(dit.in_proj, False), (block.attn.proj, False), (block.mlp.fc1, True), (block.mlp.fc2, False),
                  (dit.final_layer.linear, False)]
        shapes = {(layer.out_features, layer.in_features, layer.bias is not None, gelu) for layer, gelu in layers}
        shapes.add((3 * block.attn.proj.in_features, block.attn.to_q.in_features, True, False))  # q|k|v
        assert kernels.linear_shapes(cfg) == sorted(shapes)
