"""Flow encoder (`UpsampleConformerEncoderV2`, spec §4.3): codec tokens -> 50 Hz hidden frames.

Pipeline per chunk: `embed` (Linear + LayerNorm + x sqrt(d) + ESPnet rel-pos table) ->
`pre_lookahead_layer` (conv1 k=4 eats 3 right-context tokens, conv2 k=3 causal) -> 6 conformer
layers at token rate -> `up_layer` (nearest x2 + causal conv k=5) -> `up_embed` -> 4 conformer
layers at mel rate -> `after_norm`.

Streaming state, in the checkpoint's packed layout so caches stack and split like upstream:
* `cnn_cache` [B, C, 6]: frames 0:2 = pre-lookahead conv2 history, 2:6 = upsample-conv history.
* `att_cache` [10, B, H, 2*t1, 2*d_k]: layers 0-5 hold t1 token-rate frames *tiled twice* along
  time so all ten layers share one axis; layers 6-9 hold 2*t1 mel-rate frames. Last dim = [K|V].
  Old frames first (wenet convention): the new chunk's K/V is appended at the end.

Parameter names match the official `flow.pt` (`encoder.embed.out.0.weight`, ...), so the
checkpoint loads with `strict=True` and no rename.

    enc = UpsampleConformerEncoderV2(FlowEncoderConfig())
    out = enc.forward_chunk(xs, cnn_cache=None, att_cache=None, last_chunk=False)
    # out.hidden: [B, 2*(T-3), 512]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stages.code2wav.config import FlowEncoderConfig

# Upstream constants of the wenet/ESPnet blocks (not dims): LayerNorm eps values.
_EMBED_LN_EPS = 1e-5
_LAYER_LN_EPS = 1e-12
_PRE_LOOKAHEAD_CONV2_KERNEL = 3
_LEAKY_SLOPE = 0.01


class RelPositionTable:
    """ESPnet relative positional table (`EspnetRelPositionalEncoding`), no parameters.

    Holds 2*max_len-1 sinusoids for relative distances +(max_len-1) .. -(max_len-1); a plain
    attribute, not a buffer, so it never appears in the state dict (like upstream). Copies per
    (device, dtype) are cached so a forward never rebuilds it.
    """

    def __init__(self, d_model: int, max_len: int) -> None:
        self.d_model, self.max_len = d_model, max_len
        # Built on the CPU explicitly: a model constructed under `with torch.device("meta")`
        # must still get a real table (it is not in the checkpoint to be loaded later).
        cpu = torch.device("cpu")
        position = torch.arange(max_len, dtype=torch.float32, device=cpu).unsqueeze(1)
        div_term = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32, device=cpu)
            * -(math.log(10000.0) / d_model)
        )
        pos = torch.zeros(max_len, d_model, device=cpu)
        neg = torch.zeros(max_len, d_model, device=cpu)
        pos[:, 0::2] = torch.sin(position * div_term)
        pos[:, 1::2] = torch.cos(position * div_term)
        neg[:, 0::2] = torch.sin(-position * div_term)
        neg[:, 1::2] = torch.cos(-position * div_term)
        self._pe = torch.cat([torch.flip(pos, [0]), neg[1:]], dim=0).unsqueeze(0)
        self._copies: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def window(self, size: int, like: torch.Tensor) -> torch.Tensor:
        """Relative encodings for `size` keys: [1, 2*size-1, D] centred on distance 0."""
        if size > self.max_len:
            raise ValueError(
                f"error: flow encoder needs {size} rel-pos frames, table holds {self.max_len} "
                "(flow.max_relpos_len); split the request into shorter encode slices"
            )
        key = (like.device, like.dtype)
        pe = self._copies.get(key)
        if pe is None:
            pe = self._pe.to(device=like.device, dtype=like.dtype)
            self._copies[key] = pe
        centre = pe.shape[1] // 2
        return pe[:, centre - size + 1 : centre + size]


class LinearEmbed(nn.Module):
    """`embed` / `up_embed`: Linear + LayerNorm (keys out.0, out.1), then x sqrt(d)."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=_EMBED_LN_EPS))
        self.xscale = math.sqrt(odim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, idim]
        return self.out(x) * self.xscale


class RelPosSelfAttention(nn.Module):
    """Rel-pos MHSA (Transformer-XL style, pos_bias_u/v, linear_pos without bias)."""

    def __init__(self, n_head: int, n_feat: int) -> None:
        super().__init__()
        self.h, self.d_k = n_head, n_feat // n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.empty(self.h, self.d_k))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)

    @staticmethod
    def _rel_shift(x: torch.Tensor) -> torch.Tensor:
        # x: [B, H, Tq, 2*Tk-1] -> [B, H, Tq, Tk] with entry (i, j) = distance (offset+i) - j.
        # The pad/view trick also holds for Tq < Tk (a chunk against its cache).
        b, h, tq, width = x.shape
        padded = torch.cat([x.new_zeros(b, h, tq, 1), x], dim=-1).view(b, h, width + 1, tq)
        return padded[:, :, 1:].view_as(x)[:, :, :, : width // 2 + 1]

    def forward(
        self,
        x: torch.Tensor,  # [B, T, C]
        pos_emb: torch.Tensor,  # [1, 2*(L+T)-1, C]
        cache: torch.Tensor | None,  # [B, H, L, 2*d_k] old-first
        mask: torch.Tensor | None,  # [B|1, T, L+T] bool, True = attend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)
        k = self.linear_k(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        if cache is not None and cache.shape[2] > 0:
            k_cache, v_cache = cache.split(self.d_k, dim=-1)
            k = torch.cat([k_cache, k], dim=2)
            v = torch.cat([v_cache, v], dim=2)
        new_cache = torch.cat([k, v], dim=-1)
        p = self.linear_pos(pos_emb).view(1, -1, self.h, self.d_k).transpose(1, 2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        bd = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        if bd.shape != ac.shape:
            bd = self._rel_shift(bd)
        scores = (ac + bd) / math.sqrt(self.d_k)
        if mask is not None:
            blocked = ~mask.unsqueeze(1)
            attn = torch.softmax(scores.masked_fill(blocked, -float("inf")), dim=-1)
            attn = attn.masked_fill(blocked, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, self.h * self.d_k)
        return self.linear_out(out), new_cache


class FeedForward(nn.Module):
    """Position-wise FFN, SiLU (keys w_1, w_2)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.w_2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerLayer(nn.Module):
    """Pre-LN conformer layer without conv module or macaron FFN (as in this checkpoint)."""

    def __init__(self, cfg: FlowEncoderConfig) -> None:
        super().__init__()
        d = cfg.input_size
        self.self_attn = RelPosSelfAttention(cfg.attention_heads, d)
        self.feed_forward = FeedForward(d, cfg.linear_units)
        self.norm_ff = nn.LayerNorm(d, eps=_LAYER_LN_EPS)
        self.norm_mha = nn.LayerNorm(d, eps=_LAYER_LN_EPS)

    def forward(self, x, pos_emb, cache, mask):  # x: [B, T, C]
        att, new_cache = self.self_attn(self.norm_mha(x), pos_emb, cache, mask)
        x = x + att
        x = x + self.feed_forward(self.norm_ff(x))
        return x, new_cache


class PreLookahead(nn.Module):
    """conv1 (k = lookahead+1, valid) -> leaky_relu -> conv2 (k=3, causal, 2-frame cache) + x."""

    def __init__(self, channels: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=_PRE_LOOKAHEAD_CONV2_KERNEL)

    @property
    def cache_frames(self) -> int:
        return _PRE_LOOKAHEAD_CONV2_KERNEL - 1

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, T, C] (T includes the lookahead frames); cache: [B, C, 2]
        h = F.leaky_relu(self.conv1(x.transpose(1, 2)), _LEAKY_SLOPE)
        h = torch.cat([cache, h], dim=2)
        # Taken from the concatenation (not from h alone) so a 1-frame chunk keeps 2 frames.
        new_cache = h[:, :, -self.cache_frames :]
        out = self.conv2(h).transpose(1, 2)
        return out + x[:, : -self.lookahead], new_cache


class Upsample1D(nn.Module):
    """Nearest x stride, then a causal conv k = 2*stride+1 with a 2*stride-frame cache."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, stride * 2 + 1)

    @property
    def cache_frames(self) -> int:
        return self.stride * 2

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, C, T]; cache: [B, C, 2*stride]
        up = torch.cat([cache, x.repeat_interleave(self.stride, dim=2)], dim=2)
        return self.conv(up), up[:, :, -self.cache_frames :]


@dataclass
class EncoderChunkOut:
    hidden: torch.Tensor  # [B, T_mel, C]
    cnn_cache: torch.Tensor  # [B, C, 6]
    att_cache: torch.Tensor  # [L6+L4, B, H, 2*t1, 2*d_k]


class UpsampleConformerEncoderV2(nn.Module):
    """The flow encoder; `forward_chunk` is the streaming step, a mask gives the reference."""

    def __init__(self, cfg: FlowEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.input_size
        self.embed = LinearEmbed(d, d)
        self.pre_lookahead_layer = PreLookahead(d, cfg.pre_lookahead_len)
        self.encoders = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.num_blocks))
        self.up_layer = Upsample1D(d, cfg.up_rate)
        self.up_embed = LinearEmbed(d, d)
        self.up_encoders = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.num_up_blocks))
        self.after_norm = nn.LayerNorm(d, eps=_EMBED_LN_EPS)
        self.pos_table = RelPositionTable(d, cfg.max_relpos_len)

    @property
    def cnn_cache_frames(self) -> int:
        return self.pre_lookahead_layer.cache_frames + self.up_layer.cache_frames

    def empty_caches(self, batch: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv history and an empty attention cache (a fresh stream)."""
        c, h, dk = self.cfg.input_size, self.cfg.attention_heads, self.cfg.head_dim
        layers = self.cfg.num_blocks + self.cfg.num_up_blocks
        cnn = like.new_zeros(batch, c, self.cnn_cache_frames)
        att = like.new_zeros(layers, batch, h, 0, 2 * dk)
        return cnn, att

    def forward_chunk(
        self,
        xs: torch.Tensor,  # [B, T, C] embedded tokens, incl. 3 lookahead tokens unless last
        cnn_cache: torch.Tensor | None,  # [B, C, 6]
        att_cache: torch.Tensor | None,  # [10, B, H, 2*t1, 2*d_k]
        *,
        last_chunk: bool,
        token_mask: torch.Tensor | None = None,  # [B|1, T', t1+T'] bool (reference path only)
    ) -> EncoderChunkOut:
        if cnn_cache is None or att_cache is None:
            cnn_cache, att_cache = self.empty_caches(xs.shape[0], xs)
        n_low = len(self.encoders)
        pre_frames = self.pre_lookahead_layer.cache_frames
        offset1 = att_cache.shape[3] // 2
        xs = self.embed(xs)
        if last_chunk:  # no more right context will come: zeros stand in for it
            xs = F.pad(xs, (0, 0, 0, self.cfg.pre_lookahead_len))
        xs, new_cnn1 = self.pre_lookahead_layer(xs, cnn_cache[:, :, :pre_frames])
        pos = self.pos_table.window(offset1 + xs.shape[1], xs)
        new_att1 = []
        for i, layer in enumerate(self.encoders):
            xs, c = layer(xs, pos, att_cache[i, :, :, :offset1], token_mask)
            new_att1.append(c)
        up, new_cnn2 = self.up_layer(xs.transpose(1, 2), cnn_cache[:, :, pre_frames:])
        # A transposed view, where upstream makes it contiguous first: at full width the CPU's GEMM
        # then sums in another order (2.4e-6 apart at full width, measured by swapping it alone;
        # the whole flow: results/cpu/official_deviation_full.json).
        xs = self.up_embed(up.transpose(1, 2))
        stride = self.up_layer.stride
        pos = self.pos_table.window(offset1 * stride + xs.shape[1], xs)
        mel_mask = None
        if token_mask is not None:
            mel_mask = token_mask.repeat_interleave(stride, 1).repeat_interleave(stride, 2)
        new_att2 = []
        for i, layer in enumerate(self.up_encoders):
            xs, c = layer(xs, pos, att_cache[n_low + i], mel_mask)
            new_att2.append(c)
        # Token-rate caches are tiled x2 on time so all layers share one packed tensor.
        low = torch.stack(new_att1).repeat(1, 1, 1, stride, 1)
        return EncoderChunkOut(
            hidden=self.after_norm(xs),
            cnn_cache=torch.cat([new_cnn1, new_cnn2], dim=2),
            att_cache=torch.cat([low, torch.stack(new_att2)], dim=0),
        )


def block_causal_mask(block_sizes: list[int], device: torch.device) -> torch.Tensor:
    """[1, N, N] bool mask: frame i attends to every frame of its own block and earlier blocks.

    This is what streaming implies (a chunk sees itself in full and its cache), so a one-shot
    forward under this mask is the non-streaming reference of a chunked run.
    """
    ids = torch.repeat_interleave(
        torch.arange(len(block_sizes), device=device),
        torch.tensor(block_sizes, device=device),
    )
    return (ids.unsqueeze(1) >= ids.unsqueeze(0)).unsqueeze(0)
