"""Kernel choice is one function per stage (`stages.code2wav.kernels.resolve`,
`stages.talker.kernels.resolve`): what it picks on the CPU, the reasons the run record and the log
carry, and that the models only run what they are handed.

Run: python -m pytest tests/stages/test_kernel_choice.py -q
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from stages.code2wav import kernels as dit_kernels
from stages.code2wav.dit import DiT
from stages.code2wav.options import Code2WavOptions
from stages.talker import kernels as talker_kernels
from stages.talker.config import TalkerConfig
from stages.talker.engine import TalkerEngine
from stages.talker.options import TalkerOptions
from stages.talker.prelude import penalty_temperature_eager
from tests.stages.code2wav_tiny import random_dit, single_thread, tiny_config  # noqa: F401

CPU = torch.device("cpu")
CPU_WORDS = {"dit_norm": "eager", "dit_attention": "sdpa", "dit_conv": "channels-first", "dit_conv_norm": "eager",
             "dit_conv_gemm": "cudnn", "dit_gemm": "torch"}
CPU_REASONS = {
    "norm": "eager (CPU without TRITON_INTERPRET=1)",
    "attention": "scaled_dot_product_attention (the CPU); Triton attention: CPU without TRITON_INTERPRET=1",
    "convs": "channels-first (not CUDA (cpu))",
    "linears": "torch (CPU without TRITON_INTERPRET=1)",
}
TINY_TALKER = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, intermediate_size=128, llm_dim=64)


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_the_cpu_runs_the_torch_references_and_says_why(no_interpreter):
    chosen = dit_kernels.resolve(Code2WavOptions(), tiny_config().dit, CPU, torch.float32)
    assert chosen.describe() == CPU_WORDS and chosen.reasons() == CPU_REASONS


def test_an_unresolved_dit_runs_what_the_default_kernels_name():
    dit, unresolved = DiT(tiny_config().dit), dit_kernels.DiTKernels()
    assert dit.kernels is None
    assert {"dit_norm": dit.norm_kernel, "dit_attention": dit.attention_kernel, "dit_conv": dit.conv_layout,
            "dit_conv_norm": dit.conv_norm_kernel, "dit_conv_gemm": dit.conv_gemm_kernel,
            "dit_gemm": dit.gemm_kernel} == unresolved.describe() == CPU_WORDS


def test_the_dit_runs_exactly_what_it_is_handed():
    """`use_kernels` wires the choice in whatever the device: here a CUDA choice on a CPU DiT
    (nothing runs), to show the model adds no decision of its own."""
    dit = random_dit()
    chosen = dit_kernels.DiTKernels(
        attention=dit_kernels.AttentionKernel(max_requests=3, matmul_rows=6, reason="given"),
        conv=dit_kernels.ConvLayout(True, "given", ln_mish=len),
        gemm=dit_kernels.GemmKernel(dit_kernels.torch_linear_epilogue, False, "given"))
    dit.use_kernels(chosen)
    assert dit.kernels is chosen and dit.attention_kernel == "matmul<=3" and dit.conv_layout == "frames-first"
    assert dit.conv_norm_kernel == "triton" and all(b.conv.ln_mish is len for b in dit.blocks)
    assert all(b.attn.matmul_rows == 6 and b.mlp.gemm is dit_kernels.torch_linear_epilogue for b in dit.blocks)
    dit.use_kernels(dit_kernels.DiTKernels())  # and back: the torch references again
    assert dit.conv_layout == "channels-first" and dit.blocks[0].attn.matmul_rows == 0
    assert dit.conv_norm_kernel == "eager"


def test_an_engine_records_why_its_dit_runs_what_it_runs(no_interpreter, single_thread):  # noqa: F811
    from stages.code2wav.token2wav import Token2Wav

    described = Token2Wav(tiny_config(), device=CPU, dtype=torch.float32, init_seed=0).describe()
    assert {k: described[k] for k in CPU_WORDS} == CPU_WORDS
    assert described["dit_reasons"] == CPU_REASONS


def _model():
    from stages.talker.engine import build_model

    model = build_model(TalkerConfig(**TINY_TALKER), device=CPU, dtype=torch.float32, init_seed=0, weights_dir=None)
    model.setup_caches(max_batch=2, max_seq_len=64, device=CPU, dtype=torch.float32)
    return model


def test_the_talker_on_the_cpu_decodes_through_the_modules_and_says_why(no_interpreter):
    chosen = talker_kernels.resolve(TalkerOptions(), _model(), CPU)
    assert not chosen.layers.fused and chosen.prelude.fn is penalty_temperature_eager
    assert chosen.reasons() == {"decode_layers": "unfused (CPU without TRITON_INTERPRET=1)",
                                "prelude": "eager (CPU without TRITON_INTERPRET=1)"}
    off = talker_kernels.resolve(TalkerOptions(fused_layers=False, fused_prelude=False), _model(), CPU)
    assert off.reasons() == {"decode_layers": "unfused (stage extra talker_fused_layers is false)",
                             "prelude": "eager (stage extra talker_codec_fused_prelude is false)"}


def test_a_given_prelude_is_used_and_recorded_as_given(no_interpreter):
    def mine(*args, **kwargs):
        return penalty_temperature_eager(*args, **kwargs)

    cfg = dataclasses.replace(TalkerConfig(**TINY_TALKER), extra={"talker_fused_layers": False})
    eng = TalkerEngine(cfg, device=CPU, dtype=torch.float32, max_batch=2, max_seq_len=64, prelude=mine)
    assert eng.prelude is mine and eng.describe()["kernel_reasons"] == {
        "decode_layers": "unfused (stage extra talker_fused_layers is false)", "prelude": "given by the caller"}
    eng.prelude = penalty_temperature_eager  # an A/B swaps it later: the record follows
    assert eng.describe()["kernel_reasons"]["prelude"] == "set on the engine"
    assert eng.describe()["prelude"] == "penalty_temperature_eager"
