"""Per-row codec sampling and the device state transition (spec §2.3, §2.4).

One step for rows 0..R-1 (row == cache slot), all on the device, no host sync:

    x = prelude(logits, history, history_len, pow_table, temperature, out=prelude_out)  # penalty, 1/T
        (bound once to the slot buffers: `CodecSampler.prelude_step`)
    x[EOS] = -inf where step < min_tokens or the row ignores EOS        # stop censoring
    top-k: keep = min(V, max(top_k, min_tokens_to_keep)) largest
    top-p: sort ascending, cumsum of softmax, drop where cum <= 1 - top_p, never the last
           min_tokens_to_keep
    probs = softmax(x); sample = multinomial(probs[r], generator of row r)
    forced EOS where step + 1 >= limit (the length budget), then `advance` (history, emit, ...)

This is vLLM-Omni's order (penalty/temperature -> stop mask -> top-k -> top-p) with HF's
min_tokens_to_keep = 3 floor. `prelude` is one swappable attribute of `CodecSampler`: the fused
Triton twin (seed item 1) replaces exactly the penalty + temperature pair, bit for bit.
Each request owns a `torch.Generator` seeded from its seed, so its codes do not depend on which
other requests share the batch; only the Exp(1) draw of the multinomial loops over rows.

Row state lives in `SamplerState` (device tensors sized max_batch); `admit` writes one row.
The prelude writes into rows of `SamplerState.prelude_out`, a buffer allocated once (the rest of
the step only reads it or edits it in place), and the sampler binds the prelude to the slot
buffers once (`bind_prelude`), so a step hands it only the logits. On an H200 the fused prelude
costs 6-11 us per step called this way and 10-17 us when it allocates its output per call
(D-TALKER-1; `fused` vs `fused_alloc` in its evidence).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stages.platform.device import host_to_device
from stages.talker.config import SamplingConfig
from stages.talker.prelude import (
    Prelude,
    PreludeStep,
    bind_prelude,
    penalty_pow_table,
    penalty_temperature_eager,
)


@dataclass
class SamplerState:
    """Device state of every slot (spec §2.4 `TalkerCodecDeviceState`, batched)."""

    history: torch.Tensor  # [S, W] int32, last W emitted codes, oldest first
    history_len: torch.Tensor  # [S] int32, valid slots of `history`
    step: torch.Tensor  # [S] int32, samples taken so far
    limit: torch.Tensor  # [S] int32, samples allowed incl. the final EOS (= budget + 1)
    ignore_eos: torch.Tensor  # [S] bool, random weights: EOS only at the budget
    pow_table: torch.Tensor  # [S, W + 1] fp32, penalty**k, computed once at admission
    temperature: torch.Tensor  # [S] fp32
    prelude_out: torch.Tensor  # [S, V] fp32, the prelude's output; rows [:R] rewritten each step

    @classmethod
    def allocate(cls, slots: int, window: int, device: torch.device, *, vocab: int) -> SamplerState:
        def zeros(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            history=zeros(slots, window),
            history_len=zeros(slots),
            step=zeros(slots),
            limit=zeros(slots),
            ignore_eos=zeros(slots, dtype=torch.bool),
            pow_table=torch.ones(slots, window + 1, device=device),
            temperature=torch.ones(slots, device=device),
            prelude_out=torch.empty(slots, vocab, device=device),
        )


@dataclass(frozen=True)
class StepResult:
    """One step's outcome per row (device tensors, [R])."""

    sample: torch.Tensor  # int64, the drawn id (EOS when forced)
    emit: torch.Tensor  # bool, the sample is a code to hand on
    finished: torch.Tensor  # bool, the row stopped this step


class CodecSampler:
    """Filters logits and draws one code per active row; owns the prelude attribute."""

    def __init__(self, cfg: SamplingConfig, *, eos_id: int, prelude: Prelude | None = None):
        self.cfg = cfg
        self.eos_id = eos_id
        self.prelude = prelude or penalty_temperature_eager
        self._pow_tables: dict[torch.device, torch.Tensor] = {}  # the config's penalty table per device

    @property
    def prelude(self) -> Prelude:
        """The penalty + temperature function; assigning one re-binds it on the next step."""
        return self._prelude

    @prelude.setter
    def prelude(self, fn: Prelude) -> None:
        self._prelude = fn
        self._bound: tuple[SamplerState, PreludeStep] | None = None

    def prelude_step(self, state: SamplerState) -> PreludeStep:
        """The prelude bound to `state`'s slot buffers (bound on first use per state)."""
        bound = self._bound
        if bound is None or bound[0] is not state:
            step = bind_prelude(
                self._prelude, history=state.history, history_len=state.history_len,
                pow_table=state.pow_table, temperature=state.temperature, out=state.prelude_out,
            )  # fmt: skip
            bound = self._bound = (state, step)
        return bound[1]

    def admit(self, state: SamplerState, slot: int, *, limit: int, ignore_eos: bool) -> None:
        """Reset row `slot` for a new request. Device-side fills and copies only: nothing here
        waits for the talker's queued work."""
        # fill_, not `t[slot] = scalar`: on CUDA that assignment copies a host scalar from
        # pageable memory, which waits for the stream (the talker's queued steps) to drain.
        state.history[slot].zero_()
        state.history_len[slot].fill_(0)
        state.step[slot].fill_(0)
        state.limit[slot].fill_(limit)
        state.ignore_eos[slot].fill_(ignore_eos)
        state.pow_table[slot].copy_(self._pow_table(state.step.device))
        state.temperature[slot].fill_(self.cfg.temperature)

    def _pow_table(self, device: torch.device) -> torch.Tensor:
        """The penalty table every row starts from: the config's, the same for every request, so
        made and copied to `device` once rather than at each admission."""
        table = self._pow_tables.get(device)
        if table is None:
            host = penalty_pow_table(self.cfg.repetition_penalty, self.cfg.history_window)
            table = self._pow_tables[device] = host_to_device(host, device)
        return table

    def filter(self, logits: torch.Tensor, state: SamplerState) -> torch.Tensor:
        """logits: [R, V] fp32 -> filtered fp32 [R, V] (-inf where removed)."""
        r = logits.shape[0]
        x = self.prelude_step(state)(logits)  # rows [:r] of state.prelude_out
        x = mask_eos(x, eos_id=self.eos_id, censor=(state.step[:r] < self.cfg.min_tokens)
                     | state.ignore_eos[:r])
        x = top_k_filter(x, max(self.cfg.top_k, self.cfg.min_tokens_to_keep))
        return top_p_filter(x, self.cfg.top_p, self.cfg.min_tokens_to_keep)

    def sample(
        self,
        logits: torch.Tensor,
        state: SamplerState,
        *,
        active: torch.Tensor,
        generators: list[torch.Generator | None],
    ) -> StepResult:
        """Draw for active rows, force EOS at the limit, advance the state.

        logits: [R, V] fp32; active: [R] bool (device); generators: length R, None exactly for
        the inactive rows (they draw nothing and their state does not move).
        """
        probs = torch.softmax(self.filter(logits, state), dim=-1)
        drawn = draw_rows(probs, generators)
        r = logits.shape[0]
        forced = state.step[:r] + 1 >= state.limit[:r]
        sample = torch.where(forced, torch.full_like(drawn, self.eos_id), drawn)
        return advance(state, sample, active=active, eos_id=self.eos_id)


def mask_eos(x: torch.Tensor, *, eos_id: int, censor: torch.Tensor) -> torch.Tensor:
    """x: [R, V], censor: [R] bool -> x with x[r, eos] = -inf where censor[r].

    In place: `x` is the prelude's output buffer, owned by the sampler and rewritten each step.
    """
    col = x[:, eos_id]
    x[:, eos_id] = torch.where(censor, torch.full_like(col, float("-inf")), col)
    return x


def top_k_filter(x: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the top_k largest per row (ties at the threshold kept); others -> -inf."""
    keep = min(x.shape[-1], top_k)
    threshold = torch.topk(x, keep, dim=-1).values[:, -1:]  # [R, 1]
    return x.masked_fill(x < threshold, float("-inf"))


def top_p_filter(x: torch.Tensor, top_p: float, min_keep: int) -> torch.Tensor:
    """Nucleus filter: drop the low tail whose mass is <= 1 - top_p, keep >= min_keep."""
    sorted_x, order = torch.sort(x, dim=-1, descending=False)
    cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
    remove = cum <= 1 - top_p
    remove[:, -min_keep:].fill_(False)  # not `= False`: a host scalar copy waits for the stream
    mask = torch.zeros_like(remove).scatter(-1, order, remove)
    return x.masked_fill(mask, float("-inf"))


def draw_rows(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """probs: [R, V] -> [R] int64; row r drawn with its own generator (0 for free rows).

    Each request owns its generator, so its draws do not depend on its batch mates (the
    continuous-batching determinism guarantee). This is `torch.multinomial(probs[r:r+1], 1,
    generator=g)` unrolled: torch samples one id as argmax(p / q) with q ~ Exp(1) drawn from
    the generator; we draw each row's q with its own generator (one kernel per row) and take
    one batched argmax, instead of four kernels per row. Same draws, same ids (tested).
    """
    q = torch.ones_like(probs)
    for r, gen in enumerate(generators):
        if gen is not None:
            q[r].exponential_(1.0, generator=gen)
    return torch.argmax(probs / q, dim=-1)


def advance(
    state: SamplerState, sample: torch.Tensor, *, active: torch.Tensor, eos_id: int
) -> StepResult:
    """Spec §2.4 transition for rows 0..R-1. sample: [R] int64, active: [R] bool."""
    r = sample.shape[0]
    step = state.step[:r]
    is_eos = sample == eos_id
    reached = active & (step + 1 >= state.limit[:r])
    finished = active & (is_eos | reached)
    emit = active & ~is_eos & ~reached
    state.step[:r] = torch.where(active, step + 1, step)
    push_history(state, sample, emit)
    return StepResult(sample=sample, emit=emit, finished=finished)


def push_history(state: SamplerState, sample: torch.Tensor, emit: torch.Tensor) -> None:
    """Append `sample` where `emit`: write at history_len while < W, else shift left, write W-1."""
    r = sample.shape[0]
    hist, hlen = state.history[:r], state.history_len[:r]
    window = hist.shape[1]
    full = hlen >= window
    shifted = torch.where(full[:, None], torch.roll(hist, -1, dims=1), hist)
    pos = torch.clamp(hlen, max=window - 1).long()  # full rows write the last slot
    written = shifted.scatter(1, pos[:, None], sample.to(hist.dtype)[:, None])
    state.history[:r] = torch.where(emit[:, None], written, hist)
    state.history_len[:r] = torch.clamp(hlen + emit.to(hlen.dtype), max=window)
