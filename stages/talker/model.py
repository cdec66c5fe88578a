"""The talker's modules: a Llama backbone, codec embeddings/head and the condition projector.

Only `nn.Module`s and tensor math live here (gpt-fast style); the loops are in `engine.py`,
sampling in `sampling.py`, checkpoint loading in `weights.py`. Parameter names mirror the
official MiniCPM-o 4.5 `tts.*` state dict without the prefix, so a checkpoint loads with no
rename table: `model.layers.N.self_attn.q_proj.weight`, `emb_text.weight`, `emb_code.0.weight`,
`head_code.0.parametrizations.weight.original0/1` (weight norm g / v), `projector_semantic.linear1`.

Three ways through the backbone, all sharing the same layers:
* `forward_full(x)`: no cache, causal; the uncached reference used by tests.
* `prefill_rows(x, slot)`: one request's condition rows at positions 0..T-1, written into its
  slot (a [1] long tensor, so a device graph can replay it for any slot); `prefill(x, slot)` is
  the same for an int slot, returning the last row.
* `decode(x, positions, kv_len)`: one token for rows 0..R-1 (row == cache slot), each at its own
  position; attention reads `cache[:R, :, :kv_len]` (views, no copy) under a per-row length mask.

Build on the meta device and `load_state_dict(..., assign=True)`, or build on CPU and call
`init_random_weights`; then `fold_weight_norm()` once for inference and `setup_caches(...)`.
`use_kernels(stages.talker.kernels.resolve(...))` then routes `decode` through fused layers when
that chose them (`_decode_fused`: one q|k|v and one gate|up GEMM, RMSNorm with its residual add
and RoPE with the cache writes as Triton kernels, `stages.talker.layer_triton`); prefill keeps
the modules. Which layers run is decided there, not here.

    >>> model = TalkerModel(TalkerConfig(hidden_size=64, num_layers=2, num_heads=4,
    ...                                  intermediate_size=128, llm_dim=64))
    >>> model.setup_caches(max_batch=4, max_seq_len=256, device="cpu", dtype=torch.float32)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from stages.platform.device import host_to_device
from stages.talker.config import TalkerConfig

if TYPE_CHECKING:
    from stages.talker.kernels import TalkerKernels


@dataclass(frozen=True)
class _CacheStep:
    """How one attention call uses the KV cache (None = no cache, the uncached reference)."""

    # Rows of the flat cache this call writes: KVCache.prefill_rows or KVCache.decode_rows.
    cache_rows: torch.Tensor | None = None
    positions: torch.Tensor | None = None  # decode: [R] long, write position of each row
    kv_len: int = 0  # decode: how many cache positions attention reads
    mask: torch.Tensor | None = None  # decode: [R, 1, 1, kv_len] bool, True = attend


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like HF Llama, then cast back before the gain.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class KVCache(nn.Module):
    """Static per-slot cache: k/v [max_batch, kv_heads, max_seq_len, head_dim]."""

    def __init__(self, shape: tuple[int, int, int, int], *, device, dtype) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        # Row of (slot b, head h, position 0) in the cache viewed as [slots * KVH * max_seq_len, hd].
        slots, heads, seq, _ = shape
        first = (torch.arange(slots, device=device)[:, None] * heads + torch.arange(heads, device=device)) * seq
        self.register_buffer("first_rows", first, persistent=False)  # [slots, KVH]

    def prefill_rows(self, slot: torch.Tensor, length: int) -> torch.Tensor:
        """slot: [1] long -> [KVH * length] rows of the flat cache (see decode_rows): (slot, head
        h, positions 0..length-1) in (h, position) order, the order of a prefill's k [1, KVH, T, hd].
        A tensor slot, not an int, so one captured prefill serves every slot."""
        positions = torch.arange(length, device=slot.device)
        return (self.first_rows[slot].reshape(-1, 1) + positions).reshape(-1)

    def decode_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [R] long (row r is slot r) -> [R * KVH] rows of the cache viewed as
        [slots * KVH * max_seq_len, hd]: (slot r, head h, positions[r]) in (r, h) order. Made
        once per step, shared by every layer (their caches have one shape)."""
        return (self.first_rows[: positions.shape[0]] + positions[:, None]).reshape(-1)

    def write(self, cache_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # cache_rows from decode_rows (k, v: [R, KVH, 1, hd]) or prefill_rows ([1, KVH, T, hd]):
        # both list rows in k's (r, h, t) order. An index_put (device-side scatter, no host sync),
        # so it can be captured in a graph. One index over the flat cache: as
        # `k[slots, :, positions]` the indexed dims would not be adjacent, and under deterministic
        # kernels CUDA then copies the whole cache twice per write (see stages.platform.indexing);
        # this way it only sorts the written rows' indices.
        hd = self.k.shape[-1]
        self.k.view(-1, hd)[cache_rows] = k.reshape(-1, hd)
        self.v.view(-1, hd)[cache_rows] = v.reshape(-1, hd)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [R, H, T, hd]; cos, sin: [R or 1, 1, T, hd]. HF Llama's half-split (non-interleaved) form,
    # which is what the checkpoint's q/k weights were trained with.
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)
        self.kv_cache: KVCache | None = None
        # [(H + 2 KVH) * hd, D] once `TalkerModel.fuse_projections` ran: q|k|v weights in one
        # tensor, the three projections' weights then being views of it.
        self.qkv_weight: torch.Tensor | None = None

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        r, t, _ = x.shape
        return x.view(r, t, n, self.head_dim).transpose(1, 2)  # [R, n, T, hd]

    def forward(self, x, cos, sin, step: _CacheStep | None) -> torch.Tensor:
        # x: [R, T, D] -> [R, T, D]
        q = apply_rope(self._heads(self.q_proj(x), self.num_heads), cos, sin)
        k = apply_rope(self._heads(self.k_proj(x), self.num_kv_heads), cos, sin)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        gqa = self.num_heads != self.num_kv_heads
        if step is not None and step.positions is not None:
            assert self.kv_cache is not None, "setup_caches() before decode"
            self.kv_cache.write(step.cache_rows, k, v)
            r = x.shape[0]
            keys = self.kv_cache.k[:r, :, : step.kv_len]
            values = self.kv_cache.v[:r, :, : step.kv_len]
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=step.mask, enable_gqa=gqa
            )
        else:
            if step is not None:
                assert self.kv_cache is not None, "setup_caches() before prefill"
                self.kv_cache.write(step.cache_rows, k, v)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        r, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(r, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_weight: torch.Tensor | None = None  # [2 I, D], as qkv_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, step: _CacheStep | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, step)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """The Llama body (`tts.model.*`); the checkpoint's unused `embed_tokens` is not built."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

        self.rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # by setup_rope

    def rope_angles(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [...] -> fp32 angles [..., hd] (HF Llama: fp32 inv_freq, halves repeated)."""
        hd = self.cfg.head_dim
        exponent = torch.arange(0, hd, 2, device=positions.device, dtype=torch.float32) / hd
        inv_freq = 1.0 / (self.cfg.rope_theta**exponent)  # [hd/2]
        angles = positions.float()[..., None] * inv_freq
        return torch.cat((angles, angles), dim=-1)

    def setup_rope(self, max_seq_len: int, device, dtype) -> None:
        """Precompute cos/sin [max_seq_len, hd] once, so a decode step only gathers rows."""
        angles = self.rope_angles(torch.arange(max_seq_len, device=device))
        self.rope_table = (angles.cos().to(dtype), angles.sin().to(dtype))

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """positions: [R, T] long -> cos, sin [R, 1, T, hd]: table rows after `setup_caches`
        (positions must be < max_seq_len), else computed on the fly."""
        if self.rope_table is not None:
            cos, sin = (t[positions][:, None] for t in self.rope_table)
            return cos, sin
        emb = self.rope_angles(positions)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x, positions, step: _CacheStep | None) -> torch.Tensor:
        # x: [R, T, D], positions: [R, T] long -> normed hidden [R, T, D]
        cos, sin = self.rope(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, step)
        return self.norm(x)


class MultiModalProjector(nn.Module):
    """projector_semantic: Linear(llm_dim, hidden) -> ReLU -> Linear(hidden, hidden), with bias."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_dim, out_dim, bias=True)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(out_dim, out_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.relu(self.linear1(x)))


class TalkerModel(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.emb_text = nn.Embedding(cfg.num_text_tokens, cfg.hidden_size)
        self.emb_code = nn.ModuleList([nn.Embedding(cfg.num_audio_tokens, cfg.hidden_size)])
        head = nn.Linear(cfg.hidden_size, cfg.num_audio_tokens, bias=False)
        # Weight norm over dim 0 (one g per output row), as in the checkpoint.
        self.head_code = nn.ModuleList([weight_norm(head, name="weight", dim=0)])
        self.projector_semantic = MultiModalProjector(cfg.llm_dim, cfg.hidden_size)
        self.max_batch = self.max_seq_len = 0  # set by setup_caches
        self.layer_kernels = None  # stages.talker.layer_triton once `use_kernels` wired it in

    # -- weights -----------------------------------------------------------------------------
    @torch.no_grad()
    def init_random_weights(self, generator: torch.Generator) -> None:
        """Seeded init: N(0, 0.02) matrices, unit norms, zero biases; weight-norm g = ||v||.

        Draws in `named_parameters()` order from one CPU generator, so the weights are identical
        in every process and run for a given seed. Call on a CPU-built model, then `.to(device)`.
        """
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            elif name.endswith("original0"):
                continue  # g: set from v below
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
        wn = self.head_code[0].parametrizations.weight
        wn.original0.copy_(wn.original1.norm(dim=1, keepdim=True))

    @torch.no_grad()
    def fold_weight_norm(self) -> None:
        """Materialise head_code's W = g * v / ||v|| once (inference); state-dict keys become
        `head_code.0.weight`, so load checkpoints before folding. Idempotent."""
        head = self.head_code[0]
        if not parametrize.is_parametrized(head, "weight"):
            return
        wn = head.parametrizations.weight
        # Fold in fp32 even for bf16 weights, so W carries one rounding, not three.
        w = torch._weight_norm(wn.original1.float(), wn.original0.float(), 0)
        parametrize.remove_parametrizations(head, "weight", leave_parametrized=True)
        head.weight.copy_(w.to(head.weight.dtype))

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """Concatenate each layer's q|k|v and gate|up weights into one tensor apiece, so a decode
        runs one GEMM for three and one for two; the modules' weights become views into them
        (no second copy; state-dict names and values unchanged). Call after the weights are
        loaded and moved (a later `.to()` would copy the views apart). Idempotent."""
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.qkv_weight is None:
                attn.qkv_weight = _concat_into_views(attn.q_proj, attn.k_proj, attn.v_proj)
            if mlp.gate_up_weight is None:
                mlp.gate_up_weight = _concat_into_views(mlp.gate_proj, mlp.up_proj)

    def use_kernels(self, kernels: TalkerKernels) -> None:
        """Decode through the layers `stages.talker.kernels.resolve` chose (it fused the
        projections and compiled the kernels already); wires them in, decides nothing."""
        self.layer_kernels = kernels.layers.kernels

    # -- caches ------------------------------------------------------------------------------
    def setup_caches(self, *, max_batch: int, max_seq_len: int, device, dtype) -> None:
        cfg = self.cfg
        shape = (max_batch, cfg.num_kv_heads, max_seq_len, cfg.head_dim)
        for layer in self.model.layers:
            layer.self_attn.kv_cache = KVCache(shape, device=device, dtype=dtype)
        self.model.setup_rope(max_seq_len, device, dtype)
        self.max_batch, self.max_seq_len = max_batch, max_seq_len

    # -- forward paths -----------------------------------------------------------------------
    def forward_full(self, x: torch.Tensor) -> torch.Tensor:
        """Uncached causal forward. x: [B, T, D] at positions 0..T-1 -> hidden [B, T, D]."""
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        return self.model(x, positions, None)

    def prefill_rows(self, x: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """One request's rows x: [T, D] into cache `slot` ([1] long) at 0..T-1 -> hidden [T, D].

        Causal: row t depends on rows 0..t only, so rows appended after a request's own (the
        engine pads to a length bucket) change none of its rows' inputs; their cache writes land
        beyond its length, where its decode writes before it reads (and masks the rest)."""
        positions = torch.arange(x.shape[0], device=x.device)[None]
        rows = self.model.layers[0].self_attn.kv_cache.prefill_rows(slot, x.shape[0])
        return self.model(x[None], positions, _CacheStep(cache_rows=rows))[0]

    def prefill(self, x: torch.Tensor, slot: int) -> torch.Tensor:
        """`prefill_rows` into the int `slot` -> the last row's hidden [D]."""
        slot_t = torch.full((1,), slot, dtype=torch.long, device=x.device)  # a fill: no host copy
        return self.prefill_rows(x, slot_t)[-1]

    def decode(self, x: torch.Tensor, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One token per row. x: [R, D] (row r == slot r), positions: [R] long -> hidden [R, D].

        Row r attends to cache positions <= positions[r]; `kv_len` (> max position) bounds the
        read so short batches do not scan the whole static cache. Through the fused layers once
        `use_kernels` wired them in, else through the modules.
        """
        if self.layer_kernels is not None:
            return self._decode_fused(x, positions, kv_len)
        keys = torch.arange(kv_len, device=x.device)
        mask = (keys[None, :] <= positions[:, None])[:, None, None, :]  # [R, 1, 1, kv_len]
        cache_rows = self.model.layers[0].self_attn.kv_cache.decode_rows(positions)
        step = _CacheStep(positions=positions, cache_rows=cache_rows, kv_len=kv_len, mask=mask)
        return self.model(x[:, None], positions[:, None], step)[:, 0]

    def _decode_fused(self, x: torch.Tensor, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """`decode` in ~10 kernels a layer instead of ~65 (stages.talker.layer_triton says where
        they went). Same function: RoPE and the cache writes are bit for bit the modules'; the
        fused GEMMs and the norm's reduction order differ from them by fp32 rounding."""
        kernels, cfg = self.layer_kernels, self.cfg
        rows = x.shape[0]
        # Additive mask, made once a step for all layers (a bool one is converted to this by
        # every attention call): 0 where key <= the row's position, -inf after it.
        after = torch.arange(kv_len, device=x.device)[None, :] > positions[:, None]
        bias = torch.zeros(rows, 1, 1, kv_len, dtype=x.dtype, device=x.device)
        bias.masked_fill_(after[:, None, None, :], float("-inf"))
        cos, sin = self.model.rope_table
        gqa = cfg.num_heads != cfg.num_kv_heads
        inter = cfg.intermediate_size
        delta = None  # the previous block's output, added to the residual by the next norm
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            x, h = kernels.add_rms_norm(x, delta, layer.input_layernorm)
            q = kernels.rope_to_cache(F.linear(h, attn.qkv_weight), positions, cos, sin,
                                      attn.kv_cache.k, attn.kv_cache.v, cfg.num_heads)  # fmt: skip
            out = F.scaled_dot_product_attention(
                q, attn.kv_cache.k[:rows, :, :kv_len], attn.kv_cache.v[:rows, :, :kv_len],
                attn_mask=bias, enable_gqa=gqa,
            )
            x, h = kernels.add_rms_norm(x, attn.o_proj(out.reshape(rows, -1)), layer.post_attention_layernorm)
            gate_up = F.linear(h, mlp.gate_up_weight)
            delta = mlp.down_proj(F.silu(gate_up[:, :inter]) * gate_up[:, inter:])
        return kernels.add_rms_norm(x, delta, self.model.norm)[1]

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, D] -> fp32 logits [R, num_audio_tokens]."""
        return self.head_code[0](hidden).float()

    def condition(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Condition rows (spec §2.2). token_ids: [N] long, hidden: [N, llm_dim] -> [N + 2, D].

        Row i = emb_text(tok_i) + L2normalize(projector_semantic(h_i)), then emb_text(text_eos)
        and emb_text(audio_bos). N == 0 gives just the two boundary rows.
        """
        cfg = self.cfg
        # Queued, not waited for (a blocking copy would wait for the talker's queued work).
        boundary = host_to_device(torch.tensor([cfg.text_eos_token_id, cfg.audio_bos_token_id]), token_ids.device)
        tail = self.emb_text(boundary)
        if token_ids.numel() == 0:
            return tail
        proj = F.normalize(self.projector_semantic(hidden.to(tail.dtype)), p=2, dim=-1)
        return torch.cat([self.emb_text(token_ids) + proj, tail], dim=0)


def _concat_into_views(*linears: nn.Linear) -> torch.Tensor:
    """One tensor holding the linears' weights stacked by output rows; each linear's weight is
    re-pointed to its rows of it (a view), so the old tensors are freed."""
    fused = torch.cat([lin.weight for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[start : start + rows], requires_grad=False)
        start += rows
    return fused
