"""Batched streaming token2wav: codec payloads in, 24 kHz float32 audio chunks out (stage 2).

Per request, streaming state lives in a slot of the replica's `SlotPool` between payloads: flow
caches (conformer + per-Euler-step estimator caches), the HiFT caches and the speaker row of its
voice. chunk_seq 0 takes a slot and copies the voice's prompt setup into it; `last_chunk` (or
`drop`) frees it. The prompt setup (prompt tokens + 3 lookahead silence tokens through the
encoder, then one CFM solve with cond = prompt mel whose output is discarded) runs once per
prompt id and is shared read-only by every request of that prompt.

Batching: payloads of one `decode` call are grouped by `BatchShape` (token count, last_chunk and
cache lengths; rows of different voices batch together, since every prompt is normalised to the
same length); each group is one `ChunkDecoder.run`: gather the rows' caches, encoder, CFM on 2B
rows, HiFT, store the new caches back (trimmed to prompt + `prompt_keep_frames`). Every group of
a call is queued, replays first, before any audio is copied back (launch_plan.py). On CUDA/NPU a
non-final group replays a device graph captured for its shape (`ChunkGraphs`, stage flag
`code2wav_device_graph`); a shape's first chunk and last chunks run eagerly, except warmed last
chunks with `code2wav_final_chunk_graphs` (graph_warmup.py), which replay one row at a time.
Replay and eager run the same kernels: outputs equal bit for bit for the same batch composition.

A steady 28-code payload gives exactly 50 mel frames = 24000 samples (1.0 s). Stage flags are
the config's parsed `cfg.options` (`options.Code2WavOptions`, parsed once); TF32 is applied on
CUDA only. Which DiT kernels run is `kernels.resolve`'s choice, made once at construction.

    t2w = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
    for chunk in t2w.decode([CodecPayload("r1", 0, codes, last_chunk=False)]):
        play(chunk.audio)
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import numpy as np
import torch

from stages import precision
from stages.code2wav.chunk_decode import META_EXTRA, BatchShape, ChunkDecoder, ChunkOut, start_shape
from stages.code2wav.chunk_graphs import ChunkGraphs
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.decode_work import DecodeWork, group_kind
from stages.code2wav.flow_cache import FlowCache
from stages.code2wav.graph_warmup import warm_graphs
from stages.code2wav.launch_plan import plan_launches
from stages.code2wav.modules import build_flow, build_hift
from stages.code2wav.kernels import DiTKernels, cache_copy_kernel, hift_conv_kernel, resolve, snake_kernel
from stages.code2wav.prompt import PromptBuilder, PromptFeatures
from stages.code2wav.slots import SlotPool
from stages.code2wav.stream_state import DecodedAudio, LiveStream, PromptSetup, step_key, vocoder_seed
from stages.code2wav.streaming import (
    DEFAULT_PROMPT_ID,
    Code2WavPayloadError,
    CodecPayload,
    emitted_tokens,
    validate_payload,
)
from stages.platform.device import device_to_host, host_to_device, synchronize_stream
from stages.platform.graphs import graph_api
from stages.precision import region_scope

log = logging.getLogger(__name__)


class Token2Wav:
    def __init__(
        self,
        cfg: Code2WavConfig,
        *,
        device: torch.device,
        dtype: torch.dtype,
        init_seed: int = 0,
        weights_dir: str | None = None,
        keep_mel: bool = False,
        slots: int = 1,
        shared: Token2Wav | None = None,
    ) -> None:
        """`slots`: initial slot-pool capacity (it doubles when more requests are live).
        `shared`: another replica on the same device whose modules, prompt builder and prompt
        setups this one reuses (replicas on threads of one process); state stays per replica."""
        self.cfg = cfg
        self.options = cfg.options  # parsed once (here at the latest); typos raise here
        self.device, self.dtype = torch.device(device), dtype
        self.keep_mel = keep_mel
        self._init_seed = init_seed
        if shared is not None:
            self._share(shared)
        else:
            self._build(weights_dir)
        self._requests: dict[str, LiveStream] = {}
        # The voice each new stream was prepared with, held until the stream is admitted: the
        # LRU (shared by replica threads) may evict it meanwhile, and the stream must neither
        # rebuild it nor find it gone.
        self._prepared: dict[str, PromptSetup] = {}
        self._initial_slots = max(1, slots)
        self.pool: SlotPool | None = None  # made with the first prompt setup (it fixes the length)
        self._decoder: ChunkDecoder | None = None
        api = graph_api(self.device) if self.options.device_graph else None
        self.graphs = ChunkGraphs(api) if api is not None else None
        # Final-chunk shapes the warmup chose (code2wav_final_chunk_graphs): replayed row by row
        # while serving (captured again after a drop); every other final chunk runs eagerly.
        self.final_shapes: set[BatchShape] = set()
        self._graph_generation = 0
        self._work = DecodeWork()  # groups by kind, eager finals, where decode calls' host time goes
        log.info(
            "token2wav ready: cache split %s, tf32 %s, device graphs %s",
            "batched" if self.options.batched_cache_split else "per-row",
            self.options.tf32_mode,
            "on" if self.graphs is not None else "off",
        )

    def _build(self, weights_dir: str | None) -> None:
        cfg, seed = self.cfg, self._init_seed
        self.flow = build_flow(cfg, seed=seed, weights_dir=weights_dir)
        self.flow.to(device=self.device, dtype=self.dtype).eval()
        if self.options.dit_dtype != "float32":  # the estimator alone (and its caches)
            self.flow.decoder.estimator.to(getattr(torch, self.options.dit_dtype))
        estimator = self.flow.decoder.estimator
        self.kernels: DiTKernels = resolve(self.options, cfg.dit, self.device, estimator.in_proj.weight.dtype)
        estimator.use_kernels(self.kernels)
        for part, said in self.kernels.reasons().items():
            log.info("token2wav: DiT %s %s", part, said)
        self.flow.decoder.init_noise(seed=seed, device=self.device, dtype=self.dtype)
        # HiFT stays float32 whatever the flow dtype (upstream runs it in fp32).
        self.hift = build_hift(cfg.hift, seed=seed + 1, weights_dir=weights_dir).to(device=self.device).eval()
        self.hift.init_buffers()
        snake = snake_kernel(self.options.fused_snake, self.device)
        conv = hift_conv_kernel(self.options.hift_conv_gemm, self.device, self.options.tf32_mode, self.hift.gemm_convs())
        self.hift.use_kernels(snake, conv)
        log.info("token2wav: HiFT snakes %s; convs %s", snake.reason, conv.reason)
        # The pool's attention caches: the conformer's in the flow's dtype, the estimator's in its own.
        self.cache_copy = cache_copy_kernel(
            self.options.fused_cache_copy, self.device, (self.dtype, estimator.in_proj.weight.dtype),
            (2 * cfg.flow.head_dim, 2 * cfg.dit.head_dim))
        log.info("token2wav: attention-cache copies %s", self.cache_copy.reason)
        self._prompts = PromptBuilder(
            cfg, device=self.device, dtype=self.dtype, weights_dir=weights_dir, init_seed=seed,
            cache_size=cfg.prompt_cache_size,
        )
        # Voices by id: registered ones (the default, register_prompt) are kept; voices that
        # arrive as audio with a request are an LRU of cfg.prompt_cache_size (see prepare).
        self._prompt_wavs: dict[str, str | None] = {DEFAULT_PROMPT_ID: None}
        self._setups: OrderedDict[str, PromptSetup] = OrderedDict()
        self._prompt_lock = threading.RLock()

    def _share(self, other: Token2Wav) -> None:
        if (other.cfg, other.device, other.dtype, other._init_seed) != (self.cfg, self.device, self.dtype, self._init_seed):
            raise ValueError("Token2Wav(shared=...) needs the same config, device, dtype and seed")
        self.flow, self.hift, self._prompts, self.kernels = other.flow, other.hift, other._prompts, other.kernels
        self.cache_copy = other.cache_copy
        self._prompt_wavs, self._setups, self._prompt_lock = other._prompt_wavs, other._setups, other._prompt_lock

    def describe(self) -> dict:
        """Facts for the run record (the replica's Ready)."""
        graphs = self.graphs
        return {
            "batched_cache_split": self.options.batched_cache_split,
            # The branch that runs, not the flag: an opt-out in the environment or weights that
            # cannot be lifted to torch put the speaker embedding on the CPU whatever the flag says.
            "device_spk": self._prompts.speaker.on_device,
            "speaker_branch": self._prompts.speaker.branch,
            "tf32_mode": self.options.tf32_mode,
            # What ran in what precision, read off torch's flags inside the regions' scopes.
            "precision": precision.code2wav_precision(self.device, self.options, self.flow.decoder.estimator),
            "dit_dtype": self.options.dit_dtype,
            # What the DiT runs (`DiTKernels.describe`, the choice `use_kernels` wired in): dit_norm,
            # dit_attention, dit_conv, dit_conv_norm, dit_conv_gemm, dit_gemm.
            **self.kernels.describe(),
            "hift_snake": self.hift.snake_kernel,  # "triton" or "eager"
            "hift_conv": self.hift.conv_kernel,  # "tf32x3" or "cudnn" (code2wav_hift_conv_gemm)
            "c2w_cache_copy": self.cache_copy.name,  # "triton" or "torch" (code2wav_fused_cache_copy)
            # Why those branches run and the others do not (kernels.resolve's words, as logged).
            "dit_reasons": self.kernels.reasons(),
            "device_graph": graphs is not None and graphs.disabled is None,
            "graph_disabled_reason": None if graphs is None else graphs.disabled,
            "slots": 0 if self.pool is None else self.pool.capacity,
        }

    def work(self) -> dict:
        """Cumulative counters for the runner's work report (`decode_work.DecodeWork`): chunk
        groups run, by kind (first / growing / steady / final), graph captures and replays, the
        eager final groups, and the host seconds spent launching and finishing groups."""
        return self._work.snapshot(self.graphs)

    # -- prompts ---------------------------------------------------------------------------------

    def register_prompt(self, prompt_id: str, wav_path: str) -> None:
        """Make `prompt_id` usable in payloads; its setup is computed on first use."""
        self._prompt_wavs[prompt_id] = wav_path
        self._setups.pop(prompt_id, None)

    def prepare(self, p: CodecPayload) -> dict | None:
        """Set up a new stream's voice before it is decoded; {"cache_hit", "setup_ms"} for a
        stream's first payload, None for later ones.

        A payload with `prompt_audio` names its voice by content hash: a voice seen before is a
        cache hit (its prompt setup is reused), a new one is built here (speech tokens, prompt
        mel, speaker embedding on the device or CPU per `token2wav_device_spk`, then the setup
        solve), timed with its stream synchronized. Audio that cannot be decoded, is empty or
        over `ref_audio_limit_seconds` raises PromptError (the request's fault).
        """
        if p.chunk_seq != 0:
            return None
        setup, info = self._voice(p)
        self._prepared[p.request_id] = setup
        return info

    def _voice(self, p: CodecPayload) -> tuple[PromptSetup, dict]:
        """The prompt setup of a first payload's voice, and how it was found."""
        if p.prompt_audio is None:
            # Registered voices are built once and kept.
            return self.prompt_setup(p.prompt_id), {"cache_hit": True, "setup_ms": 0.0}
        with self._prompt_lock:
            setup = self._setups.get(p.prompt_id)
            if setup is not None:
                self._setups.move_to_end(p.prompt_id)
                return setup, {"cache_hit": True, "setup_ms": 0.0}
            t0 = time.perf_counter()
            with self._voice_scope():
                setup = self._build_setup(self._prompts.build_bytes(p.prompt_audio))
            synchronize_stream(self.device)  # not the device: a replica thread may be capturing
            ms = (time.perf_counter() - t0) * 1000.0
            self._ensure_pool(setup.prompt_len)
            self._setups[p.prompt_id] = setup
            self._evict_voices()
        return setup, {"cache_hit": False, "setup_ms": ms}

    def _evict_voices(self) -> None:
        """Drop the least recently used request voices past cfg.prompt_cache_size (registered
        voices stay). Live streams do not need their setup: it was copied into their slot."""
        extra = [k for k in self._setups if k not in self._prompt_wavs]
        for key in extra[: max(0, len(extra) - self.cfg.prompt_cache_size)]:
            del self._setups[key]

    def prompt_cache(self) -> dict:
        """Voices held and their bytes (prompt setups), for memory reports."""
        with self._prompt_lock:
            setups = list(self._setups.values())
        tensors = [t for s in setups for t in (s.spk, s.mel, *vars(s.cache).values()) if t is not None]
        return {"entries": len(setups), "bytes": sum(t.numel() * t.element_size() for t in tensors)}

    def prompt_setup(self, prompt_id: str = DEFAULT_PROMPT_ID) -> PromptSetup:
        setup = self._setups.get(prompt_id)
        if setup is None:
            with self._prompt_lock:  # replicas sharing setups build each one once
                setup = self._setups.get(prompt_id)
                if setup is None:
                    if prompt_id not in self._prompt_wavs:
                        raise ValueError(
                            f"error: unknown prompt id {prompt_id!r} (code2wav payload); call "
                            "Token2Wav.register_prompt first"
                        )
                    with self._voice_scope():
                        setup = self._build_setup(self._prompts.build(self._prompt_wavs[prompt_id]))
                    self._setups[prompt_id] = setup
        self._ensure_pool(setup.prompt_len)
        return setup

    def _voice_scope(self):
        """A voice's setup (speaker embedding, prompt mel, setup solve) under the flow's TF32
        flags: unscoped, its convolutions would run with whatever another replica thread's
        scope holds at that moment."""
        return region_scope(self.options.tf32_mode, self.device, region="flow")

    @torch.inference_mode()
    def _build_setup(self, pf: PromptFeatures) -> PromptSetup:
        spk = self.flow.project_speaker(pf.spk_embedding.to(self.device))
        lookahead = torch.full((self.cfg.flow.pre_lookahead_len,), self.cfg.silence_code)
        tokens = torch.cat([pf.tokens.cpu(), lookahead]).to(self.device).unsqueeze(0)
        mel = pf.mel.to(device=self.device, dtype=self.dtype).t().unsqueeze(0)  # [1, 80, 2Tp]
        with region_scope(self.options.tf32_mode, self.device, region="flow"):
            enc = self.flow.encode_chunk(tokens, None, None, last_chunk=False)
            solved = self.flow.decoder.solve(enc.mu, spk, mel, cnn_cache=None, att_cache=None)
        cache = FlowCache(enc.cnn_cache, enc.att_cache, solved.cnn_cache, solved.att_cache)
        return PromptSetup(pf, spk, mel, mel.shape[2], cache)

    def _ensure_pool(self, prompt_len: int) -> None:
        if self.pool is None:
            frames = prompt_len + self.cfg.prompt_keep_frames
            self.pool = SlotPool(self.cfg, device=self.device, dtype=self.dtype, frames=frames,
                                 capacity=self._initial_slots,
                                 estimator_dtype=self.flow.decoder.estimator.in_proj.weight.dtype)
            self._decoder = ChunkDecoder(self.flow, self.hift, self.pool, self.cfg, self.options,
                                         prompt_len=prompt_len, copy=self.cache_copy)
        elif self._decoder.keep.prompt_len != prompt_len:
            raise ValueError(
                f"error: a prompt of {prompt_len} mel frames, the others have "
                f"{self._decoder.keep.prompt_len} (code2wav prompt setup); every reference is "
                "normalised to ref_audio_max_seconds, so this is a bug"
            )

    # -- streaming -------------------------------------------------------------------------------

    def drop(self, request_id: str) -> None:
        self._prepared.pop(request_id, None)
        stream = self._requests.pop(request_id, None)
        if stream is not None:
            self.pool.release(stream.slot)

    @property
    def active_requests(self) -> int:
        return len(self._requests)

    def decode(self, payloads: Sequence[CodecPayload]) -> list[DecodedAudio]:
        """Decode one step's payloads (at most one per request); output in input order."""
        try:
            for p in payloads:  # validate everything before touching any state
                self._validate(p, payloads)
            streams = [self._admit(p) for p in payloads]
        except BaseException:
            for p in payloads:  # a batch that fails here admits nothing: release its voices
                self._prepared.pop(p.request_id, None)
            raise
        if self.pool.generation != self._graph_generation and self.graphs is not None:
            self.graphs.invalidate()  # the pool grew: captured addresses are stale (before planning)
            self._graph_generation = self.pool.generation
        groups: dict[BatchShape, list[int]] = {}
        for i, p in enumerate(payloads):
            groups.setdefault(self.chunk_shape(p), []).append(i)
        # Every group is queued before the first copy back, replays first (launch_plan.py), so
        # the device runs them while the host launches an eager group (~10k launches). Safe: a
        # replayed group's outputs are copied out of its graph as soon as it is queued.
        launched = []
        for launch in plan_launches(groups, replays=self._replays, final_shapes=self.final_shapes):
            idx = list(launch.rows)
            items, group = [payloads[i] for i in idx], [streams[i] for i in idx]
            t0, replays = time.perf_counter(), self.graphs.replays if self.graphs is not None else 0
            launched.append((idx, items, group, self._launch_group(launch.shape, items, group)))
            replayed = self.graphs is not None and self.graphs.replays > replays
            self._work.add_host("replay_launch_s" if replayed else "eager_launch_s", time.perf_counter() - t0)
        t0 = time.perf_counter()
        out: list[DecodedAudio | None] = [None] * len(payloads)
        for idx, items, group, chunk in launched:
            for i, audio in zip(idx, self._finish_group(chunk, items, group)):
                out[i] = audio
        self._work.add_host("finish_s", time.perf_counter() - t0)
        return out  # type: ignore[return-value]

    def _replays(self, shape: BatchShape) -> bool:
        return self.graphs is not None and shape in self.graphs

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
            if p.request_id not in self._prepared:  # prepared by the caller already, or now
                self.prepare(p)  # unknown prompt ids and bad voices fail here, before any state
        elif p.prompt_id != live.prompt_id:
            raise Code2WavPayloadError(
                p.request_id, p.chunk_seq, f"prompt id changed to {p.prompt_id!r} mid-stream",
                "keep one prompt per stream",
            )  # fmt: skip

    def _admit(self, p: CodecPayload) -> LiveStream:
        if p.chunk_seq != 0:
            return self._requests[p.request_id]
        setup = self._prepared.pop(p.request_id)  # by _validate at the latest
        self.drop(p.request_id)  # a new epoch of a live stream starts from scratch
        slot = self.pool.acquire()
        self._load_setup(slot, setup)
        caches = start_shape(setup.prompt_len)
        stream = LiveStream(p.prompt_id, -1, slot, vocoder_seed(self._init_seed, p.seed), caches)
        self._requests[p.request_id] = stream
        return stream

    @torch.inference_mode()
    def _load_setup(self, slot: int, setup: PromptSetup) -> None:
        """A fresh stream's state: the voice's prompt caches and speaker row (HiFT starts empty)."""
        pool, c, length = self.pool, setup.cache, setup.prompt_len
        pool["conformer_cnn"][slot].copy_(c.conformer_cnn[0])
        pool["conformer_att"][:, slot, :, :length].copy_(c.conformer_att[:, 0])
        pool["estimator_cnn"][:, :, 2 * slot : 2 * slot + 2].copy_(c.estimator_cnn)
        pool["estimator_att"][:, :, 2 * slot : 2 * slot + 2, :, :length].copy_(c.estimator_att)
        pool["spk"][slot].copy_(setup.spk[0])

    def _launch_group(self, shape: BatchShape, items: list[CodecPayload], streams: list[LiveStream]) -> ChunkOut:
        """Queue one group's chunk on the device (a graph replay, or eager); nothing waits."""
        meta = torch.tensor(
            [[*p.codes, s.slot, s.noise_seed, p.chunk_seq] for p, s in zip(items, streams)], dtype=torch.long
        )
        assert meta.shape[1] == shape.tokens + META_EXTRA
        # Queued: a pageable copy would wait for this replica's launched groups to finish (before
        # a replay as before an eager run).
        meta = host_to_device(meta, self.device)
        eager = self.graphs is None or (shape.last and shape not in self.final_shapes)
        kind = group_kind(last=shape.last, first=shape.hift_frames == 0, steady=self._decoder.settled(shape))
        self._work.count(kind, eager_final=eager and shape.last)
        if eager:  # a final chunk's shape varies with its length: only the warmed ones have graphs
            return self._decoder.run(meta, shape)
        return self.graphs.run(shape, meta, lambda m: self._decoder.run(m, shape))

    def _finish_group(self, out: ChunkOut, items: list[CodecPayload], streams: list[LiveStream]) -> list[DecodedAudio]:
        """Copy a launched group's audio back (waits for it) and advance its streams."""
        # The mel comes back too (a fifth of the audio's bytes), so every chunk carries its mel
        # digest: queued ahead of the audio, so the group costs one wait for the device.
        mel, audio = device_to_host(out.mel, out.audio)
        audio = audio.numpy()  # one copy for the whole batch
        return [self._advance(p, s, r, audio, mel, out.mel.shape[2]) for r, (p, s) in enumerate(zip(items, streams))]

    def _advance(self, p: CodecPayload, s: LiveStream, row: int, audio, mel: torch.Tensor, frames: int) -> DecodedAudio:
        s.chunk_seq = p.chunk_seq
        if p.last_chunk:
            self.drop(p.request_id)
        else:
            s.caches = self._decoder.next_shape(s.caches, frames)
        row_mel = mel[row].contiguous()
        digest = hashlib.sha256(row_mel.numpy().tobytes()).hexdigest()
        return DecodedAudio(p.request_id, p.chunk_seq, np.ascontiguousarray(audio[row]), p.last_chunk,
                            row_mel if self.keep_mel else None, digest)

    def warm_graphs(self, max_rows: int) -> int:
        """Capture this replica's chunk graphs for 1..`max_rows` rows before it serves; returns
        how many were captured (`graph_warmup.warm_graphs`)."""
        return warm_graphs(self, max_rows)

    def stream_shape(self, request_id: str) -> BatchShape:
        """The cache lengths of a live stream's next chunk (rows and tokens unset)."""
        return self._requests[request_id].caches

    def step_shape(self, p: CodecPayload) -> Hashable | None:
        """The key of the group `p` would join in a decode call (`stream_state.step_key`): what
        a replica choosing steps of one shape compares (`runner.one_shape_steps`)."""
        return step_key(self._requests.get(p.request_id), p)

    def chunk_shape(self, p: CodecPayload, rows: int = 0) -> BatchShape:
        """The shape `p` is decoded with (its stream admitted; `rows` as given): the key that
        groups a decode call's payloads, and with `rows` the group's graph key."""
        return self._requests[p.request_id].chunk_shape(p, rows)

    # -- non-streaming reference -----------------------------------------------------------------

    @torch.inference_mode()
    def reference(self, codes: Sequence[int], prompt_id: str = DEFAULT_PROMPT_ID) -> DecodedAudio:
        """Decode all `codes` in one pass (the streaming run's block-causal masks, no caches,
        no trim, one HiFT call over the whole mel). Equals streaming when the streamed caches
        never reach the trim (see tests/stages/test_token2wav.py for the tolerances)."""
        setup = self.prompt_setup(prompt_id)
        c, tp = self.cfg, int(setup.features.tokens.numel())
        new = list(codes)
        blocks, left = [tp, *emitted_tokens(c, len(new))], c.codec_left_context_frames
        stream = [*setup.features.tokens.tolist(), *[c.silence_code] * left, *new]
        tokens = torch.tensor([stream], dtype=torch.long).to(self.device)
        mel = self.flow.reference_mel(tokens, setup.mel, setup.spk, blocks)
        gen = torch.Generator(device=self.device).manual_seed(0)
        empty = mel.new_zeros(1, 1, 0).float()
        audio, _ = self.hift.inference(mel.float(), empty, generator=gen)
        return DecodedAudio("reference", 0, audio[0].cpu().numpy(), True, mel[0].float().cpu())
