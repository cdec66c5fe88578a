"""The flow-cache split workload of `tts-bench profile`: storing a B-row chunk's caches.

What the two split modes (`code2wav.extra.code2wav_batched_cache_split`) differ in is storing
a B-row chunk's conformer cnn/att and estimator cnn caches into the rows' pool slots: one
`index_copy_` per row and tensor (4 per row, the estimator's cond and uncond halves apart) or
3 in all when batched. The estimator attention stores of every Euler step are batched in both.
The inputs are the prompt's caches grown one chunk past prompt + keep frames, so every store
trims to two segments, as in steady state.

    counts = count_cache_split(t2w, 8, chunks=3)   # {"cache_split": ..., "cache_split_total": ...}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from stages.code2wav.chunk_decode import PooledAttSteps, store_small_caches
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.flow import EncodedChunk
from stages.code2wav.flow_cache import AttKeep, trim_conformer_att
from stages.code2wav.token2wav import Token2Wav
from stages.config import StageConfig
from stages.profiling.launches import WARMUP, LaunchCount, count_launches

SPLIT_FLAG = "code2wav_batched_cache_split"


def split_mode(cfg: Code2WavConfig) -> str:
    """"batched" or "per-row": the cache split the stage config asks for."""
    return "batched" if cfg.options.batched_cache_split else "per-row"


def with_split(stages: StageConfig, batched: bool) -> StageConfig:
    """`stages` with the cache-split flag set (for tests and ad-hoc A/Bs)."""
    extra = {**stages.code2wav.extra, SPLIT_FLAG: batched}
    return replace(stages, code2wav=replace(stages.code2wav, extra=extra))


@dataclass
class StoreInputs:
    """A steady B-row chunk's new caches, as the flow and CFM hand them to the slot pool."""

    keep: AttKeep  # the steady keep ranges (prompt head + newest frames)
    batched: bool  # the split mode measured
    slots: torch.Tensor  # [B] pool slots (taken for the measurement, released after)
    pairs: torch.Tensor  # [2B] estimator rows of those slots
    encoded: EncodedChunk  # conformer caches, one chunk longer than the keep (so they trim)
    estimator_cnn: torch.Tensor  # [n_t, depth, 2B, 2*hidden, 2]
    step_buffer: torch.Tensor  # [depth, 2B, H, prompt + keep + chunk, 2D]: one Euler step's


def steady_store_inputs(t2w: Token2Wav, rows: int, *, batched: bool) -> StoreInputs:
    """The inputs of the cache split at the steady shapes, from the prompt's caches grown by
    one chunk past prompt + keep frames (so the stores trim to two segments, as in steady
    state). The split mode is `batched`."""
    setup = t2w.prompt_setup()
    cfg, one = t2w.cfg, setup.cache
    full = setup.prompt_len + cfg.prompt_keep_frames + cfg.chunk_mel_frames
    pool = t2w.pool
    slot_list = [pool.acquire() for _ in range(rows)]
    slots = torch.tensor(slot_list, device=t2w.device)
    att = _grow(one.conformer_att, 3, full).expand(-1, rows, -1, -1, -1).contiguous()
    cnn = one.conformer_cnn.expand(rows, -1, -1).contiguous()
    ecnn = one.estimator_cnn.repeat_interleave(rows, dim=2)  # [cond x B | uncond x B]
    step = _grow(one.estimator_att[0], 3, full).repeat_interleave(rows, dim=1)
    keep = AttKeep(setup.prompt_len, cfg.prompt_keep_frames)
    return StoreInputs(keep, batched, slots, pool.pair_index(slots), EncodedChunk(None, cnn, att), ecnn, step)


def _grow(t: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """`t` with axis `dim` extended to `length` (zeros after the original frames)."""
    shape = list(t.shape)
    if shape[dim] >= length:
        return t
    shape[dim] = length
    out = t.new_zeros(shape)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


def count_cache_split(
    t2w: Token2Wav, rows: int, chunks: int, *, batched: bool | None = None
) -> dict[str, LaunchCount]:
    """Launches of the flow-cache split of `rows` rows into the slot pool (`batched=None`: the
    arm's split mode): `cache_split` = the part the two modes differ in (conformer cnn/att and
    estimator cnn: 4 per row, or 3 in all), `cache_split_total` = that plus the estimator
    attention stores of every Euler step, which both modes share."""
    batched = t2w.options.batched_cache_split if batched is None else batched
    x = steady_store_inputs(t2w, rows, batched=batched)
    att = PooledAttSteps(t2w.pool["estimator_att"], x.pairs, x.step_buffer.shape[3] - t2w.cfg.chunk_mel_frames,
                         x.keep, store=True)

    f = t2w.cfg.flow
    trimmed = trim_conformer_att(x.encoded.att_cache, x.keep, f.up_rate, f.num_blocks)

    def small() -> None:
        store_small_caches(t2w.pool.tensors, x.slots, x.pairs, x.encoded.cnn_cache, trimmed, x.estimator_cnn,
                           batched=x.batched)

    def total() -> None:
        small()
        for i in range(t2w.cfg.n_timesteps):
            att.store(i, x.step_buffer)

    try:
        return {
            "cache_split": count_launches(_inference(small), device=t2w.device, repeats=chunks, warmup=WARMUP),
            "cache_split_total": count_launches(_inference(total), device=t2w.device, repeats=chunks, warmup=WARMUP),
        }
    finally:
        for s in x.slots.tolist():
            t2w.pool.release(s)


def _inference(fn: Callable[[], object]) -> Callable[[], object]:
    # Token2Wav splits under inference mode; profiling outside it would add autograd bookkeeping.
    def run() -> object:
        with torch.inference_mode():
            return fn()

    return run
