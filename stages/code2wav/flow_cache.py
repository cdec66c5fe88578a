"""Streaming-cache helpers of the flow: the caches' layouts, the trim rule, the conformer trim.

Layouts of one request's caches (the slot pool, `slots.py`, holds them with a row per slot):
* conformer_cnn  [1, C, 6]
* conformer_att  [10, 1, H, 2*t1, 2*d_k]   token-rate layers tiled x2 along time
* estimator_cnn  [n_t, depth, 2, 2*hid, 2] (cond, uncond)
* estimator_att  [n_t, depth, 2, H, L, 2D]

A batch of B rows lays the estimator caches out [cond x B | uncond x B], the CFM's CFG order.
Trim: once a cache holds more than prompt + `prompt_keep_frames` frames it keeps the segments
of `AttKeep.ranges`, written back to back (`chunk_decode.PooledAttSteps` for the estimator,
`trim_conformer_att` for the conformer).

The cache split of seed item 3 (conformer cnn/att + estimator cnn of a B-row chunk back into
the requests' state, batched or per row) is `ChunkDecoder.store_small_caches`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FlowCache:
    """One request's flow caches (a prompt setup's state), or a batch's."""

    conformer_cnn: torch.Tensor
    conformer_att: torch.Tensor
    estimator_cnn: torch.Tensor
    estimator_att: torch.Tensor | None


@dataclass(frozen=True)
class AttKeep:
    """Trim rule: once L > prompt_len + keep_frames keep [0, prompt_len) and [L-keep, L)."""

    prompt_len: int
    keep_frames: int

    def ranges(self, length: int) -> list[tuple[int, int]]:
        """(start, length) segments to keep along the frame axis of a cache of `length`."""
        if length <= self.prompt_len + self.keep_frames:
            return [(0, length)]
        return [(0, self.prompt_len), (length - self.keep_frames, self.keep_frames)]


def trim_conformer_att(att: torch.Tensor, keep: AttKeep, up_rate: int, n_token_layers: int):
    """Bound the conformer cache like the estimator's, respecting the packed layout.

    att: [10, B, H, 2*t1, 2*d_k]. Mel-rate layers keep [0, P) + the newest `keep` frames (old
    first, so that is prompt head + newest history). Token-rate layers hold t1 frames tiled x2;
    they keep [0, P/2) + the newest keep/2 tokens and are re-tiled, so both halves stay equal.
    """
    length = att.shape[3]
    segments = keep.ranges(length)
    if len(segments) == 1:
        return att
    mel = torch.cat([att[n_token_layers:, :, :, s : s + n] for s, n in segments], dim=3)
    tokens = length // up_rate
    tok_keep = AttKeep(keep.prompt_len // up_rate, keep.keep_frames // up_rate)
    tok = att[:n_token_layers, :, :, :tokens]
    tok = torch.cat([tok[:, :, :, s : s + n] for s, n in tok_keep.ranges(tokens)], dim=3)
    return torch.cat([tok.repeat(1, 1, 1, up_rate, 1), mel], dim=0)
