"""What `Token2Wav` keeps and returns per stream: a decoded chunk, a voice's prompt setup, a live
stream's host-side facts, the seed of its vocoder noise, and the key a replica step groups by.

A live stream's tensors sit in a slot of the replica's `SlotPool`; `LiveStream` holds only what
the host needs to place its next chunk: the slot, the last chunk decoded and the cache lengths its
next chunk starts from (`BatchShape` with rows, tokens and last unset). `step_key` is what a
replica compares to keep a step to one chunk shape (`runner.one_shape_steps`): the shape a
payload's group will be decoded with, or None for a chunk that runs alone whatever it is batched
with.

    stream = LiveStream("default", -1, slot=0, noise_seed=vocoder_seed(0, 7), caches=start_shape(300))
    step_key(stream, payload)  # BatchShape(rows=0, tokens=28, last=False, ...), or None
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from dataclasses import dataclass, replace

import numpy as np
import torch

from stages.code2wav.chunk_decode import BatchShape
from stages.code2wav.flow_cache import FlowCache
from stages.code2wav.prompt import PromptFeatures
from stages.code2wav.streaming import CodecPayload


@dataclass
class DecodedAudio:
    request_id: str
    chunk_seq: int
    audio: np.ndarray  # float32 [n] at cfg.sample_rate
    last_chunk: bool
    mel: torch.Tensor | None = None  # [80, T] on CPU, only with Token2Wav(keep_mel=True)
    # sha256 of this chunk's float32 mel bytes: output identity checks code2wav's flow, not only
    # the audio (a vocoder can hide a changed mel; two arms can be compared stage by stage).
    mel_sha256: str = ""


@dataclass
class PromptSetup:
    """Shared, read-only per prompt id: copied into a request's slot, never written."""

    features: PromptFeatures
    spk: torch.Tensor  # [1, 80] projected speaker row
    mel: torch.Tensor  # [1, 80, prompt_len] prompt mel (cond of the setup solve)
    prompt_len: int  # mel frames of the prompt (= 2 * prompt tokens)
    cache: FlowCache  # state after the prompt: one request's caches


@dataclass
class LiveStream:
    """Host-side facts of one live request; its tensors live in pool slot `slot`."""

    prompt_id: str
    chunk_seq: int
    slot: int
    noise_seed: int  # seeds its vocoder noise (see vocoder_seed)
    caches: BatchShape  # cache lengths before its next chunk (rows/tokens/last unused)

    def chunk_shape(self, p: CodecPayload, rows: int = 0) -> BatchShape:
        """The shape `p`, this stream's next chunk, is decoded with (`rows` as given)."""
        return replace(self.caches, rows=rows, tokens=len(p.codes), last=p.last_chunk)


def vocoder_seed(init_seed: int, request_seed: int) -> int:
    """A request's NSF noise seed (63 bits), from the replica seed and its sampling seed.

    Why per request: with one stream per replica, a row's noise would depend on which requests
    happened to share its batches and in what order, so the same codes could give different
    audio from run to run and across A/B arms. Deriving it from the request's own seed (not its
    id, which differs between arms) makes its audio a function of its codes and seed, up to
    batch-size-dependent GEMM rounding.
    """
    digest = hashlib.blake2b(f"{init_seed}:{request_seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def step_key(stream: LiveStream | None, p: CodecPayload) -> Hashable | None:
    """The key of the chunk group `p` would join in a decode call, given its request's live
    stream (None: not admitted). None for a chunk that runs alone whatever it is batched with (a
    final chunk: replayed row by row, or eager) or that cannot be placed (not the stream's next
    chunk: `decode` says what is wrong). A first chunk is keyed by its length only: every voice is
    normalised to one prompt length, so first chunks share the start shape, which no later chunk
    has (it caches no vocoder frames); were two prompt lengths to meet, `decode` would still
    group them apart."""
    if p.last_chunk:
        return None
    if p.chunk_seq == 0:
        return ("first", len(p.codes))
    if stream is None or p.chunk_seq != stream.chunk_seq + 1:
        return None
    return stream.chunk_shape(p)
