"""One code2wav chunk for B rows, against the slot pool: gather caches, flow, CFM, HiFT, store.

`ChunkDecoder.run(meta, shape)` is the whole per-chunk computation and nothing else: every
per-request input arrives in one int64 tensor `meta` [B, tokens + 3] (the payload's codes, then
the row's slot, vocoder seed and chunk number) and every output leaves in fixed tensors, so the
function is shape-static and sync-free for a given `BatchShape`. That is what lets
`ChunkGraphs` capture it once per shape and replay it for any rows in any slots: eager and replay
run the same kernels on the same inputs, so their outputs are equal bit for bit.

Per chunk (shapes for B rows, T mel frames, L cached frames):
1. gather the rows' caches from the pool (`index_select` over slots / CFG pairs);
2. flow encoder on [B, tokens] -> mu [B, 80, T] and the new conformer caches;
3. CFM solve on 2B rows; the estimator attention cache is read from and written back to the
   pool one Euler step at a time (`PooledAttSteps`), trimmed to prompt + keep frames;
4. unless last: store conformer + estimator conv caches (one `index_copy_` per tensor, or one
   per row with `code2wav_batched_cache_split: false`, the per-row reference of seed item 3);
5. HiFT on [cached mel | new mel] with counter-based NSF noise (`noise.py`), cross-fade with the
   held-back tail, store the new vocoder caches, emit all but the held-back samples.

    decoder = ChunkDecoder(flow, hift, pool, cfg, options, prompt_len=300)
    out = decoder.run(meta, BatchShape(rows=2, tokens=28, last=False, conformer_len=300,
                                       estimator_len=300, hift_frames=0, tail_samples=0))
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import accumulate
from dataclasses import dataclass, replace

import torch
from torch.profiler import record_function

from stages.code2wav import noise
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.flow import FlowModel
from stages.code2wav.flow_cache import AttKeep, trim_conformer_att
from stages.code2wav.hift import HiFTGenerator, NoiseKeys, crossfade_window
from stages.code2wav.kernels import CacheCopyKernel
from stages.code2wav.options import Code2WavOptions
from stages.code2wav.slots import SlotPool
from stages.platform.indexing import index_copy_span
from stages.precision import region_scope

META_EXTRA = 3  # columns after the codes: slot, vocoder seed, chunk number


@dataclass(frozen=True)
class BatchShape:
    """Everything that fixes a chunk's tensor shapes: the key of a captured graph."""

    rows: int
    tokens: int
    last: bool
    conformer_len: int  # cached conformer frames (mel rate; token layers are tiled x2)
    estimator_len: int  # cached estimator frames
    hift_frames: int  # cached mel frames re-decoded by HiFT (0 on a stream's first chunk)
    tail_samples: int  # held-back speech to cross-fade (0 on a stream's first chunk)


def start_shape(prompt_len: int) -> BatchShape:
    """A new stream's caches before its first chunk: the prompt's, no vocoder frames yet."""
    return BatchShape(0, 0, False, conformer_len=prompt_len, estimator_len=prompt_len, hift_frames=0, tail_samples=0)


@dataclass
class ChunkOut:
    audio: torch.Tensor  # [B, samples] float32
    mel: torch.Tensor  # [B, 80, T] float32


class PooledAttSteps:
    """The estimator attention cache of a batch, read from / written to the pool per Euler step.

    `load(i, buf)` gathers step i's [.., :L, ..] prefix of the rows' pair slots into the tail of
    the step buffer; `store(i, buf)` writes the step's new cache back, trimmed to the keep ranges,
    at the front of each slot. Step i only touches slice i, and loads happen before stores, so
    reading and writing the same slots is safe.

    The estimator's cache is [new frames | old cache] (the DiT writes a chunk's K/V first, as the
    official DiT's `cat([k, k_cache])` does), so the keep ranges [0, prompt_len) and the last
    keep_frames hold the newest prompt_len frames and the oldest kept ones: once trimmed, a sliding
    window of the newest generated frames plus the prompt's last keep_frames, as in the official
    1.0.7 trim (tests/stages/test_official_reference.py). The conformer's cache is [old | new]:
    there the same ranges are the prompt's head and the newest frames.
    """

    def __init__(self, arena: torch.Tensor, pairs: torch.Tensor, length: int, keep: AttKeep, *, store: bool,
                 copy: CacheCopyKernel = CacheCopyKernel()):
        self.arena, self.pairs, self.length, self.keep, self._store = arena, pairs, length, keep, store
        self.copy = copy

    def load(self, step: int, buf: torch.Tensor) -> None:
        # buf: [depth, 2B, H, T+L, 2D]; arena[step]: [depth, 2S, H, F, 2D]
        frames = buf.shape[3] - self.length
        if self.copy.gather is not None:  # one pass (code2wav_fused_cache_copy)
            self.copy.gather(self.arena[step], self.pairs, buf, at=frames, frames=self.length)
            return
        rows = self.arena[step, :, :, :, : self.length].index_select(1, self.pairs)
        buf[:, :, :, frames:].copy_(rows.to(buf.dtype))

    def store(self, step: int, buf: torch.Tensor) -> None:
        if not self._store:
            return
        # The kept ranges land back to back from frame 0: one write of their concatenation.
        ranges = self.keep.ranges(buf.shape[3])
        if self.copy.scatter is not None:  # one pass (code2wav_fused_cache_copy)
            starts = [0, *accumulate(n for _, n in ranges[:-1])]  # back to back from frame 0
            self.copy.scatter(buf, self.pairs, self.arena[step],
                              [(start, at, n) for (start, n), at in zip(ranges, starts)])
            return
        kept = [buf[:, :, :, start : start + n] for start, n in ranges]
        part = (kept[0] if len(kept) == 1 else torch.cat(kept, dim=3)).to(self.arena.dtype)
        index_copy_span(self.arena[step], 1, self.pairs, part, span_dim=3)


def store_small_caches(
    pool: Mapping[str, torch.Tensor],
    slots: torch.Tensor,  # [B]
    pairs: torch.Tensor,  # [2B] estimator rows in CFG order
    conformer_cnn: torch.Tensor,  # [B, C, 6]
    conformer_att: torch.Tensor,  # [10, B, H, L', 2*d_k], already trimmed
    estimator_cnn: torch.Tensor,  # [n_t, depth, 2B, 2*hidden, 2]
    *,
    batched: bool,
) -> None:
    """The cache split of seed item 3: a chunk's conformer cnn/att and estimator cnn caches into
    the rows' slots. Batched: one write per tensor (3 launches). Per-row (the reference,
    `code2wav_batched_cache_split: false`): one per row and tensor, the estimator's cond and
    uncond rows apart (4 per row). A conformer att cache shorter than
    its pool indexes its heads and frames too (2 more launches). Same bytes either way."""
    _store_rows(pool["conformer_cnn"], 0, slots, conformer_cnn, batched)
    _store_rows(pool["conformer_att"], 1, slots, conformer_att, batched, span_dim=3)
    if batched:
        pool["estimator_cnn"].index_copy_(2, pairs, estimator_cnn)
        return
    for half in range(pairs.shape[0]):  # request r's cond row is half r, its uncond row B + r
        pool["estimator_cnn"].index_copy_(2, pairs[half : half + 1], estimator_cnn.narrow(2, half, 1))


def _store_rows(dst: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, batched: bool,
                *, span_dim: int | None = None) -> None:
    """dst[index[r]] = src[r] along `dim` (from position 0 of `span_dim`, if given): one
    launch, or one per row (the per-row reference)."""
    if batched:
        index_copy_span(dst, dim, index, src, span_dim=span_dim)
        return
    for r in range(index.shape[0]):
        index_copy_span(dst, dim, index[r : r + 1], src.narrow(dim, r, 1), span_dim=span_dim)


class ChunkDecoder:
    """The per-chunk computation of one replica, bound to its modules and its slot pool."""

    def __init__(
        self,
        flow: FlowModel,
        hift: HiFTGenerator,
        pool: SlotPool,
        cfg: Code2WavConfig,
        options: Code2WavOptions,
        *,
        prompt_len: int,
        copy: CacheCopyKernel = CacheCopyKernel(),
    ) -> None:
        self.flow, self.hift, self.pool, self.cfg, self.options = flow, hift, pool, cfg, options
        self.copy = copy  # the pool's attention-cache copies (`kernels.cache_copy_kernel`)
        self.keep = AttKeep(prompt_len, cfg.prompt_keep_frames)
        self.window = crossfade_window(cfg.hift).to(pool.device)

    @torch.inference_mode()
    def run(self, meta: torch.Tensor, shape: BatchShape) -> ChunkOut:
        """meta: [B, tokens + 3] int64 on the device (codes | slot | seed | chunk)."""
        n = shape.tokens
        tokens, slots, seeds, chunks = meta[:, :n], meta[:, n], meta[:, n + 1], meta[:, n + 2]
        pool = self.pool
        pairs = pool.pair_index(slots)
        device, tf32 = pool.device, self.options.tf32_mode
        # Profiler ranges (read by `tts-bench profile`: keep the names). With no profiler running
        # they record nothing and sync nothing, eager or under capture.
        with region_scope(tf32, device, region="flow"):
            with record_function("code2wav.flow_encoder"):
                enc = self.flow.encode_chunk(
                    tokens,
                    pool["conformer_cnn"].index_select(0, slots),
                    self._conformer_att(slots, shape.conformer_len),
                    last_chunk=shape.last,
                )
            with record_function("code2wav.cfm"):
                att = PooledAttSteps(pool["estimator_att"], pairs, shape.estimator_len, self.keep,
                                     store=not shape.last, copy=self.copy)
                solved = self.flow.decoder.solve(
                    enc.mu, pool["spk"].index_select(0, slots), torch.zeros_like(enc.mu),
                    cnn_cache=pool["estimator_cnn"].index_select(2, pairs), att_cache=None, att_steps=att,
                )  # fmt: skip
                if not shape.last:
                    self._store_flow(slots, pairs, enc, solved.cnn_cache)
        mel = solved.mel.float()
        with region_scope(tf32, device, region="hift"), record_function("code2wav.hift"):
            audio = self._vocode(mel, slots, NoiseKeys(noise.row_keys(seeds, chunks)), shape)
        return ChunkOut(audio, mel)

    def _conformer_att(self, slots: torch.Tensor, length: int) -> torch.Tensor:
        """The rows' conformer attention caches [10, B, H, length, 2*d_k], gathered from the pool."""
        att = self.pool["conformer_att"]
        if self.copy.gather is None:
            return att[:, :, :, :length].index_select(1, slots)
        out = att.new_empty(att.shape[0], slots.shape[0], att.shape[2], length, att.shape[4])
        self.copy.gather(att, slots, out, at=0, frames=length)
        return out

    def _store_flow(self, slots, pairs, enc, estimator_cnn) -> None:
        f = self.cfg.flow
        att = trim_conformer_att(enc.att_cache, self.keep, f.up_rate, f.num_blocks)
        store_small_caches(self.pool.tensors, slots, pairs, enc.cnn_cache, att, estimator_cnn,
                           batched=self.options.batched_cache_split)

    def _vocode(self, mel: torch.Tensor, slots: torch.Tensor, keys: NoiseKeys, shape: BatchShape) -> torch.Tensor:
        # mel: [B, 80, T] -> emitted speech [B, samples]
        pool, hl, spf = self.pool, shape.hift_frames, self.cfg.hift.samples_per_frame
        n = self.cfg.hift.source_cache_samples
        if hl:
            mel = torch.cat([pool["hift_mel"][:, :, :hl].index_select(0, slots), mel], dim=2)
            cache_source = pool["hift_source"][:, :, : hl * spf].index_select(0, slots)
        else:
            cache_source = mel.new_zeros(mel.shape[0], 1, 0)
        speech, source = self.hift.inference(mel, cache_source, generator=keys)
        k = shape.tail_samples
        if k:  # rising half of the Hamming window on the new audio, falling half on the old
            tail = pool["hift_tail"][:, :k].index_select(0, slots)
            speech[:, :k] = speech[:, :k] * self.window[:k] + tail * self.window[-k:]
        if shape.last:
            return speech
        frames = min(self.cfg.hift.mel_cache_frames, mel.shape[2])
        index_copy_span(pool["hift_mel"], 0, slots, mel[:, :, -frames:], span_dim=2)
        index_copy_span(pool["hift_source"], 0, slots, source[:, :, -frames * spf :], span_dim=2)
        held = min(n, speech.shape[1])
        index_copy_span(pool["hift_tail"], 0, slots, speech[:, -held:], span_dim=1)
        return speech[:, : speech.shape[1] - n]

    def settled(self, shape: BatchShape) -> bool:
        """Whether a non-final chunk of `shape` leaves its rows' caches as it found them."""
        frames = (shape.tokens - self.cfg.codec_left_context_frames) * self.cfg.flow.up_rate
        return self.next_shape(shape, frames) == replace(shape, rows=0, tokens=0, last=False)

    def next_shape(self, shape: BatchShape, mel_frames: int) -> BatchShape:
        """The cache lengths a row has after a non-final chunk of `mel_frames` frames."""
        hift = self.cfg.hift
        frames = shape.hift_frames + mel_frames
        return BatchShape(
            rows=0, tokens=0, last=False,
            conformer_len=sum(k for _, k in self.keep.ranges(shape.conformer_len + mel_frames)),
            estimator_len=sum(k for _, k in self.keep.ranges(shape.estimator_len + mel_frames)),
            hift_frames=min(hift.mel_cache_frames, frames),
            tail_samples=min(hift.source_cache_samples, frames * hift.samples_per_frame),
        )  # fmt: skip
