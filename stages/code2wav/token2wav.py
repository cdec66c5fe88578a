"""Batched streaming token2wav: codec payloads in, 24 kHz float32 audio chunks out (stage 2).

Per request, state lives between payloads: flow caches (conformer + per-Euler-step estimator
caches), the HiFT stream state, and the prompt it speaks with. chunk_seq 0 creates it from the
shared prompt setup; `last_chunk` drops it. The prompt setup (prompt tokens + 3 lookahead silence
tokens through the encoder, then one CFM solve with cond = prompt mel whose output is discarded)
runs once per prompt id and is shared read-only by every request of that prompt.

Batching: payloads of one `decode` call are grouped by (token count, last_chunk, prompt, cache
shapes); each group runs one encoder, one CFM solve (2B rows) and one HiFT call, groups run one
after another. After a non-final group the caches are trimmed (prompt + `prompt_keep_frames`) and
split back per request (`flow_cache.split_flow_cache`, batched or per-row by the strict flag
`code2wav_batched_cache_split`). The estimator attention cache (~0.5 GiB per request at full size)
is never stacked: the CFM reads and writes it per request and Euler step (`StepwiseAttCache`), in
place once saturated, so a decode's transient peak is one step buffer rather than ~3 copies of
the B-row cache. `Token2Wav.stepwise_att_cache = False` selects the stack/solve/split reference.

A steady 28-code payload gives exactly 50 mel frames = 24000 samples (1.0 s). Stage flags are
parsed once in __init__ (`options.Code2WavOptions`); TF32 is applied on CUDA only.

    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    for chunk in t2w.decode([CodecPayload("r1", 0, codes, last_chunk=False)]):
        play(chunk.audio)
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import record_function

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.flow import FlowModel
from stages.code2wav.flow_cache import (
    AttKeep,
    FlowCache,
    StepwiseAttCache,
    split_flow_cache,
    split_small_caches,
    stack_flow_cache,
    trim_conformer_att,
)
from stages.code2wav.hift import HiFTGenerator, HiFTState, HiFTStream, fold_weight_norm
from stages.code2wav.hift_weights import find_hift_checkpoint, load_hift
from stages.code2wav.options import Code2WavOptions, tf32_scope
from stages.code2wav.prompt import PromptBuilder, PromptFeatures
from stages.code2wav.streaming import (
    DEFAULT_PROMPT_ID,
    Code2WavPayloadError,
    CodecPayload,
    validate_payload,
)
from stages.code2wav.weights import load_flow_weights

log = logging.getLogger(__name__)


@dataclass
class DecodedAudio:
    request_id: str
    chunk_seq: int
    audio: np.ndarray  # float32 [n] at cfg.sample_rate
    last_chunk: bool
    mel: torch.Tensor | None = None  # [80, T] on CPU, only with Token2Wav(keep_mel=True)


@dataclass
class PromptSetup:
    """Shared, read-only per prompt id: never written in place (stacking copies it)."""

    features: PromptFeatures
    spk: torch.Tensor  # [1, 80] projected speaker row
    mel: torch.Tensor  # [1, 80, prompt_len] prompt mel (cond of the setup solve)
    prompt_len: int  # mel frames of the prompt (= 2 * prompt tokens)
    cache: FlowCache  # state after the prompt: one request's caches


@dataclass
class _Request:
    prompt_id: str
    chunk_seq: int
    flow: FlowCache | None  # None between stacking and splitting (see _decode_group)
    hift: HiFTState | None
    noise: torch.Generator  # this request's NSF noise stream (see _noise_generator)
    # True once flow.estimator_att is this request's own tensor (made by _store_caches), so the
    # stepwise CFM may update it in place; False while it is the shared prompt setup cache.
    att_owned: bool = False


def _noise_generator(init_seed: int, request_seed: int, device: torch.device) -> torch.Generator:
    """A generator for one request's vocoder (NSF) noise, seeded from its sampling seed.

    Why per request: with one generator per replica, a row's noise would depend on which
    requests happened to share its batches and in what order, so the same codes could give
    different audio from run to run and across A/B arms. Seeding from the request's own seed
    (not its id, which differs between arms) makes its audio a function of its codes and seed,
    up to batch-size-dependent GEMM rounding.
    """
    digest = hashlib.blake2b(f"{init_seed}:{request_seed}".encode(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)


def _seeded(seed: int, build):
    """Build modules under a private RNG seed so every process gets identical weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


class Token2Wav:
    # False = the reference path (stack the whole estimator_att, solve, split per row): same bytes,
    # ~3x the transient memory. Kept for the equality test (tests/stages/test_decode_memory.py).
    stepwise_att_cache: bool = True

    def __init__(
        self,
        cfg: Code2WavConfig,
        *,
        device: torch.device,
        dtype: torch.dtype,
        init_seed: int = 0,
        weights_dir: str | None = None,
        keep_mel: bool = False,
    ) -> None:
        self.cfg = cfg
        self.options = Code2WavOptions.from_extra(cfg.extra)  # parsed once; typos raise here
        self.device, self.dtype = torch.device(device), dtype
        self.keep_mel = keep_mel
        self.flow = _seeded(init_seed, lambda: FlowModel(cfg))
        if weights_dir is not None:
            load_flow_weights(self.flow, weights_dir)
        self.flow.to(device=self.device, dtype=dtype).eval()
        self.flow.decoder.init_noise(seed=init_seed, device=self.device, dtype=dtype)
        self.hift = self._build_hift(init_seed, weights_dir)
        self._stream = HiFTStream(cfg.hift)
        self._init_seed = init_seed
        self._prompts = PromptBuilder(
            cfg,
            device=self.device,
            dtype=dtype,
            extra=cfg.extra,
            weights_dir=weights_dir,
            init_seed=init_seed,
        )
        self._prompt_wavs: dict[str, str | None] = {DEFAULT_PROMPT_ID: None}
        self._setups: dict[str, PromptSetup] = {}
        self._requests: dict[str, _Request] = {}
        log.info(
            "token2wav ready: cache split %s, tf32 %s",
            "batched" if self.options.batched_cache_split else "per-row",
            self.options.tf32_mode,
        )

    def _build_hift(self, seed: int, weights_dir: str | None) -> HiFTGenerator:
        hift = _seeded(seed + 1, lambda: HiFTGenerator(self.cfg.hift))
        if weights_dir is not None:
            load_hift(hift, find_hift_checkpoint(weights_dir))
        fold_weight_norm(hift)
        # HiFT stays float32 whatever the flow dtype (upstream runs it in fp32).
        hift = hift.to(device=self.device, dtype=torch.float32).eval()
        hift.init_buffers()
        return hift

    # -- prompts ---------------------------------------------------------------------------------

    def register_prompt(self, prompt_id: str, wav_path: str) -> None:
        """Make `prompt_id` usable in payloads; its setup is computed on first use."""
        self._prompt_wavs[prompt_id] = wav_path
        self._setups.pop(prompt_id, None)

    def prompt_setup(self, prompt_id: str = DEFAULT_PROMPT_ID) -> PromptSetup:
        setup = self._setups.get(prompt_id)
        if setup is None:
            if prompt_id not in self._prompt_wavs:
                raise ValueError(
                    f"error: unknown prompt id {prompt_id!r} (code2wav payload); call "
                    "Token2Wav.register_prompt first"
                )
            setup = self._build_setup(self._prompts.build(self._prompt_wavs[prompt_id]))
            self._setups[prompt_id] = setup
        return setup

    @torch.inference_mode()
    def _build_setup(self, pf: PromptFeatures) -> PromptSetup:
        spk = self.flow.project_speaker(pf.spk_embedding.to(self.device))
        lookahead = torch.full((self.cfg.flow.pre_lookahead_len,), self.cfg.silence_code)
        tokens = torch.cat([pf.tokens.cpu(), lookahead]).to(self.device).unsqueeze(0)
        mel = pf.mel.to(device=self.device, dtype=self.dtype).t().unsqueeze(0)  # [1, 80, 2Tp]
        with tf32_scope(self.options.tf32_mode, self.device, region="flow"):
            enc = self.flow.encode_chunk(tokens, None, None, last_chunk=False)
            solved = self.flow.decoder.solve(enc.mu, spk, mel, cnn_cache=None, att_cache=None)
        cache = FlowCache(enc.cnn_cache, enc.att_cache, solved.cnn_cache, solved.att_cache)
        return PromptSetup(pf, spk, mel, mel.shape[2], cache)

    # -- streaming -------------------------------------------------------------------------------

    def drop(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    @property
    def active_requests(self) -> int:
        return len(self._requests)

    def decode(self, payloads: Sequence[CodecPayload]) -> list[DecodedAudio]:
        """Decode one step's payloads (at most one per request); output in input order."""
        for p in payloads:  # validate everything before touching any state
            self._validate(p, payloads)
        states = [self._admit(p) for p in payloads]
        groups: dict[tuple, list[int]] = {}
        for i, (p, s) in enumerate(zip(payloads, states)):
            groups.setdefault(self._group_key(p, s), []).append(i)
        out: list[DecodedAudio | None] = [None] * len(payloads)
        for idx in groups.values():
            for i, audio in zip(idx, self._decode_group([payloads[i] for i in idx],
                                                         [states[i] for i in idx])):
                out[i] = audio
        return out  # type: ignore[return-value]

    def _validate(self, p: CodecPayload, batch: Sequence[CodecPayload]) -> None:
        if sum(q.request_id == p.request_id for q in batch) > 1:
            raise Code2WavPayloadError(
                p.request_id, p.chunk_seq, "two payloads of one request in one decode call",
                "send one chunk per request per step",
            )  # fmt: skip
        live = self._requests.get(p.request_id)
        prev = None if (live is None or p.chunk_seq == 0) else live.chunk_seq
        validate_payload(p, prev, self.cfg)
        if p.chunk_seq == 0:
            self.prompt_setup(p.prompt_id)  # unknown prompt ids fail here, before any state
        elif p.prompt_id != live.prompt_id:
            raise Code2WavPayloadError(
                p.request_id, p.chunk_seq, f"prompt id changed to {p.prompt_id!r} mid-stream",
                "keep one prompt per stream",
            )  # fmt: skip

    def _admit(self, p: CodecPayload) -> _Request:
        if p.chunk_seq == 0:  # new stream (or a new epoch of an old one): fresh state
            setup = self.prompt_setup(p.prompt_id)
            noise = _noise_generator(self._init_seed, p.seed, self.device)
            self._requests[p.request_id] = _Request(p.prompt_id, -1, setup.cache, None, noise)
        return self._requests[p.request_id]

    @staticmethod
    def _group_key(p: CodecPayload, s: _Request) -> tuple:
        hift_len = -1 if s.hift is None else s.hift.mel_cache.shape[1]
        return (
            len(p.codes), p.last_chunk, s.prompt_id,
            s.flow.conformer_att.shape[3], s.flow.estimator_att.shape[4], hift_len,
        )  # fmt: skip

    @torch.inference_mode()
    def _decode_group(self, items: list[CodecPayload], states: list[_Request]) -> list[DecodedAudio]:
        rows, last = len(items), items[0].last_chunk
        setup = self.prompt_setup(states[0].prompt_id)
        tokens = torch.tensor([p.codes for p in items], dtype=torch.long).to(self.device)
        keep = AttKeep(setup.prompt_len, self.cfg.prompt_keep_frames)
        stepwise = self.stepwise_att_cache
        batch = stack_flow_cache([s.flow for s in states], include_estimator_att=not stepwise)
        att_steps = None
        if stepwise:
            # A row may be updated in place only if nothing else holds it: the prompt setup's
            # cache is shared by every new request of that prompt.
            att_steps = StepwiseAttCache(
                [s.flow.estimator_att for s in states], keep=keep, store=not last,
                owned=[s.att_owned for s in states],
            )  # fmt: skip
        # Drop the rows' own references now (the stack copied the small caches; att_steps holds
        # estimator_att), so the old caches die as soon as the solve no longer needs them. A row
        # whose decode then fails has lost its state; the request fails anyway.
        for s in states:
            s.flow, s.att_owned = None, False
        # Profiler ranges (read by `tts-bench profile`; keep the names, its tests read them).
        # record_function is platform-neutral: with no profiler running, enter/exit dispatch one
        # profiler op pair that records nothing (torch 2.13 adds a cached CUPTI-monitor lookup),
        # ~6 us per range on the host measured on a slow CPU, no device work, no sync.
        with tf32_scope(self.options.tf32_mode, self.device, region="flow"):
            with record_function("code2wav.flow_encoder"):
                enc = self.flow.encode_chunk(
                    tokens, batch.conformer_cnn, batch.conformer_att, last_chunk=last
                )
            spk = setup.spk.expand(rows, -1)
            with record_function("code2wav.cfm"):
                solved = self.flow.decoder.solve(
                    enc.mu, spk, torch.zeros_like(enc.mu), cnn_cache=batch.estimator_cnn,
                    att_cache=batch.estimator_att, att_steps=att_steps,
                )  # fmt: skip
        del batch
        if not last:  # a finished stream's caches are dropped, never split
            att_rows = None if att_steps is None else att_steps.finish()
            self._store_caches(states, enc, solved, keep, att_rows)
        del att_steps
        mel = solved.mel.float()
        with (
            tf32_scope(self.options.tf32_mode, self.device, region="hift"),
            record_function("code2wav.hift"),
        ):
            audio, hift_states = self._stream.decode(
                self.hift, mel, [s.hift for s in states], [last] * rows,
                generator=[s.noise for s in states],
            )  # fmt: skip
        out = []
        for r, (p, s) in enumerate(zip(items, states)):
            s.hift, s.chunk_seq = hift_states[r], p.chunk_seq
            if last:
                self._requests.pop(p.request_id, None)
            row_mel = mel[r].cpu() if self.keep_mel else None
            out.append(DecodedAudio(p.request_id, p.chunk_seq, audio[r].cpu().numpy(), last, row_mel))
        return out

    def _store_caches(
        self, states, enc, solved, keep: AttKeep, att_rows: list[torch.Tensor] | None
    ) -> None:
        """Trim + split the new caches per request; `att_rows` = stepwise estimator_att rows
        (already trimmed), None = split them from the batch output (reference path)."""
        conformer_att = trim_conformer_att(
            enc.att_cache, keep, self.cfg.flow.up_rate, self.cfg.flow.num_blocks
        )
        new = FlowCache(enc.cnn_cache, conformer_att, solved.cnn_cache, solved.att_cache)
        batched = self.options.batched_cache_split
        if att_rows is None:
            caches = split_flow_cache(new, len(states), batched=batched, att_keep=keep)
        else:
            parts = split_small_caches(new, len(states), batched=batched)
            caches = [FlowCache(c, a, e, att) for (c, a, e), att in zip(parts, att_rows)]
        for s, cache in zip(states, caches):
            s.flow, s.att_owned = cache, True  # both paths make fresh per-request tensors

    # -- non-streaming reference -----------------------------------------------------------------

    @torch.inference_mode()
    def reference(self, codes: Sequence[int], prompt_id: str = DEFAULT_PROMPT_ID) -> DecodedAudio:
        """Decode all `codes` in one pass (the streaming run's block-causal masks, no caches,
        no trim, one HiFT call over the whole mel). Equals streaming when the streamed caches
        never reach the trim (see tests/stages/test_token2wav.py for the tolerances)."""
        setup = self.prompt_setup(prompt_id)
        c, tp = self.cfg, int(setup.features.tokens.numel())
        new = list(codes)
        blocks, left = [tp], c.codec_left_context_frames
        n_full = len(new) // c.codec_chunk_frames
        blocks += [c.codec_chunk_frames] * n_full + [left + len(new) - n_full * c.codec_chunk_frames]
        stream = [*setup.features.tokens.tolist(), *[c.silence_code] * left, *new]
        tokens = torch.tensor([stream], dtype=torch.long).to(self.device)
        mel = self.flow.reference_mel(tokens, setup.mel, setup.spk, blocks)
        gen = torch.Generator(device=self.device).manual_seed(0)
        empty = mel.new_zeros(1, 1, 0).float()
        audio, _ = self.hift.inference(mel.float(), empty, generator=gen)
        return DecodedAudio("reference", 0, audio[0].cpu().numpy(), True, mel[0].float().cpu())
