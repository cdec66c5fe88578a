"""The sampling prelude: repetition penalty over the last 16 codes, then temperature.

Two implementations of one function, and the dispatcher that picks between them (seed item 1):
* `penalty_temperature_eager`: the plain-torch reference (14 small kernels per call on an H200);
* the fused Triton twin (`stages.talker.prelude_triton.rep_pen_temp`, `_rep_pen_temp_kernel`):
  one launch for the whole [B, V] batch, bit for bit equal to the reference.
The sampler does not call either per step: it binds the chosen one to its slot buffers once
(`bind_prelude`) and hands the bound step only the logits; for the fused kernel that removes
per-step slicing and checks that cost as much host time as the launch (scripts/bench_prelude.py).

Numerics contract shared by every implementation (so fused == eager bit for bit):
* counts[b, v] = number of valid history slots (slot < history_len[b]) holding code v; integers.
* alpha = pow_table[b, counts[b, v]]: the table penalty**k for k = 0..16 is computed ONCE per
  request at admission (float64 on the host, rounded to fp32), so no path evaluates a
  transcendental per step and both read the very same fp32 factors: exact by construction.
* x = logit < 0 ? logit * alpha : logit / alpha, then x / temperature; IEEE-rounded division.

Switches (both default to the fused path):
* stage extra `talker_codec_fused_prelude` (parsed with the talker's options,
  `TalkerConfig.options.fused_prelude`, and handed to `choose_prelude` by
  `stages.talker.kernels.resolve`): `false` forces the eager chain, e.g. for accuracy triage;
* env `TALKER_CODEC_FUSED_PRELUDE=0` (or `false`): process-wide opt-out to the eager chain, read
  ONCE when this module is imported; a non-boolean value raises at import.
The fused path also needs triton and a CUDA/NPU device (or CPU under TRITON_INTERPRET=1, the
correctness mode), as `stages.platform.triton_unavailable_reason` decides (so a test's
`platform_override(triton=...)` reaches it); otherwise the eager chain is used and one log line
says so. If the kernel
fails to compile or launch, a process-level latch logs one warning and every later call runs
the eager chain (no retry). Nothing here imports triton or touches a device at import time.

    >>> prelude = select_prelude(fused=True, device=torch.device("cpu"))  # no TRITON_INTERPRET
    >>> prelude is penalty_temperature_eager
    True
"""

from __future__ import annotations

import importlib
import logging
import types
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

from stages.flags import read_env_opt_out
from stages.platform import triton_unavailable_reason
from stages.talker.options import FUSED_PRELUDE_ENV

log = logging.getLogger(__name__)

HISTORY_WINDOW = 16
ENV_OPT_OUT = FUSED_PRELUDE_ENV

# Read once at import (not per call, not per construction): flipping the variable later in the
# process changes nothing, which is what "process-wide opt-out" means for a bisect.
_ENV_OPT_OUT: bool = read_env_opt_out(ENV_OPT_OUT)

# Process-level latch: set once when the fused kernel fails to compile or launch; from then on
# every fused call runs the eager chain without trying the kernel again.
_latch_tripped: bool = False
_eager_notes_logged: set[str] = set()
_kernels: types.ModuleType | None = None  # stages.talker.prelude_triton once imported

# (logits [B, V] fp32, history [B, W] int32, history_len [B] int32, pow_table [B, W + 1] fp32,
#  temperature [B] fp32, *, out: [B, V] fp32 contiguous | None) -> [B, V] fp32 (`out` if given)
Prelude = Callable[..., torch.Tensor]


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
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eager penalty + temperature.

    logits: [B, V] fp32, history: [B, W] int32, history_len: [B] int32,
    pow_table: [B, W + 1] fp32 (rows from `penalty_pow_table`), temperature: [B] fp32
    -> [B, V] fp32 (a new tensor, or `out` if given; inputs untouched). The last division
    writes into `out` directly: the same kernel, no extra copy, so both paths stay the same.
    """
    counts = history_counts(history, history_len, logits.shape[1])  # [B, V]
    alpha = torch.gather(pow_table, 1, counts)  # [B, V]
    x = torch.where(logits < 0, logits * alpha, logits / alpha)
    return torch.div(x, temperature[:, None], out=out)


def _kernel_module() -> types.ModuleType:
    """The Triton module, imported on first use (it imports triton; prelude.py must not)."""
    global _kernels
    if _kernels is None:
        _kernels = importlib.import_module("stages.talker.prelude_triton")
    return _kernels


def penalty_temperature_fused(
    logits: torch.Tensor,
    history: torch.Tensor,
    history_len: torch.Tensor,
    pow_table: torch.Tensor,
    temperature: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fused kernel behind the latch; same contract as `penalty_temperature_eager`.

    `out` (optional [B, V] fp32 static buffer, for graph capture) receives the result on either
    path. On the first compile/launch failure this logs ONE warning, trips the process latch and
    returns the eager result; later calls go straight to eager.
    """
    if not _latch_tripped:
        try:
            # `_kernels or ...`: one truth test instead of a call per step once imported.
            kernels = _kernels or _kernel_module()
            return kernels.rep_pen_temp(
                logits, history, history_len, pow_table, temperature, out=out
            )
        except Exception as exc:  # compile errors, launch errors, missing driver: all latch
            _trip_latch(exc)
    return penalty_temperature_eager(
        logits, history, history_len, pow_table, temperature, out=out
    )


def _trip_latch(exc: Exception) -> None:
    """Log ONE warning and switch every fused call of this process to the eager chain."""
    global _latch_tripped
    _latch_tripped = True
    log.warning(
        "fused sampling prelude failed (%s: %s); using the eager penalty + temperature chain "
        "for the rest of this process",
        type(exc).__name__,
        exc,
    )


class PreludeStep(Protocol):
    """A prelude bound to a sampler's slot buffers: logits [R, V] -> rows [:R] of its `out`."""

    def __call__(self, logits: torch.Tensor) -> torch.Tensor: ...


class _BoundRows:
    """Any prelude function called on rows [:R] of the slot buffers (views made once per R)."""

    def __init__(self, fn: Prelude, state: tuple[torch.Tensor, ...]):
        self.fn, self._state = fn, state
        self._rows: dict[int, tuple[torch.Tensor, ...]] = {}

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        rows = logits.shape[0]
        views = self._rows.get(rows)
        if views is None:
            views = self._rows[rows] = tuple(t[:rows] for t in self._state)
        history, history_len, pow_table, temperature, out = views
        return self.fn(logits, history, history_len, pow_table, temperature, out=out)


class _BoundFused:
    """The fused kernel bound to the slot buffers, behind the same process latch."""

    def __init__(self, kernel_step: PreludeStep, eager: _BoundRows):
        self._kernel, self._eager = kernel_step, eager

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not _latch_tripped:
            try:
                return self._kernel(logits)
            except Exception as exc:  # same contract as penalty_temperature_fused
                _trip_latch(exc)
        return self._eager(logits)


def bind_prelude(
    fn: Prelude,
    *,
    history: torch.Tensor,
    history_len: torch.Tensor,
    pow_table: torch.Tensor,
    temperature: torch.Tensor,
    out: torch.Tensor,
) -> PreludeStep:
    """`fn` bound to a sampler's slot buffers ([S, ...], allocated once, written in place).

    `step(logits [R, V])` == `fn(logits, history[:R], history_len[:R], pow_table[:R],
    temperature[:R], out=out[:R])`, bit for bit, on rows R <= S. The fused function binds
    to `prelude_triton.RepPenTempStep` (pointers resolved once; a step checks only the logits);
    any other function gets its row views cached per R. Bind once per state, not per step.
    """
    state = (history, history_len, pow_table, temperature, out)
    if fn is not penalty_temperature_fused:
        return _BoundRows(fn, state)
    eager = _BoundRows(penalty_temperature_eager, state)
    if _latch_tripped:
        return eager
    try:
        kernel_step = (_kernels or _kernel_module()).RepPenTempStep(*state)
    except ValueError:  # mismatched buffers: the caller's bug, not a kernel failure
        raise
    except Exception as exc:  # triton fails to import here: the latch contract applies
        _trip_latch(exc)
        return eager
    return _BoundFused(kernel_step, eager)


class PreludeChoice(NamedTuple):  # a NamedTuple: tests import a private copy of this module
    fn: Prelude  # penalty_temperature_fused or penalty_temperature_eager (or the caller's own)
    reason: str  # what runs and why, as logged


def _eager_because(reason: str) -> PreludeChoice:
    """Log (once per reason per process) that the eager chain is in use, and choose it."""
    if reason not in _eager_notes_logged:
        _eager_notes_logged.add(reason)
        log.info("sampling prelude: eager penalty + temperature chain in use (%s)", reason)
    return PreludeChoice(penalty_temperature_eager, f"eager ({reason})")


def choose_prelude(*, fused: bool, device: torch.device) -> PreludeChoice:
    """The penalty + temperature function to use, and why (`stages.talker.kernels.resolve`).

    fused: the stage extra `talker_codec_fused_prelude` (already parsed, default true). The
    fused path also requires no env opt-out, triton, and a CUDA/NPU device (CPU only under
    TRITON_INTERPRET=1). Call once at construction; never per step.
    """
    if not fused:
        return _eager_because("stage extra talker_codec_fused_prelude is false")
    if _ENV_OPT_OUT:
        return _eager_because(f"{ENV_OPT_OUT} opts out")
    if _latch_tripped:
        return _eager_because("the fused kernel failed earlier in this process")
    reason = triton_unavailable_reason(device)
    if reason is not None:
        return _eager_because(reason)
    log.info("sampling prelude: fused Triton kernel in use (%s)", device.type)
    return PreludeChoice(penalty_temperature_fused, f"fused Triton kernel ({device.type})")


def select_prelude(*, fused: bool, device: torch.device) -> Prelude:
    """`choose_prelude`'s function alone; same signature as the eager one."""
    return choose_prelude(fused=fused, device=device).fn


def _reset_latch_for_tests() -> None:
    """Clear the latch and the once-only log memory (tests only; production never resets)."""
    global _latch_tripped
    _latch_tripped = False
    _eager_notes_logged.clear()
