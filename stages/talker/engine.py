"""The talker engine: requests in, one codec code per active request per `step()` out.

The runner drives it as a loop (continuous batching):

    engine = TalkerEngine(cfg, device=dev, dtype=torch.bfloat16, max_batch=64, max_seq_len=1024)
    engine.add(TalkerRequest("r1", "Hello there."))
    while engine.has_work():
        for out in engine.step():   # out.code is an int, or None with out.finished=True
            ...

A request added between steps is admitted at the next `step()`: its condition rows, padded to
a length bucket (`prefill_length`), are prefilled into a free cache slot (one forward per new
request; a device graph per bucket with stage extra `talker_prefill_graph`, the default), and
the code sampled at its last
prefill row (audio_bos) is its code #0, drawn in the same batched sampling call as the decode
rows of the requests already running. Every later step decodes all occupied rows together, each
at its own position; EOS is never emitted, a finished request is reported once with
`code=None, finished=True` and its slot is freed at once. A request whose admission fails
(its prefill raised) is reported once the same way with `error` set, and the others run on;
`add` refuses what cannot run (duplicate id, no cache room, a seed outside [0, 2**63)) with a
TalkerRequestError, the request's own fault.

Ladder: `step` -> `_admit` (tokenize done at `add`; `_prefill`) -> `_logits` (`_decode_logits`:
eager, or a device graph with stage extra `talker_decode_graph: true`; either runs the fused
layers `stages.talker.kernels.resolve` chose with stage extra `talker_fused_layers`) -> sampler
(`CodecSampler.sample`) -> one host read of (sample, emit, finished).

Weights: `weights_dir=None` -> seeded random init (`TalkerModel.init_random_weights` with a CPU
`torch.Generator(init_seed)`, built on CPU then moved: identical in every process and run), the
word-level stand-in tokenizer and the length model (EOS only at the budget). With a weights dir:
the official `tts.*` weights, its tokenizer.json, and the model's own EOS (max_tokens caps).
Thinker hidden states come from the documented stand-in either way (`thinker_standin.py`).

Prelude: `prelude=None` lets the stage extra `talker_codec_fused_prelude` (strict boolean,
default true) choose via `stages.talker.kernels.resolve` (`prelude.choose_prelude`); pass a
function to force one. The stage flags are the config's parsed `cfg.options`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, replace

import torch

from stages.admission import MAX_SEED
from stages.platform.device import host_to_device, timing_event
from stages.platform.graphs import graph_api
from stages.platform.precision import precision_scope
from stages.precision import TALKER_TF32, talker_precision
from stages.talker import kernels, options
from stages.talker.config import TalkerConfig
from stages.talker.decode_graph import DecodeGraphs
from stages.talker.length import codec_budget
from stages.talker.model import TalkerModel
from stages.talker.prefill_graph import PrefillGraphs
from stages.talker.prelude import PreludeChoice
from stages.talker.sampling import CodecSampler, Prelude, SamplerState
from stages.talker.thinker_standin import standin_hidden
from stages.talker.tokenizer import load_tokenizer
from stages.talker.weights import load_talker_weights

logger = logging.getLogger(__name__)

# Stage extras (see stages.talker.options): the fused (default) or eager penalty + temperature
# prelude, and device graphs for the decode and prefill forwards (CUDA/NPU; ignored on CPU).
FUSED_PRELUDE_FLAG, DECODE_GRAPH_FLAG = options.FUSED_PRELUDE_FLAG, options.DECODE_GRAPH_FLAG

# Decode reads cache[:, :, :kv_len] with kv_len rounded up to this many positions, so the number
# of distinct attention shapes (and of graphs a runner would capture) stays small.
KV_LEN_BUCKET = 64

# A prefill runs on its condition rows padded with zero rows to a multiple of this (at most
# max_seq_len), so prefill graphs need few shapes (<= max_seq_len / 32) and the eager path runs
# the same shapes as the graphs. Padding follows the request's rows and attention is causal, so
# its rows see only themselves; the padding's cache writes are overwritten by decode before
# they could be read.
PREFILL_LEN_BUCKET = 32


def prefill_length(rows: int, max_seq_len: int) -> int:
    """The padded length a request with `rows` condition rows is prefilled at."""
    return min(max_seq_len, -(-rows // PREFILL_LEN_BUCKET) * PREFILL_LEN_BUCKET)


class TalkerRequestError(ValueError):
    """A request the engine cannot take (duplicate id, no cache room, bad max_codes or seed).

    The request's own fault, not the engine's: the runner reports it as `invalid_request`."""

    request_fault = True



@dataclass(frozen=True)
class TalkerRequest:
    request_id: str
    text: str
    seed: int = 42
    max_codes: int | None = None  # random weights: exact length; real weights: a cap


@dataclass(frozen=True)
class TalkerOutput:
    request_id: str
    code: int | None  # None exactly when finished
    finished: bool
    error: str | None = None  # set (with finished) when this request failed alone at admission


@dataclass
class _Prepared:
    """A request tokenized and budgeted at `add`, waiting for a slot."""

    request: TalkerRequest
    token_ids: list[int]
    budget: int  # most codes it emits
    ignore_eos: bool


@dataclass
class _Running:
    request: TalkerRequest
    generator: torch.Generator
    position: int  # next cache position this row writes (host mirror of the device `_pos`)
    fresh: bool  # prefilled this step: its hidden comes from the prefill, not a decode


def build_model(
    cfg: TalkerConfig, *, device: torch.device, dtype: torch.dtype, init_seed: int,
    weights_dir: str | None,
) -> TalkerModel:
    """Seeded random (built on CPU) or official weights (built on meta, assign-loaded)."""
    if weights_dir is None:
        model = TalkerModel(cfg)
        model.init_random_weights(torch.Generator().manual_seed(init_seed))
    else:
        with torch.device("meta"):
            model = TalkerModel(cfg)
        load_talker_weights(model, weights_dir)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.fold_weight_norm()
    return model


class TalkerEngine:
    def __init__(
        self,
        cfg: TalkerConfig,
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_batch: int,
        max_seq_len: int,
        init_seed: int = 0,
        weights_dir: str | None = None,
        prelude: Prelude | None = None,
    ) -> None:
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.init_seed = init_seed
        # Stage flags first: a typo fails before any weights are built (seed item 4).
        opts = cfg.options
        self.model = build_model(
            cfg, device=device, dtype=dtype, init_seed=init_seed, weights_dir=weights_dir
        )
        self.model.setup_caches(
            max_batch=max_batch, max_seq_len=max_seq_len, device=device, dtype=dtype
        )
        # Before any graph is captured: the decode graphs record whichever layers this picks. The
        # stage config decides the prelude too (seed item 1), unless one is given.
        self.kernels = kernels.resolve(opts, self.model, device, prelude=prelude)
        self.model.use_kernels(self.kernels)
        logger.info("talker decode layers: %s", self.kernels.layers.reason)
        self.tokenizer = load_tokenizer(weights_dir, cfg.standin_text_vocab)
        self.sampler = CodecSampler(cfg.sampling, eos_id=cfg.eos_token_id, prelude=self.kernels.prelude.fn)
        self.state = SamplerState.allocate(
            max_batch, cfg.sampling.history_window, device, vocab=cfg.num_audio_tokens
        )
        self.random_weights = weights_dir is None
        api = graph_api(device)  # None on CPU: both forwards eager
        self.graphs = (DecodeGraphs(self.model, api, max_batch=max_batch, device=device)
                       if api is not None and opts.decode_graph else None)
        self.prefill_graphs = (PrefillGraphs(self.model, api, max_seq_len=max_seq_len, device=device, dtype=dtype)
                               if api is not None and opts.prefill_graph else None)
        logger.info("talker graphs on %s: decode %s, prefill %s", api.platform if api else device.type,
                    self.graphs is not None, self.prefill_graphs is not None)
        # Row r's cache slot as a [1] tensor view (`_slot_ids[r:r+1]`): prefills take the slot
        # as a tensor, so one graph serves every slot and no host scalar is copied.
        self._slot_ids = torch.arange(max_batch, device=device)
        self._active = torch.zeros(max_batch, dtype=torch.bool, device=device)
        self._fresh = torch.zeros(max_batch, dtype=torch.bool, device=device)
        self._pos = torch.zeros(max_batch, dtype=torch.long, device=device)
        self._prev = torch.zeros(max_batch, dtype=torch.long, device=device)  # decode input ids
        # Logits of each row's prefill (its code #0), consumed in the step that admitted it.
        self._fresh_logits = torch.zeros(max_batch, cfg.num_audio_tokens, device=device)
        self._slots: list[_Running | None] = [None] * max_batch
        self._pending: deque[_Prepared] = deque()
        self._failed: list[TalkerOutput] = []  # admissions that failed, reported by the next step
        # Host seconds inside `step()`: admitting (prefill launches) and waiting in the host read
        # for the device (the step's kernels, queued prefills, and whatever delays them there).
        self.admit_s = 0.0
        self.device_wait_s = 0.0
        # Device seconds from a step's first command to its result, on the talker's stream (not
        # on CPU). Against the host's step time it says where a slow step is lost: a span near
        # the step time is the device (or launches) being slow, a short one is the host (the
        # GIL of a process shared with replica threads, admission) keeping the device waiting.
        self._span_marks = (timing_event(device), timing_event(device))
        self.device_span_s = 0.0

    # -- public API ----------------------------------------------------------------------------
    @property
    def prelude(self) -> Prelude:
        """The penalty + temperature function in use (swap it to A/B the fused kernel)."""
        return self.sampler.prelude

    @prelude.setter
    def prelude(self, fn: Prelude) -> None:
        self.sampler.prelude = fn
        self.kernels = replace(self.kernels, prelude=PreludeChoice(fn, "set on the engine"))

    def describe(self) -> dict:
        """What runs: weights source, prelude, sizes (for the run record)."""
        cache = self.model.model.layers[0].self_attn.kv_cache
        kv_bytes = 2 * len(self.model.model.layers) * cache.k.numel() * cache.k.element_size()
        return {
            "weights": "random" if self.random_weights else "official",
            "init_seed": self.init_seed,
            "prelude": getattr(self.prelude, "__name__", type(self.prelude).__name__),
            "decode_graph": self.graphs is not None,
            "prefill_graph": self.prefill_graphs is not None,
            "fused_layers": self.model.layer_kernels is not None,
            # Why those branches run and the others do not (kernels.resolve's words, as logged).
            "kernel_reasons": self.kernels.reasons(),
            "params": sum(p.numel() for p in self.model.parameters()),
            "max_batch": self.max_batch,
            "max_seq_len": self.max_seq_len,
            "kv_cache_mib": kv_bytes / 2**20,
            "precision": talker_precision(self.device, self.dtype),  # read off torch's flags
        }

    def add(self, req: TalkerRequest) -> None:
        """Queue `req`; it is admitted (prefilled) at the start of the next `step()`."""
        if self._find(req.request_id) is not None:
            raise TalkerRequestError(
                f"error: duplicate request id {req.request_id!r} (talker); use unique ids"
            )
        if req.max_codes is not None and req.max_codes < 0:
            raise TalkerRequestError(
                f"error: max_codes must be >= 0, got {req.max_codes} (request {req.request_id!r})"
                "; pass None for the default"
            )
        if not (isinstance(req.seed, int) and 0 <= req.seed < MAX_SEED):
            raise TalkerRequestError(
                f"error: seed must be an integer in [0, 2**63), got {req.seed!r} (request "
                f"{req.request_id!r}); pass a smaller seed"
            )
        self._pending.append(self._prepare(req))

    def work(self) -> dict:
        """Cumulative host seconds of `step()` spent admitting and waiting for the device, and
        where the device can time it, the steps' device span (the runner's work report,
        stages.runner.work)."""
        counters = {"admit_s": self.admit_s, "device_wait_s": self.device_wait_s}
        if self._span_marks[0] is not None:
            counters["device_span_s"] = self.device_span_s
        return counters

    def has_work(self) -> bool:
        return bool(self._pending or self._failed) or any(s is not None for s in self._slots)

    def cancel(self, request_id: str) -> None:
        """Drop a queued or running request; it produces no further outputs. Unknown ids: no-op."""
        self._pending = deque(p for p in self._pending if p.request.request_id != request_id)
        for slot, run in enumerate(self._slots):
            if run is not None and run.request.request_id == request_id:
                self._free(slot)

    @torch.inference_mode()
    def step(self) -> list[TalkerOutput]:
        """Admit waiting requests, decode every running row once, sample, report. A request
        whose admission (prefill) fails is reported finished with its `error`; the others run."""
        first, last = self._span_marks
        if first is not None:
            first.record()
        # The launches run under the talker's TF32 flags (none): with `runner.execution: single`
        # code2wav's threads share this process's flags (stages.platform.precision); the host
        # read below holds no scope.
        with precision_scope(self.device, TALKER_TF32):
            t0 = time.perf_counter()
            self._admit()
            self.admit_s += time.perf_counter() - t0
            failed, self._failed = self._failed, []
            occupied = [i for i, s in enumerate(self._slots) if s is not None]
            if not occupied:
                return failed
            packed = self._launch_step(occupied[-1] + 1)
        if last is not None:
            last.record()
        t0 = time.perf_counter()
        host = packed.tolist()  # the one host read per step
        self.device_wait_s += time.perf_counter() - t0
        if first is not None:
            self.device_span_s += first.elapsed_time(last) / 1000.0  # both done: the read synced
        return failed + self._report(occupied, *host)

    def _launch_step(self, rows: int) -> torch.Tensor:
        """Decode and sample rows [0, rows); [3, rows] (sample, emit, finished) on the device."""
        logits = self._logits(rows)
        generators = [s.generator if s is not None else None for s in self._slots[:rows]]
        result = self.sampler.sample(
            logits, self.state, active=self._active[:rows], generators=generators
        )
        self._prev[:rows] = result.sample
        self._fresh[:rows].fill_(False)  # fill_: `= False` copies a host scalar, which syncs
        return torch.stack([result.sample, result.emit.long(), result.finished.long()])

    # -- ladder --------------------------------------------------------------------------------
    def _prepare(self, req: TalkerRequest) -> _Prepared:
        ids = self.tokenizer.encode(req.text)
        cond_len = len(ids) + 2  # + text_eos, audio_bos
        if self.random_weights:
            budget = codec_budget(req.text, self.cfg) if req.max_codes is None else req.max_codes
        else:
            cap = self.cfg.sampling.max_tokens if req.max_codes is None else req.max_codes
            budget = max(0, min(cap, self.max_seq_len - cond_len))  # spec §2.3 context bound
        # Room for the condition rows and every decode input (the last sample needs none).
        if cond_len + max(budget, 1) > self.max_seq_len:
            raise TalkerRequestError(
                f"error: request {req.request_id!r} needs {cond_len} condition rows + {budget} "
                f"codes but max_seq_len is {self.max_seq_len} (talker); raise max_seq_len or "
                "shorten the text"
            )
        return _Prepared(req, ids, budget, ignore_eos=self.random_weights)

    def _admit(self) -> None:
        while self._pending:
            slot = next((i for i, s in enumerate(self._slots) if s is None), None)
            if slot is None:
                return
            prep = self._pending.popleft()
            try:
                self._prefill(slot, prep)
            except Exception as exc:  # this request's prefill: it fails alone, the batch runs on
                logger.warning("talker: admitting %s failed: %s", prep.request.request_id, exc)
                self._free(slot)
                self._failed.append(TalkerOutput(prep.request.request_id, None, True,
                                                 error=f"{type(exc).__name__}: {exc}"))

    def _prefill(self, slot: int, prep: _Prepared) -> None:
        req, cfg = prep.request, self.cfg
        # Queued, not waited for: a blocking copy would wait for the prefills already launched.
        ids = host_to_device(torch.tensor(prep.token_ids, dtype=torch.long), self.device)
        hidden = standin_hidden(prep.token_ids, llm_dim=cfg.llm_dim, seed=self.init_seed)
        cond = self.model.condition(ids, host_to_device(hidden, self.device))  # [L, D]
        rows = cond.shape[0]
        padded = torch.nn.functional.pad(cond, (0, 0, 0, prefill_length(rows, self.max_seq_len) - rows))
        slot_id = self._slot_ids[slot : slot + 1]
        if self.prefill_graphs is not None:
            hidden_rows = self.prefill_graphs.run(padded, slot_id)
        else:
            hidden_rows = self.model.prefill_rows(padded, slot_id)
        # Read (queued) before anything else replays the graph: its output is overwritten then.
        self._fresh_logits[slot] = self.model.code_logits(hidden_rows[rows - 1 : rows])[0]
        self.sampler.admit(self.state, slot, limit=prep.budget + 1, ignore_eos=prep.ignore_eos)
        gen = torch.Generator(device=self.device).manual_seed(req.seed)
        self._slots[slot] = _Running(req, gen, position=cond.shape[0], fresh=True)
        self._active[slot].fill_(True)  # fill_, not `= True`: see CodecSampler.admit
        self._fresh[slot].fill_(True)
        self._pos[slot].fill_(cond.shape[0])

    def _logits(self, rows: int) -> torch.Tensor:
        """Logits [rows, V] fp32 to sample from: a decode of each running row's previous
        sample, or the prefill's last row for rows admitted this step."""
        running = [s for s in self._slots[:rows] if s is not None]
        if all(s.fresh for s in running):
            logits = self._fresh_logits[:rows]
        else:
            top = max(s.position for s in running if not s.fresh) + 1
            kv_len = min(self.max_seq_len, -(-top // KV_LEN_BUCKET) * KV_LEN_BUCKET)
            decoded = self._decode_logits(rows, kv_len)
            logits = torch.where(self._fresh[:rows, None], self._fresh_logits[:rows], decoded)
            self._pos[:rows] += (self._active[:rows] & ~self._fresh[:rows]).long()
        for s in running:
            s.position += not s.fresh
            s.fresh = False
        return logits

    def _decode_logits(self, rows: int, kv_len: int) -> torch.Tensor:
        if self.graphs is not None:
            return self.graphs.run(self._prev[:rows], self._pos[:rows], kv_len)
        x = self.model.emb_code[0](self._prev[:rows])  # [R, D]
        return self.model.code_logits(self.model.decode(x, self._pos[:rows], kv_len))

    def _report(self, occupied, sample, emit, finished) -> list[TalkerOutput]:
        outputs = []
        for slot in occupied:
            rid = self._slots[slot].request.request_id
            if finished[slot]:
                outputs.append(TalkerOutput(rid, None, True))
                self._free(slot)
            elif emit[slot]:
                outputs.append(TalkerOutput(rid, int(sample[slot]), False))
        return outputs

    def _free(self, slot: int) -> None:
        self._slots[slot] = None
        self._active[slot].fill_(False)
        self._fresh[slot].fill_(False)
        self._pos[slot].fill_(0)  # a free row's dummy decode write must stay inside the cache

    def _find(self, request_id: str) -> object | None:
        for p in self._pending:
            if p.request.request_id == request_id:
                return p
        return next(
            (s for s in self._slots if s is not None and s.request.request_id == request_id), None
        )
