"""Every live request's streaming state in fixed device tensors: one slot per request.

Why slots: a device graph replays fixed addresses. With per-request tensors, every chunk would
stack the rows' caches into a batch and split them back (launches that grow with the batch and
cannot be captured, since the addresses change). Here each cache is one tensor with a row per
slot; a batch gathers its rows with `index_select` over a slot-index tensor and writes its new
caches back with `index_copy_`, so the whole decode of a chunk is shape-static and replayable,
whatever slots its requests happen to own.

Layout (S slots, F = prompt_len + prompt_keep_frames, the saturated cache length):
* conformer_cnn  [S, C, 6]                    rows on dim 0
* conformer_att  [10, S, H, F, 2*d_k]         rows on dim 1 (a slot uses [..., :L, :])
* estimator_cnn  [n_t, depth, 2S, 2*hid, 2]   slot s owns rows 2s (cond) and 2s+1 (uncond)
* estimator_att  [n_t, depth, 2S, H, F, 2D]   same pairs; [..., :L, :] in use
* spk            [S, 80]                      the projected speaker row of the slot's voice
* hift_mel [S, 80, 8], hift_source [S, 1, 3840], hift_tail [S, 3840] (float32: HiFT is fp32)

A gather of slots [s0, s1, ...] in CFG order is `pair_index`: [2s0, 2s1, ..., 2s0+1, 2s1+1, ...],
which is the [cond x B | uncond x B] layout the CFM solves on.

Capacity grows by doubling when every slot is taken (the old rows are copied over); growing
bumps `generation`, which tells graph owners that every captured address is stale.

LANDMINE: only the [..., :L, :] prefix of a slot's attention caches is meaningful, where L is
the length the owner tracks on the host; nothing may read past it.

    pool = SlotPool(cfg, device=dev, dtype=torch.float32, frames=400)
    s = pool.acquire()
    idx = pool.pair_index(torch.tensor([s], device=dev))
    pool.release(s)
"""

from __future__ import annotations

import logging

import torch

from stages.code2wav.config import Code2WavConfig

log = logging.getLogger(__name__)

HIFT_FIELDS = ("hift_mel", "hift_source", "hift_tail")


def _shapes(cfg: Code2WavConfig, slots: int, frames: int) -> dict[str, tuple[tuple[int, ...], int]]:
    """name -> (shape at `slots` slots, the dim that holds rows)."""
    f, d, h = cfg.flow, cfg.dit, cfg.hift
    layers = f.num_blocks + f.num_up_blocks
    cnn_frames = 2 + 2 * f.up_rate  # pre-lookahead conv2 history + upsample-conv history
    return {
        "conformer_cnn": ((slots, f.input_size, cnn_frames), 0),
        "conformer_att": ((layers, slots, f.attention_heads, frames, 2 * f.head_dim), 1),
        "estimator_cnn": ((cfg.n_timesteps, d.depth, 2 * slots, 2 * d.hidden_size, 2), 2),
        "estimator_att": ((cfg.n_timesteps, d.depth, 2 * slots, d.num_heads, frames, 2 * d.head_dim), 2),
        "spk": ((slots, cfg.mel_bins), 0),
        "hift_mel": ((slots, cfg.mel_bins, h.mel_cache_frames), 0),
        "hift_source": ((slots, 1, h.source_cache_samples), 0),
        "hift_tail": ((slots, h.source_cache_samples), 0),
    }


class SlotPool:
    """Fixed-address streaming state for up to `capacity` requests (grows by doubling)."""

    def __init__(
        self,
        cfg: Code2WavConfig,
        *,
        device: torch.device,
        dtype: torch.dtype,
        frames: int,
        capacity: int = 1,
        estimator_dtype: torch.dtype | None = None,
    ) -> None:
        self.cfg, self.device, self.dtype, self.frames = cfg, torch.device(device), dtype, frames
        self.estimator_dtype = estimator_dtype or dtype
        self.capacity = 0
        self.generation = 0
        self.tensors: dict[str, torch.Tensor] = {}
        self._free: list[int] = []
        self._grow(max(1, capacity))

    def _dtype(self, name: str) -> torch.dtype:
        if name in HIFT_FIELDS:
            return torch.float32
        return self.estimator_dtype if name.startswith("estimator") else self.dtype

    def _grow(self, capacity: int) -> None:
        old, old_cap = self.tensors, self.capacity
        new = {}
        for name, (shape, dim) in _shapes(self.cfg, capacity, self.frames).items():
            t = torch.zeros(shape, device=self.device, dtype=self._dtype(name))
            if old_cap:
                rows = old_cap * (2 if name.startswith("estimator") else 1)
                t.narrow(dim, 0, rows).copy_(old[name])
            new[name] = t
        self.tensors = new
        self._free.extend(range(old_cap, capacity))
        self._free.sort(reverse=True)  # pop() hands out the lowest free slot
        self.capacity = capacity
        self.generation += 1
        if old_cap:
            log.info("code2wav slot pool grown to %d slots (%.1f MiB)", capacity, self.nbytes / 2**20)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def in_use(self) -> int:
        return self.capacity - len(self._free)

    def acquire(self) -> int:
        """A free slot (the lowest); grows the pool when none is left."""
        if not self._free:
            self._grow(2 * self.capacity)
        return self._free.pop()

    def release(self, slot: int) -> None:
        assert 0 <= slot < self.capacity and slot not in self._free, f"slot {slot} is not in use"
        self._free.append(slot)
        self._free.sort(reverse=True)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    @staticmethod
    def pair_index(slots: torch.Tensor) -> torch.Tensor:
        """[B] slots -> [2B] estimator rows in CFG order [cond x B | uncond x B]."""
        return torch.cat([2 * slots, 2 * slots + 1])
