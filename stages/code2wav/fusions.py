"""Launch fusions across the DiT's kernels, chosen by `stages.code2wav.kernels.resolve` once
the kernels they join are known: each removes launches, none changes a value (bit for bit the
unfused kernels, tested under the interpreter and on the GPU).

* open split sums (`code2wav_open_split_sums`): a split GEMM (proj, fc2, the convs at small
  row counts) hands its k-sum parts unadded to the kernel after it, which adds them as it loads
  (`dit_gemm.OpenSum`): one launch fewer each;
* the conv window (`code2wav_norm_writes_conv_window`): the fused norm step before a
  frames-first conv block writes the conv's input window (two cached frames first), so the
  block skips its cat: one launch fewer a block-step.

Each is on only where every kernel it joins runs (else off, the CPU included), and on CUDA the
variants it needs are compiled here, outside any graph capture. Both on by default (D-DIT-9: a
replayed steady chunk −4.8 % at one request, −2.1 % at eight, 640 and 480 kernels fewer, audio
identical in every rep, on an H100).

One more, opt-in and of another kind: the MLP branch as one launch at small chunks
(`code2wav_fused_mlp`, `dit_mlp`). It needs the open sums (its fc2 k-sum parts go to the norm
step), but splits fc2's sum at other boundaries, so its claim is fp32 accuracy against the
unfused MLP, not bit for bit; slower on a GPU, so off (D-DIT-10).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from stages.code2wav.config import DiTConfig
from stages.code2wav.dit import MOD_LN_EPS
from stages.code2wav.dit_conv import CONV_LN_EPS
from stages.platform import compile_failure, is_cuda

if TYPE_CHECKING:
    from stages.code2wav.kernels import ConvLayout, GemmKernel, NormKernel

# The kernel choice's logger: what the DiT runs is said in one place of the log.
log = logging.getLogger("stages.code2wav.kernels")


def open_sums_ready(cfg: DiTConfig, device: torch.device, norm: NormKernel, conv: ConvLayout,
                    gemm: GemmKernel) -> bool:
    """Whether proj's, fc2's and the convs' split k-sums can be left open (`code2wav_open_split_sums`):
    every consumer is a Triton kernel that adds parts (the fused norm step, the conv block's
    fused LayerNorm + Mish) and every producer a 3xTF32 GEMM; their part-adding variants are
    compiled now for every split the GEMMs can take (logged and off if that fails)."""
    if not (norm.fused and gemm.tf32x3 and conv.gemm is not None and conv.ln_mish is not None):
        log.debug("DiT: split k-sums stay closed (they need the fused norm kernels and the 3xTF32 linears and convs)")
        return False
    if not is_cuda(device):  # the interpreter (CPU tests) compiles nothing
        return True
    from stages.code2wav import dit_conv_triton, dit_gemm, dit_triton  # lazy: loads triton

    c, mlp = cfg.hidden_size, int(cfg.hidden_size * cfg.mlp_ratio)

    def warm_up() -> None:
        inner = cfg.num_heads * cfg.head_dim
        dit_triton.warm_up_open_sums(device, c, MOD_LN_EPS,
                                     dit_gemm.splits(c, inner) | dit_gemm.splits(c, mlp) | dit_gemm.splits(c, 3 * c))
        dit_conv_triton.warm_up_open_sums(device, c, CONV_LN_EPS, dit_gemm.splits(c, 3 * c))

    return compile_failure(warm_up, "the open split sums", "closed split sums", log=log, owner="DiT") is None


def conv_window_ready(cfg: DiTConfig, device: torch.device, norm: NormKernel, conv: ConvLayout) -> bool:
    """Whether the fused norm step can write each frames-first conv block's input window
    (`code2wav_norm_writes_conv_window`): its window variant compiled now (logged and off if
    that fails)."""
    if not (norm.fused and conv.frames_first):
        log.debug("DiT: the conv blocks make their own windows (the norm step writes them only fused and frames-first)")
        return False
    if not is_cuda(device):  # the interpreter (CPU tests) compiles nothing
        return True
    from stages.code2wav import dit_triton  # lazy: loads triton

    return compile_failure(lambda: dit_triton.warm_up_window(device, cfg.hidden_size, MOD_LN_EPS), "the conv window",
                           "the conv block's own cat", log=log, owner="DiT") is None


def fused_mlp(cfg: DiTConfig, device: torch.device) -> tuple[Callable | None, int]:
    """(`dit_mlp.mlp`, the rows up to which it runs) where it can run, else (None, 0) (logged).
    Call it only with the open sums on: its consumer is the norm step that adds parts. On CUDA it
    is compiled now, with the norm step's variant for its part count; the CPU runs it under the
    interpreter (tests)."""
    from stages.code2wav import dit_mlp, dit_triton  # lazy: loads triton

    c, hidden = cfg.hidden_size, int(cfg.hidden_size * cfg.mlp_ratio)
    if dit_mlp.tile_for(c, hidden) is None:
        log.info("DiT: fc1 and fc2 stay two GEMMs (the fused MLP needs a power-of-two width; C %d, hidden %d)",
                 c, hidden)
        return None, 0
    if is_cuda(device):
        def warm_up() -> None:
            dit_mlp.warm_up(device, c, hidden)
            dit_triton.warm_up_open_sums(device, c, MOD_LN_EPS, {dit_mlp.parts_for(c, hidden)})

        if compile_failure(warm_up, "the fused MLP", "fc1 and fc2 as two GEMMs", log=log, owner="DiT"):
            return None, 0
    return dit_mlp.mlp, dit_mlp.MAX_ROWS
