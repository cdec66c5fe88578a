"""Deterministic stand-in for the thinker's hidden states (the talker's `h_i`, spec §2.2).

Without a thinker there are no hidden states to condition on, so each text token id gets a
fixed pseudo-random row: N(0, 1) of width `llm_dim`, drawn from a CPU `torch.Generator` seeded
by `blake2b(seed, token id)`. Rows are made lazily per id and memoised (an LRU of a few thousand
rows), so nothing the size of the thinker's 152064 x 4096 table is ever allocated. The scale is
irrelevant: the projected row is L2-normalised before it joins the condition.

    >>> standin_hidden([11, 42, 11], llm_dim=4096, seed=0).shape  # rows 0 and 2 are equal
    torch.Size([3, 4096])
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import torch


@lru_cache(maxsize=4096)
def _row(token_id: int, llm_dim: int, seed: int) -> torch.Tensor:
    key = f"{seed}:{token_id}".encode()
    row_seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
    gen = torch.Generator().manual_seed(row_seed)
    return torch.randn(llm_dim, generator=gen)


def standin_hidden(token_ids: list[int], *, llm_dim: int, seed: int) -> torch.Tensor:
    """[len(token_ids), llm_dim] fp32 on CPU; the same id always gives the same row."""
    if not token_ids:
        return torch.zeros(0, llm_dim)
    return torch.stack([_row(int(t), llm_dim, seed) for t in token_ids])
