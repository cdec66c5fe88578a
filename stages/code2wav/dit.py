"""DiT estimator of the CFM decoder (spec §4.4): 16 adaLN-zero blocks over 50 Hz mel frames.

Input per frame = [x | mu | spk | cond] (4 x 80 = 320) -> `in_proj` -> blocks -> `final_layer`
-> velocity (80). Each block: attention (per-head q/k LayerNorm, no positional term at all),
a causal conv block (conv-LN-Mish-conv, 2-frame caches) and a GELU-tanh MLP, each gated by
adaLN shift/scale/gate rows from the timestep embedding (order msa, mlp, conv).

Between branches, the gated residual add, the next non-affine LayerNorm and its modulation are
one step (`residual_norm_modulate_eager`, or its one-launch Triton twin in `dit_triton`): blocks
are chained, each handing the next its normalised attention input. Attention runs through
`scaled_dot_product_attention`, or for chunks of few rows as batched GEMMs
(`attention_by_matmul`) or one Triton kernel (`dit_flash`). The linears (in_proj, q|k|v, proj,
fc1 + GELU, fc2, final) go through one function, `torch_linear`, or a twin of it (cuBLASLt's GELU
epilogue, or Triton GEMMs with 3xTF32 products, `dit_gemm.linear`).

Which of those run is not decided here: `stages.code2wav.kernels.resolve` chooses them from the
stage options, the device and the dtype, and `DiT.use_kernels` wires its choice in. Until then
a DiT runs the torch references (eager norm steps, SDPA, channels-first convs, `torch_linear`).

Streaming: queries are the current chunk; keys/values are `[current | cache]` (new K/V in
*front* of the cache, the upstream convention the trim ranges rely on). Per block caches:
conv [rows, 2*hidden, 2] (conv1 input history | conv2 input history), attention
[rows, H, L, 2*head_dim] (K|V). `forward_chunk` writes the new [depth, ...] caches straight
into caller-provided buffers (the CFM's per-step arenas), so no cat/stack copies are made; a
cache that already sits in its destination's tail (the CFM's stepwise path) is not copied.

Module names follow the official checkpoint (`decoder.estimator.blocks.0.attn.to_q.weight`,
`...conv.block.1.weight`, `...adaLN_modulation.1.weight`), so `flow.pt` loads without renames.

    dit = DiT(DiTConfig())
    dit.use_kernels(kernels.resolve(options, dit.cfg, device, torch.float32))  # optional
    out = dit.forward_chunk(x_in, t, cnn_cache=None, att_cache=None)  # x_in: [2B, 320, T]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from stages.code2wav.config import DiTConfig
from stages.code2wav.dit_conv import CONV_CACHE_FRAMES, CausalConvBlock

if TYPE_CHECKING:
    from stages.code2wav.kernels import DiTKernels

MOD_LN_EPS = 1e-6  # the non-affine LayerNorms before modulation


# Measured deviation from the official formulation (upstream computes `x * (1 + scale) + shift`
# and `x + gate * y`, two roundings each; on the CPU `addcmul` fuses the multiply-add and rounds
# once, never farther from the exact value): 9.5e-7 max apart at unit scale for both. With the
# scale-keeping random weights (D-INIT-1): one estimator call 1.9e-6 (full dims) / 1.2e-6 (tiny);
# the streamed flow mel 2.2e-5, 108 dB SNR (full) / 1.2e-5, 116-119 dB (tiny), together with the
# float64 host t schedule and the one-row adaLN GEMMs (cfm.py) and up_embed's transposed input
# (flow_encoder.py); with those undone too, bit-exact. results/cpu/official_deviation_{full,tiny}*.json,
# tests/stages/test_official_reference.py. Kept: one launch instead of two per branch.
def modulate(x: torch.Tensor, shift: torch.Tensor, scale_plus_one: torch.Tensor) -> torch.Tensor:
    """x * (1 + scale) + shift in one kernel; the modulation rows carry (1 + scale) already."""
    return torch.addcmul(shift, x, scale_plus_one)


def gated(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + gate * y in one kernel (the adaLN-zero residual)."""
    return torch.addcmul(x, gate, y)


def torch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, gelu: bool = False,
                 open_sum: bool = False):
    """`F.linear` (then GELU-tanh when `gelu`): the DiT's linears unless `use_kernels` wires in a
    twin with the same signature (`kernels.torch_linear_epilogue` on CUDA: the GELU as cuBLASLt's
    epilogue; `dit_gemm.linear`: Triton 3xTF32). `open_sum` (the consumer could add a split
    GEMM's parts, `dit_gemm.OpenSum`) is ignored: this linear hands back its whole result."""
    if not gelu:
        return F.linear(x, weight, bias)
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def residual_norm_modulate_eager(x, gate, y, shift, scale, *, eps: float, history=None):
    """(x + gate * y, LN(x + gate * y) * scale + shift): the step between two branches of a block
    (no residual when gate is None), as three torch ops. Returns (new x, modulated activation);
    with `history` [B, C, H] the activation comes as a causal conv's input window,
    `cat([historyᵀ, activation])` on frames. `stages.code2wav.kernels.residual_norm_modulate_fused`
    is the one-launch twin (x updated in place)."""
    if gate is not None:
        x = gated(x, gate, y)
    h = modulate(F.layer_norm(x, (x.shape[-1],), eps=eps), shift, scale)
    return x, h if history is None else torch.cat([history.transpose(1, 2), h], dim=1)


# Per block: (shift, 1 + scale, gate) for msa, then mlp, then conv; each [rows | 1, 1, C].
BlockModulation = tuple[torch.Tensor, ...]


def block_modulation(linear_out: torch.Tensor) -> BlockModulation:
    """Split adaLN's 9C output into the 9 rows, folding the +1 into the three scales."""
    parts = list(linear_out.chunk(9, dim=-1))
    for i in (1, 4, 7):
        parts[i] = parts[i] + 1
    return tuple(parts)


@dataclass(frozen=True)
class StepModulation:
    """The adaLN rows of every block and of the final layer for one Euler step.

    They depend only on the step's t, which every row of a batch shares, so the CFM computes
    them once per step (`DiT.step_modulation`) instead of per call and row: that saves the time
    MLP and 17 GEMMs per step, and inside a graph they are plain static tensors.
    """

    blocks: tuple[BlockModulation, ...]
    final: tuple[torch.Tensor, torch.Tensor]  # (shift, 1 + scale)


class TimestepEmbedder(nn.Module):
    """t -> sinusoid ([cos | sin], max period 10000) of t*1000 -> Linear-SiLU-Linear."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.freq_dim, self.scale = cfg.time_embed_dim, cfg.time_scale
        self.mlp = nn.Sequential(
            nn.Linear(cfg.time_embed_dim, cfg.hidden_size),
            nn.SiLU(),
            nn.Linear(cfg.hidden_size, cfg.hidden_size),
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:  # t: [N] -> [N, hidden]
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
        args = (t * self.scale)[:, None].float() * freqs[None].float()
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(t.dtype)
        return self.mlp(emb)


def attention_by_matmul(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v, unmasked, as two batched GEMMs and a softmax: q [B, H, T, D],
    k and v [B, H, L, D] (slices of the K|V cache are fine: they stay views) -> [B, H, T, D].

    Why: a fused attention kernel tiles its grid by (batch x head, query block), so a one- or
    two-request chunk (2-4 DiT rows x 8 heads, one 50-frame query block) gives it 16-32 blocks on
    a GPU of 132 SMs, each walking the whole cache alone; cuBLAS splits these small GEMMs over
    the device. The same function to float rounding; 1/sqrt(D) is applied to q on its copy (a
    power of two for D = 64, so exact there). The logits take q's dtype: `Attention` routes
    fp32 only here (bf16 logits would lose what the fused kernels keep in fp32)."""
    b, h, t, d = q.shape
    length = k.shape[2]
    qh = q.new_empty(b, h, t, d)
    torch.mul(q, 1.0 / math.sqrt(d), out=qh)  # the one copy q needs to be a [B*H, T, D] batch
    scores = torch.bmm(qh.view(b * h, t, d), k.reshape(b * h, length, d).transpose(1, 2))
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, v.reshape(b * h, length, d)).view(b, h, t, d)


class Attention(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        inner = cfg.num_heads * cfg.head_dim
        self.h, self.d = cfg.num_heads, cfg.head_dim
        self.to_q = nn.Linear(cfg.hidden_size, inner)
        self.to_k = nn.Linear(cfg.hidden_size, inner)
        self.to_v = nn.Linear(cfg.hidden_size, inner)
        self.q_norm = nn.LayerNorm(cfg.head_dim)
        self.k_norm = nn.LayerNorm(cfg.head_dim)
        self.proj = nn.Linear(inner, cfg.hidden_size)
        # DiT.use_kernels: one q|k|v GEMM + this Triton q/k norm and cache write (`dit_triton`).
        self.qk_norm_to_cache = None
        self.matmul_rows = 0  # DiT.use_kernels: up to this many rows, attention_by_matmul
        self.flash = None  # DiT.use_kernels: those rows through `dit_flash.attention` instead
        self.gemm = torch_linear  # DiT.use_kernels may wire in a twin
        # DiT.use_kernels: proj's split k-sum left open for the norm step (a `dit_gemm.OpenSum`)
        self.open_sum = False
        self._qkv: tuple | None = None  # (key, weight, bias): the three projections concatenated
        self._qkv_retired: list[tuple] = []  # earlier copies, kept alive for graphs that read them

    def qkv_projection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The q, k and v projections as one [3 * H * D, C] weight and bias, made once and remade
        when a weight is replaced or written in place (the key holds each one's storage and
        version counter: a weight load or `.to()` is seen on the next eager call; a captured
        graph keeps reading the copy it was captured with, as it keeps every other address, so
        replaced copies are kept alive, never freed under a graph)."""
        params = (self.to_q.weight, self.to_k.weight, self.to_v.weight, self.to_q.bias, self.to_k.bias, self.to_v.bias)
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self._qkv is None or self._qkv[0] != key:
            if self._qkv is not None:
                self._qkv_retired.append(self._qkv)
            with torch.no_grad():
                self._qkv = (key, torch.cat(params[:3]), torch.cat(params[3:]))
        return self._qkv[1], self._qkv[2]

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, H*D] -> [B, T, H, D] (a view)
        b, t, _ = x.shape
        return x.view(b, t, self.h, self.d)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, C]
        cache: torch.Tensor | None,  # [B, H, L, 2D]
        mask: torch.Tensor | None,  # [B|1, T, T+L] bool, True = attend (reference path)
        out_cache: torch.Tensor,  # [B, H, T+L, 2D] destination of the new cache
    ) -> torch.Tensor:
        t = x.shape[1]
        if self.qk_norm_to_cache is not None:  # one GEMM and one launch for the six steps below
            qkv = self.gemm(x, *self.qkv_projection())
            q = self.qk_norm_to_cache(qkv, self.q_norm, self.k_norm, out_cache, self.h).transpose(1, 2)
        else:
            # The head LayerNorms run on the contiguous [B, T, H, D] view and are transposed after
            # (LayerNorm over D is the same either way): no contiguous copy of a transposed input.
            q = self.q_norm(self._split(self._linear(self.to_q, x))).transpose(1, 2)
            # New K/V are written straight into the output cache, current frames first, then the
            # old cache: one copy instead of cat(k), cat(v), cat(k|v) and two stacks.
            out_cache[:, :, :t, : self.d] = self.k_norm(self._split(self._linear(self.to_k, x))).transpose(1, 2)
            out_cache[:, :, :t, self.d :] = self._split(self._linear(self.to_v, x)).transpose(1, 2)
        if cache is not None and cache.shape[2] > 0 and not _is_view_of(cache, out_cache[:, :, t:]):
            out_cache[:, :, t:] = cache
        k, v = out_cache[..., : self.d], out_cache[..., self.d :]
        b = x.shape[0]
        # fp32 only: in bf16 the GEMM would round the logits to bf16 before the softmax, where
        # the fused kernels keep them in fp32 (and the path was measured in fp32 only).
        if mask is None and b <= self.matmul_rows and q.dtype == k.dtype == torch.float32:
            if self.flash is not None:  # one launch, [B, T, H, D] out: the projection reads it as it is
                flat = self.flash(q.transpose(1, 2), out_cache).view(b, t, self.h * self.d)
                return self.gemm(flat, self.proj.weight, self.proj.bias, open_sum=self.open_sum)
            out = attention_by_matmul(q, k, v)
        else:
            attn_mask = None if mask is None else mask.unsqueeze(1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        flat = out.transpose(1, 2).reshape(b, t, self.h * self.d)
        return self.gemm(flat, self.proj.weight, self.proj.bias, open_sum=self.open_sum)

    def _linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, layer.weight, layer.bias)


def _is_view_of(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same memory, shape and strides: the cache already sits in the destination's tail (the
    CFM's stepwise path loads it there), so the copy would be a no-op memcpy of the whole cache."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)
        self.gemm = torch_linear  # DiT.use_kernels may wire in a twin
        # fc2's split k-sum left open for the fused norm step after it (`DiT.use_kernels`)
        self.open_sum = False
        # DiT.use_kernels: up to `fused_rows` rows, the whole branch as one launch handing fc2's
        # k-sum parts to the norm step (`dit_mlp.mlp`, code2wav_fused_mlp; needs `open_sum`)
        self.fused = None
        self.fused_rows = 0

    def forward(self, x: torch.Tensor):  # x: [B, T, C]
        if self.fused is not None and x.shape[0] * x.shape[1] <= self.fused_rows:
            return self.fused(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)
        # fc1 + bias + GELU(tanh) as one GEMM with an activation epilogue: the same function as
        # fc1 -> act (`self.act`, kept for the checkpoint's module tree), one launch fewer.
        h = self.gemm(x, self.fc1.weight, self.fc1.bias, gelu=True)
        # a tensor, or with `open_sum` possibly a split GEMM's `dit_gemm.OpenSum` for the norm step
        return self.gemm(h, self.fc2.weight, self.fc2.bias, open_sum=self.open_sum)


class DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        c = cfg.hidden_size
        self.norm1 = nn.LayerNorm(c, elementwise_affine=False, eps=MOD_LN_EPS)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(c, elementwise_affine=False, eps=MOD_LN_EPS)
        self.mlp = MLP(c, int(c * cfg.mlp_ratio))
        self.norm3 = nn.LayerNorm(c, elementwise_affine=False, eps=MOD_LN_EPS)
        self.conv = CausalConvBlock(c)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(c, 9 * c))

    def modulation(self, c: torch.Tensor) -> BlockModulation:
        return block_modulation(self.adaLN_modulation(c))

    def forward(self, x, h, mod: BlockModulation, next_mod: tuple, caches: tuple, outs: tuple, mask, norm):
        """One block, chained: `h` is this block's attention input, modulate(norm1(x)), made by
        the step before (the previous block's last residual, or the first norm); returns
        (x, the next block's attention input) with `next_mod` = its (shift, 1 + scale).

        Each residual add is fused with the LayerNorm and modulation after it (`norm`, eager or
        the Triton twin), which is why a block hands its successor a normalised input: the eager
        order of operations is unchanged (attn, conv, mlp; norm1, norm3, norm2).
        caches = (cnn, att) inputs, outs = (cnn, att) destinations."""
        (_, _, g_msa, sh_mlp, sc_mlp, g_mlp, sh_conv, sc_conv, g_conv) = mod
        eps = self.norm1.eps
        # The conv's input window (two cached frames, then the frames) made by the norm step
        # when the conv block takes it so (`CausalConvBlock.window_from_norm`).
        history = self.conv.window_history(caches[0], x)
        attn = self.attn(h, caches[1], mask, outs[1])
        x, h = norm(x, g_msa, attn, sh_conv, sc_conv, eps=eps, history=history)
        x, h = norm(x, g_conv, self.conv(h, caches[0], outs[0], window=history is not None), sh_mlp, sc_mlp, eps=eps)
        return norm(x, g_mlp, self.mlp(h), *next_mod, eps=eps)


class FinalLayer(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        c = cfg.hidden_size
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(c, 2 * c))
        self.norm_final = nn.LayerNorm(c, elementwise_affine=False, eps=MOD_LN_EPS)
        self.linear = nn.Linear(c, cfg.out_channels)
        self.gemm = torch_linear  # DiT.use_kernels may wire in a twin

    def modulation(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return shift, scale + 1

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # h = modulate(norm_final(x), *mod), made by the last block's fused residual step.
        return self.gemm(h, self.linear.weight, self.linear.bias)


@dataclass
class DiTOut:
    velocity: torch.Tensor  # [N, out, T]
    cnn_cache: torch.Tensor  # [depth, N, 2*hidden, 2]
    att_cache: torch.Tensor  # [depth, N, H, T+L, 2*head_dim]


class DiT(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.t_embedder = TimestepEmbedder(cfg)
        self.in_proj = nn.Linear(cfg.in_channels, cfg.hidden_size)
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.final_layer = FinalLayer(cfg)
        self.kernels: DiTKernels | None = None  # what `use_kernels` wired in; None: the torch references
        self._norm = residual_norm_modulate_eager
        self.norm_kernel = "eager"  # the run record's names of what runs: "eager" or "triton",
        self.attention_kernel = "sdpa"  # "sdpa", "matmul<=N" or "triton<=N",
        self.gemm = torch_linear  # (in_proj)
        self.gemm_kernel = "torch"  # "torch" or "tf32x3"

    def use_kernels(self, kernels: DiTKernels) -> None:
        """Run what `stages.code2wav.kernels.resolve` chose: wires its callables into the blocks,
        decides nothing. Call it after the weights are loaded and the dtype set (the conv weights
        are re-laid-out in place; the fused q|k|v projection is made now, not inside a first
        graph capture)."""
        self.kernels = kernels
        norm, attention, gemm = kernels.norm, kernels.attention, kernels.gemm
        self._norm, self.norm_kernel = norm.step, norm.name
        self.attention_kernel = attention.name
        self.gemm, self.gemm_kernel = gemm.linear, gemm.name
        self.final_layer.gemm = gemm.linear
        for block in self.blocks:
            block.attn.qk_norm_to_cache = norm.qk_norm_to_cache
            block.attn.matmul_rows, block.attn.flash = attention.matmul_rows, attention.flash
            block.attn.gemm = block.mlp.gemm = gemm.linear
            block.conv.set_frames_first(kernels.conv.frames_first)
            block.conv.ln_mish, block.conv.conv_gemm = kernels.conv.ln_mish, kernels.conv.gemm
            block.attn.open_sum = block.mlp.open_sum = block.conv.open_sums = kernels.open_sums
            block.mlp.fused, block.mlp.fused_rows = kernels.fused_mlp, kernels.fused_mlp_rows
            block.conv.window_from_norm = kernels.conv_window
            if norm.fused:
                block.attn.qkv_projection()

    @property
    def conv_layout(self) -> str:
        """Which layout the causal convs run in, read off the blocks: "frames-first" or
        "channels-first" (`use_kernels` switches every block together)."""
        return "frames-first" if self.blocks[0].conv.frames_first else "channels-first"

    @property
    def conv_gemm_kernel(self) -> str:
        """The causal convs' kernel, read off the blocks: "tf32x3" (Triton GEMMs) or "cudnn"."""
        return "tf32x3" if self.blocks[0].conv.conv_gemm is not None else "cudnn"

    @property
    def conv_norm_kernel(self) -> str:
        """The conv blocks' LayerNorm + Mish, read off the blocks: "triton" or "eager"."""
        return "triton" if self.blocks[0].conv.ln_mish is not None else "eager"

    def forward_chunk(
        self,
        x_in: torch.Tensor,  # [N, 320, T] = [x | mu | spk | cond]
        t: torch.Tensor | None,  # [N]; unused when `mod` is given
        cnn_cache: torch.Tensor | None,  # [depth, N, 2*hidden, 2]
        att_cache: torch.Tensor | None,  # [depth, N, H, L, 2*head_dim]
        mask: torch.Tensor | None = None,  # [N|1, T, T+L] (reference path only)
        *,
        cnn_out: torch.Tensor | None = None,  # [depth, N, 2*hidden, 2] destination
        att_out: torch.Tensor | None = None,  # [depth, N, H, T+L, 2*head_dim] destination
        mod: StepModulation | None = None,  # precomputed for a t shared by every row
    ) -> DiTOut:
        """One estimator call. New caches are written into `cnn_out` / `att_out` when given
        (the CFM passes slices of its per-step buffers), else freshly allocated. Without `mod`
        the modulation is computed from `t` per row."""
        n, _, frames = x_in.shape
        cached = 0 if att_cache is None else att_cache.shape[3]
        cfg = self.cfg
        if cnn_out is None:
            cnn_out = x_in.new_empty(cfg.depth, n, 2 * cfg.hidden_size, CONV_CACHE_FRAMES)
        if att_out is None:
            att_out = x_in.new_empty(cfg.depth, n, cfg.num_heads, frames + cached, 2 * cfg.head_dim)
        if mod is None:
            mod = self._modulation(self.t_embedder(t).unsqueeze(1))
        x = self.gemm(x_in.transpose(1, 2), self.in_proj.weight, self.in_proj.bias)
        norm, last = self._norm, len(self.blocks) - 1
        x, h = norm(x, None, None, *mod.blocks[0][:2], eps=MOD_LN_EPS)  # block 0's norm1
        for i, block in enumerate(self.blocks):
            caches = (
                None if cnn_cache is None else cnn_cache[i],
                None if att_cache is None else att_cache[i],
            )
            next_mod = mod.final if i == last else mod.blocks[i + 1][:2]
            x, h = block(x, h, mod.blocks[i], next_mod, caches, (cnn_out[i], att_out[i]), mask, norm)
        v = self.final_layer(h).transpose(1, 2)
        return DiTOut(v, cnn_out, att_out)

    def _modulation(self, c: torch.Tensor) -> StepModulation:
        # c: [N | 1, 1, C] conditioning rows
        return StepModulation(tuple(b.modulation(c) for b in self.blocks), self.final_layer.modulation(c))

    def step_modulation(self, t: float, like: torch.Tensor) -> StepModulation:
        """The modulation of a step whose t every row shares: [1, 1, C] rows (broadcast)."""
        return self._modulation(self.t_embedder(like.new_full((1,), t)).unsqueeze(1))
