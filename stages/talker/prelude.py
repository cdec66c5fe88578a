"""The sampling prelude: repetition penalty over the last 16 codes, then temperature.

This module holds the eager reference (`penalty_temperature_eager`). The fused Triton twin and
the dispatcher that picks between them live here too once written (seed item 1).

Numerics contract shared by every implementation (so fused == eager bit for bit):
* counts[b, v] = number of valid history slots (slot < history_len[b]) holding code v; integers.
* alpha = pow_table[b, counts[b, v]]: the table penalty**k for k = 0..16 is computed ONCE per
  request at admission (float64 on the host, rounded to fp32), so no path evaluates a
  transcendental per step and both read the very same fp32 factors: exact by construction.
* x = logit < 0 ? logit * alpha : logit / alpha, then x / temperature; IEEE-rounded division.
"""

from __future__ import annotations

import torch

HISTORY_WINDOW = 16


def penalty_pow_table(penalty: float, window: int = HISTORY_WINDOW) -> torch.Tensor:
    """[window + 1] fp32: penalty**k for k = 0..window, computed in float64 then rounded once."""
    k = torch.arange(window + 1, dtype=torch.float64)
    return torch.pow(torch.tensor(float(penalty), dtype=torch.float64), k).to(torch.float32)


def history_counts(history: torch.Tensor, history_len: torch.Tensor, vocab: int) -> torch.Tensor:
    """Occurrences of each code among the valid history slots.

    history: [B, W] int (slot order irrelevant), history_len: [B] int -> counts [B, vocab] int64.
    """
    window = history.shape[1]
    valid = torch.arange(window, device=history.device)[None, :] < history_len[:, None]  # [B, W]
    counts = torch.zeros(history.shape[0], vocab, dtype=torch.int64, device=history.device)
    # Invalid slots may hold garbage ids: route them to index 0 with weight 0.
    index = torch.where(valid, history.long(), torch.zeros_like(history, dtype=torch.long))
    counts.scatter_add_(1, index, valid.long())
    return counts


def penalty_temperature_eager(
    logits: torch.Tensor,
    history: torch.Tensor,
    history_len: torch.Tensor,
    pow_table: torch.Tensor,
    temperature: torch.Tensor,
) -> torch.Tensor:
    """Eager penalty + temperature.

    logits: [B, V] fp32, history: [B, W] int32, history_len: [B] int32,
    pow_table: [B, W + 1] fp32 (rows from `penalty_pow_table`), temperature: [B] fp32
    -> [B, V] fp32 (a new tensor; inputs untouched).
    """
    counts = history_counts(history, history_len, logits.shape[1])  # [B, V]
    alpha = torch.gather(pow_table, 1, counts)  # [B, V]
    x = torch.where(logits < 0, logits * alpha, logits / alpha)
    return x / temperature[:, None]
