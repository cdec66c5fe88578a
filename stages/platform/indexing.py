"""Row writes into a large cache that cost what they write, also under deterministic kernels.

With `torch.use_deterministic_algorithms(True)` (`deterministic_kernels`, on by default) CUDA's
`index_put_` and `index_copy_` take a sort-based path. That path copies the *whole* destination
to a contiguous buffer and back when the destination is not contiguous (a slice of a cache) or
when the indexed dims are not adjacent (the indices are then moved to the front of a transposed
view). On the H200 this made the talker's decode copy its whole KV cache 4 times per layer and
step (80 copies of 400 MB) and each code2wav Euler step copy its whole estimator cache arena
slice twice per kept range.

The writes here index a contiguous tensor over one adjacent run of dims, so that path only
sorts the indices (which are few) and writes the rows in place. Values are the same as
`index_copy_`'s bit for bit; duplicate indices are not supported (callers write distinct slots).

    index_copy_span(pool, 0, slots, mel, span_dim=2)      # pool[:, :, :T].index_copy_(0, slots, mel)
    index_copy_span(arena, 1, pairs, part, span_dim=3, start=pos)
"""

from __future__ import annotations

import torch


def index_copy_span(
    dst: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, *, span_dim: int | None = None, start: int = 0
) -> None:
    """`dst.narrow(span_dim, start, n).index_copy_(dim, index, src)` with n = src.shape[span_dim]
    (plain `dst.index_copy_(dim, index, src)` without `span_dim`), in place.

    dst must be contiguous (a whole cache, or a leading-index view of one): a sliced view would
    bring back the copy this function exists to avoid, so it is refused. Every dim between `dim`
    and `span_dim` is indexed in full, so the indexed dims are one adjacent run."""
    if not dst.is_contiguous():
        raise ValueError(f"index_copy_span needs a contiguous destination, got strides {dst.stride()}")
    if span_dim == dim:
        raise ValueError("span_dim must differ from dim")
    if span_dim is None:
        dst.index_copy_(dim, index, src)
        return
    n = src.shape[span_dim]
    if not 0 <= start <= start + n <= dst.shape[span_dim]:
        raise ValueError(f"span {start}..{start + n} outside dim {span_dim} of size {dst.shape[span_dim]}")
    if n == dst.shape[span_dim]:  # the whole dim: one index into a contiguous tensor already
        dst.index_copy_(dim, index, src)
        return
    lo, hi = min(dim, span_dim), max(dim, span_dim)
    run = hi - lo + 1
    indices: list[torch.Tensor | slice] = [slice(None)] * lo
    for d in range(lo, hi + 1):
        if d == dim:
            idx = index
        elif d == span_dim:
            idx = torch.arange(start, start + n, device=dst.device)
        else:
            idx = torch.arange(dst.shape[d], device=dst.device)
        shape = [1] * run
        shape[d - lo] = idx.shape[0]
        indices.append(idx.reshape(shape))  # an outer product over the run
    dst[tuple(indices)] = src
