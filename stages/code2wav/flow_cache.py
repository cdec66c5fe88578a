"""Per-request flow caches: stack B requests into one batch, split a batch back into rows, trim.

Layouts (per request -> stacked over B rows):
* conformer_cnn  [1, C, 6]                 -> [B, C, 6]                 (cat dim 0)
* conformer_att  [10, 1, H, 2*t1, 2*d_k]   -> [10, B, H, 2*t1, 2*d_k]   (cat dim 1)
* estimator_cnn  [n_t, depth, 2, 2*hid, 2] -> [n_t, depth, 2B, ...]     ([cond x B | uncond x B])
* estimator_att  [n_t, depth, 2, H, L, 2D] -> [n_t, depth, 2B, ...]     (same CFG order)

Split, two implementations behind the strict stage flag `code2wav_batched_cache_split`
(default true), byte-identical results:
* per-row (reference): 3 launches per row — conformer_cnn[r:r+1].clone(),
  conformer_att[:, r:r+1].clone(), cat([ecnn[:, :, r], ecnn[:, :, B + r]], dim=2).
* batched: 3 launches per batch — the conformer caches by one `.clone()` each (their row order
  is the identity, where an `index_select` would be a disguised copy; a non-identity order uses
  `index_select`), estimator_cnn by ONE `index_select` over the cached CFG-interleaved order
  [0, B, 1, B+1, ...]; rows are then views ([r:r+1], [:, r:r+1], [:, :, 2r:2r+2]).
  The copies allocate fresh storage, so rows never alias a captured graph's output buffers.

LIFETIME (batched split): each request's rows are *views into one B-row buffer*. A request that
drops out of later batches (finished, or decoded in another group) keeps its chunk's whole
B-row buffer alive until its own next chunk replaces the view. The "at most one extra chunk of
cache memory" bound therefore holds only when a chunk's rows advance together; ragged traffic
can pin up to one buffer per distinct chunk still referenced.

estimator_att is always split per request, with the trim applied during the copy
(`copy_att_rows`): segments [0, prompt_len) and [L - keep, L) are written back to back into a
preallocated tensor, never materialising a trimmed batch.

Streaming decode skips the stack/split of estimator_att altogether (`StepwiseAttCache`): the CFM
reads each request's step-i cache straight into one reused step buffer, runs step i, and writes
the trimmed step-i result back per request — in place once the cache is saturated (same
shape). No B-row copy of the whole [n_t, ...] cache ever exists, so a decode's transient peak is
one step's buffer instead of ~3 generations (stacked input + untrimmed output + split rows).

    batch = stack_flow_cache(states)
    rows = split_flow_cache(new_batch, len(states), batched=True, att_keep=keep)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FlowCache:
    conformer_cnn: torch.Tensor
    conformer_att: torch.Tensor
    estimator_cnn: torch.Tensor
    estimator_att: torch.Tensor | None  # None only in a stack built without it


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


def stack_flow_cache(states: list[FlowCache], *, include_estimator_att: bool = True) -> FlowCache:
    """Per-request caches -> one B-row batch (estimator caches in [cond x B | uncond x B]).

    `include_estimator_att=False` leaves it None (the caller feeds it by `StepwiseAttCache`)."""
    ecnn = [s.estimator_cnn for s in states]
    eatt = None
    if include_estimator_att:
        rows = [s.estimator_att for s in states]
        eatt = torch.cat([e[:, :, 0:1] for e in rows] + [e[:, :, 1:2] for e in rows], 2)
    return FlowCache(
        conformer_cnn=torch.cat([s.conformer_cnn for s in states], dim=0),
        conformer_att=torch.cat([s.conformer_att for s in states], dim=1),
        estimator_cnn=torch.cat([e[:, :, 0:1] for e in ecnn] + [e[:, :, 1:2] for e in ecnn], 2),
        estimator_att=eatt,
    )


class StepwiseAttCache:
    """Per-request estimator attention caches, fed to the CFM one Euler step at a time.

    rows[r]: [n_t, depth, 2, H, L, 2D] (cond, uncond). Step i reads only rows[r][i], so
    `load(i, buf)` copies those into the step buffer's tail and `store(i, buf)` writes the step's
    trimmed new cache into rows' destination slice i. A destination is the source row itself when
    `owned[r]` (no one else holds it) and the trimmed length equals L (saturated steady state):
    slice i was consumed by `load(i)` and later steps read only later slices, so overwriting it
    is safe. Otherwise a fresh row is allocated. Bytes equal `copy_att_rows` of the batch output.

    LANDMINE: the in-place update mutates a request's previous estimator_att; never pass
    `owned=True` for a tensor shared with anything else (the prompt setup cache, a test's copy).
    """

    def __init__(
        self, rows: list[torch.Tensor], *, keep: AttKeep | None, store: bool, owned: list[bool]
    ) -> None:
        assert len(rows) == len(owned) and rows, "one ownership flag per row"
        self._src: list[torch.Tensor] = list(rows)
        self._owned = list(owned)
        self._keep, self._store = keep, store
        self._dst: list[torch.Tensor | None] = [None] * len(rows)
        self.length = rows[0].shape[4]

    def load(self, step: int, buf: torch.Tensor) -> None:
        # buf: [depth, 2B, H, T+L, 2D]; fills [..., T:, :] in the [cond x B | uncond x B] order
        b, frames = len(self._src), buf.shape[3] - self.length
        for r, src in enumerate(self._src):
            buf[:, r, :, frames:].copy_(src[step, :, 0])
            buf[:, b + r, :, frames:].copy_(src[step, :, 1])

    def store(self, step: int, buf: torch.Tensor) -> None:
        # buf: [depth, 2B, H, T+L, 2D] holding step `step`'s new caches
        if not self._store:
            return
        b, length = len(self._src), buf.shape[3]
        segments = [(0, length)] if self._keep is None else self._keep.ranges(length)
        kept = sum(n for _, n in segments)
        for r, src in enumerate(self._src):
            dst = self._dst[r]
            if dst is None:
                in_place = self._owned[r] and src.shape[4] == kept
                dst = src if in_place else src.new_empty(*src.shape[:4], kept, src.shape[5])
                self._dst[r] = dst
            pos = 0
            for start, n in segments:
                dst[step, :, 0, :, pos : pos + n].copy_(buf[:, r, :, start : start + n])
                dst[step, :, 1, :, pos : pos + n].copy_(buf[:, b + r, :, start : start + n])
                pos += n

    def finish(self) -> list[torch.Tensor]:
        """The per-request new caches; drops the references to the old ones."""
        assert self._store and all(d is not None for d in self._dst), "store() ran every step"
        self._src = []
        return self._dst  # type: ignore[return-value]


_ORDERS: dict[tuple[str, int, torch.device], torch.Tensor] = {}


def cfg_interleaved_order(rows: int, device: torch.device) -> torch.Tensor:
    """[0, B, 1, B+1, ...]: estimator rows of request r land at 2r (cond) and 2r+1 (uncond).

    Cached per (B, device) so steady decoding never builds (or uploads) an index tensor.
    """
    key = ("cfg", rows, device)
    order = _ORDERS.get(key)
    if order is None:
        order = torch.arange(2 * rows).view(2, rows).t().reshape(-1).to(device)
        _ORDERS[key] = order
    return order


def _select_rows(t: torch.Tensor, dim: int, order: torch.Tensor | None) -> torch.Tensor:
    # identity order -> a clone is the honest equivalent of index_select (one copy launch).
    return t.clone() if order is None else t.index_select(dim, order)


def copy_att_rows(att: torch.Tensor, rows: int, keep: AttKeep | None) -> list[torch.Tensor]:
    """[n_t, depth, 2B, H, L, 2D] -> per request [n_t, depth, 2, H, L', 2D], trimmed in the copy."""
    n_t, depth, _, heads, length, width = att.shape
    segments = [(0, length)] if keep is None else keep.ranges(length)
    kept = sum(n for _, n in segments)
    out = []
    for r in range(rows):
        dst = att.new_empty(n_t, depth, 2, heads, kept, width)
        pos = 0
        for start, n in segments:
            dst[:, :, 0, :, pos : pos + n].copy_(att[:, :, r, :, start : start + n])
            dst[:, :, 1, :, pos : pos + n].copy_(att[:, :, rows + r, :, start : start + n])
            pos += n
        out.append(dst)
    return out


def _split_per_row(batch: FlowCache, rows: int) -> list[tuple[torch.Tensor, ...]]:
    ecnn = batch.estimator_cnn
    return [
        (
            batch.conformer_cnn[r : r + 1].clone(),
            batch.conformer_att[:, r : r + 1].clone(),
            torch.cat([ecnn[:, :, r : r + 1], ecnn[:, :, rows + r : rows + r + 1]], dim=2),
        )
        for r in range(rows)
    ]


def _split_batched(
    batch: FlowCache, rows: int, conformer_order: torch.Tensor | None
) -> list[tuple[torch.Tensor, ...]]:
    cnn = _select_rows(batch.conformer_cnn, 0, conformer_order)
    att = _select_rows(batch.conformer_att, 1, conformer_order)
    ecnn = batch.estimator_cnn.index_select(2, cfg_interleaved_order(rows, batch.estimator_cnn.device))
    return [
        (cnn[r : r + 1], att[:, r : r + 1], ecnn[:, :, 2 * r : 2 * r + 2]) for r in range(rows)
    ]


def split_small_caches(
    batch_cache: FlowCache,
    rows: int,
    *,
    batched: bool,
    conformer_order: torch.Tensor | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The part the two implementations differ in: (conformer_cnn, conformer_att,
    estimator_cnn) per row. 3B launches per-row, 3 launches batched."""
    if batched:
        return _split_batched(batch_cache, rows, conformer_order)
    if conformer_order is not None:
        raise ValueError("conformer_order is only supported by the batched split")
    return _split_per_row(batch_cache, rows)


def split_flow_cache(
    batch_cache: FlowCache,
    rows: int,
    *,
    batched: bool,
    att_keep: AttKeep | None = None,
    conformer_order: torch.Tensor | None = None,
) -> list[FlowCache]:
    """One B-row batch -> B per-request caches. Both modes give byte-identical tensors.

    `conformer_order` (default: identity) maps output row r to batch row order[r] for the
    conformer caches; `None` means the identity and costs a clone instead of an index_select.
    """
    parts = split_small_caches(batch_cache, rows, batched=batched, conformer_order=conformer_order)
    atts = copy_att_rows(batch_cache.estimator_att, rows, att_keep)
    return [FlowCache(c, a, e, att) for (c, a, e), att in zip(parts, atts)]


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
