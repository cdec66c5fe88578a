"""Inputs and comparisons shared by the fused-prelude tests (not a test module).

Everything is built on the CPU from a seeded generator and then moved, so a case means the same
numbers on every device. No device is touched at import: callers pass the device in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stages.talker.prelude import HISTORY_WINDOW, penalty_pow_table

VOCAB = 6562  # MiniCPM-o 4.5 codec vocab incl. EOS; not a multiple of the kernel's block
EOS_ID = VOCAB - 1

# Values that break careless kernels: signed zeros, fp32 extremes, subnormals, infinities.
SPECIAL_VALUES = (0.0, -0.0, 3e38, -3e38, 3.4028235e38, 1e-45, -1e-45, 1e-40, -1e-40, float("-inf"))


@dataclass(frozen=True)
class PreludeInputs:
    """The five arguments of the prelude, on one device."""

    logits: torch.Tensor  # [B, V] fp32
    history: torch.Tensor  # [B, W] int32
    history_len: torch.Tensor  # [B] int32
    pow_table: torch.Tensor  # [B, W + 1] fp32
    temperature: torch.Tensor  # [B] fp32

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.logits, self.history, self.history_len, self.pow_table, self.temperature)

    def to(self, device: torch.device) -> PreludeInputs:
        return PreludeInputs(*(t.to(device) for t in self.args()))


def make_inputs(
    *,
    logits: torch.Tensor,
    history: list[list[int]],
    history_len: list[int],
    penalty: list[float],
    temperature: list[float],
) -> PreludeInputs:
    """Explicit case -> inputs; history rows are padded to the window with garbage ids."""
    rows = [row + [VOCAB + 1000 + i for i in range(HISTORY_WINDOW - len(row))] for row in history]
    return PreludeInputs(
        logits=logits.to(torch.float32),
        history=torch.tensor(rows, dtype=torch.int32),
        history_len=torch.tensor(history_len, dtype=torch.int32),
        pow_table=torch.stack([penalty_pow_table(p) for p in penalty]),
        temperature=torch.tensor(temperature, dtype=torch.float32),
    )


def random_inputs(batch: int, seed: int) -> PreludeInputs:
    """A seeded random batch: repeats in the window, garbage past history_len, special values
    (some placed exactly on penalized ids), random penalties and temperatures per row."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, VOCAB, generator=g) * 8.0
    history = torch.randint(0, 40, (batch, HISTORY_WINDOW), generator=g, dtype=torch.int32)
    history_len = torch.randint(0, HISTORY_WINDOW + 1, (batch,), generator=g, dtype=torch.int32)
    # Garbage (even out-of-vocab ids) in invalid slots must be ignored by both paths.
    shape = (batch, HISTORY_WINDOW)
    garbage = torch.randint(-5, VOCAB + 100, shape, generator=g, dtype=torch.int32)
    slots = torch.arange(HISTORY_WINDOW)[None, :]
    history = torch.where(slots < history_len[:, None], history, garbage)
    specials = torch.tensor(SPECIAL_VALUES, dtype=torch.float32)
    for targets in (torch.arange(40), torch.randint(0, VOCAB, (200,), generator=g)):
        pick = torch.randint(0, len(specials), (batch, len(targets)), generator=g)
        hit = torch.rand(batch, len(targets), generator=g) < 0.4
        current = logits[:, targets]
        logits[:, targets] = torch.where(hit, specials[pick], current)
    penalties = torch.tensor([1.0, 1.05, 1.3, 0.8, 2.0])
    temps = torch.tensor([0.8, 1.0, 0.35, 1.7, 0.05])
    pen = penalties[torch.randint(0, len(penalties), (batch,), generator=g)]
    return PreludeInputs(
        logits=logits,
        history=history,
        history_len=history_len,
        pow_table=torch.stack([penalty_pow_table(float(p)) for p in pen]),
        temperature=temps[torch.randint(0, len(temps), (batch,), generator=g)],
    )


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """torch.equal, plus equality of the raw bits (torch.equal calls -0.0 == +0.0)."""
    assert actual.dtype == expected.dtype == torch.float32
    assert actual.shape == expected.shape
    assert torch.equal(actual, expected), _first_mismatch(actual, expected)
    assert torch.equal(actual.view(torch.int32), expected.view(torch.int32)), _first_mismatch(
        actual.view(torch.int32), expected.view(torch.int32)
    )


def _first_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> str:
    diff = (actual != expected).nonzero()
    if len(diff) == 0:
        return "no mismatch found by !="
    r, c = diff[0].tolist()
    return f"{len(diff)} mismatches; first at [{r}, {c}]: {actual[r, c]!r} vs {expected[r, c]!r}"
