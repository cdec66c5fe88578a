"""The flow (`CausalMaskedDiffWithXvec`): token embedding + encoder + projection + CFM decoder.

Owns exactly the parameters of the official `flow.pt` (605 keys at full size): `input_embedding`,
`spk_embed_affine_layer`, `encoder.*`, `encoder_proj`, `decoder.estimator.*`. The streaming
step (`encode_chunk` + `decoder.solve`) and the non-streaming reference (`reference_mel`) share
every module; the reference differs only in running one forward with block-causal masks.

    flow = FlowModel(cfg)
    spk = flow.project_speaker(embedding)            # [1, 80], computed once per prompt
    enc = flow.encode_chunk(tokens, cnn, att, last_chunk=False)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stages.code2wav.cfm import CausalCFM
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.flow_encoder import UpsampleConformerEncoderV2, block_causal_mask


@dataclass
class EncodedChunk:
    mu: torch.Tensor  # [B, 80, T_mel]
    cnn_cache: torch.Tensor  # [B, C, 6]
    att_cache: torch.Tensor  # [10, B, H, 2*t1, 2*d_k]


class FlowModel(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        fc = cfg.flow
        self.input_embedding = nn.Embedding(fc.vocab_size, fc.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.speaker.embedding_dim, fc.output_size)
        self.encoder = UpsampleConformerEncoderV2(fc)
        self.encoder_proj = nn.Linear(fc.input_size, fc.output_size)
        self.decoder = CausalCFM(cfg)

    def project_speaker(self, embedding: torch.Tensor) -> torch.Tensor:
        """[192] -> [1, 80]. One row, always: a GEMM with M = 1 gives the same bits whatever
        the batch size, so callers expand this row instead of projecting per row."""
        emb = F.normalize(embedding.reshape(1, -1).to(self.encoder_proj.weight.dtype), dim=1)
        return self.spk_embed_affine_layer(emb)

    def encode_chunk(
        self,
        tokens: torch.Tensor,  # [B, T] codes (incl. 3 lookahead unless last_chunk)
        cnn_cache: torch.Tensor | None,
        att_cache: torch.Tensor | None,
        *,
        last_chunk: bool,
    ) -> EncodedChunk:
        out = self.encoder.forward_chunk(
            self.input_embedding(tokens), cnn_cache, att_cache, last_chunk=last_chunk
        )
        mu = self.encoder_proj(out.hidden).transpose(1, 2).contiguous()
        return EncodedChunk(mu, out.cnn_cache, out.att_cache)

    @torch.no_grad()
    def reference_mel(
        self,
        tokens: torch.Tensor,  # [1, N]: prompt tokens, 3 silence, then all codes
        prompt_mel: torch.Tensor,  # [1, 80, 2*Tp]
        spk: torch.Tensor,  # [1, 80]
        token_blocks: list[int],  # emitted tokens per streaming step (prompt first)
    ) -> torch.Tensor:
        """Non-streaming reference: one encoder forward + one CFM solve over prompt and codes,
        with the block-causal masks the streaming run implies. Returns the generated mel
        [1, 80, 2*(N-Tp)] (prompt frames dropped). The whole input is one last chunk."""
        up = self.cfg.flow.up_rate
        device = tokens.device
        token_mask = block_causal_mask(token_blocks, device)
        out = self.encoder.forward_chunk(
            self.input_embedding(tokens), None, None, last_chunk=True, token_mask=token_mask
        )
        mu = self.encoder_proj(out.hidden).transpose(1, 2)
        prompt_frames = prompt_mel.shape[2]
        cond = torch.zeros_like(mu)
        cond[:, :, :prompt_frames] = prompt_mel
        mel_mask = block_causal_mask([n * up for n in token_blocks], device)
        solved = self.decoder.solve(mu, spk, cond, cnn_cache=None, att_cache=None, mask=mel_mask)
        return solved.mel[:, :, prompt_frames:]
