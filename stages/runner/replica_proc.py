"""A code2wav replica process: batch up to `max_num_seqs` payloads per step, decode, send audio.

Payloads arrive from the talker for the requests pinned here. Each step takes, in arrival order,
at most one payload per request (a request's next chunk needs the state its previous chunk left)
and at most `runner.max_num_seqs` rows (with `runner.one_shape_steps`, rows of one chunk shape
and final chunks: `take_batch`), calls `token2wav.decode`, and sends each row's audio
straight to the client with the new codec tokens behind it (for output-identity checks). The
replica waits for input only when it has nothing pending.

A decode that raises fails exactly the requests in that batch: their states are dropped, and
their later payloads are discarded until the talker's Drop (the client cancels a failed request).

Once the runner stops (`ProcessSpec.stopping`), a replica decodes nothing more and only reads its
inbox until its sentinel, so a stop waits for at most the decode in progress.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stages.audio import PromptError
from stages.runner.budget import pool_slots
from stages.runner.messages import BAD_PROMPT, STAGE_ERROR, ChunkReady, Drop, RequestError, StatsQuery
from stages.runner.process import ProcessSpec, StageContext, drain, run_stage_process, short_error
from stages.runner.work import WorkCounters

log = logging.getLogger(__name__)


def replica_main(spec: ProcessSpec, inbox: Any, results: Any) -> None:
    """Process target (spawn): build Token2Wav and serve payloads until the shutdown sentinel."""
    run_stage_process(spec, results, lambda ctx: warm_replica(ctx, build_token2wav(ctx)),
                      lambda ctx, t2w: ReplicaLoop(ctx, t2w).run(inbox))


def build_token2wav(ctx: StageContext, shared: Any = None) -> Any:
    """The replica's engine on `ctx.device`; `shared`: a replica on the same device (threads of
    one process) whose modules and prompt setups it reuses. Adds the engine's facts to ctx.info."""
    cfg, runner = ctx.spec.cfg, ctx.spec.cfg.runner
    # Slots for the requests the runner will keep here, up front: growing the pool reallocates
    # every cache and drops the captured graphs, so a replica should rarely need to.
    kwargs = dict(device=ctx.device, dtype=ctx.dtype, init_seed=runner.seed, weights_dir=runner.weights,
                  slots=pool_slots(runner.max_num_seqs, ctx.spec.live_per_replica))
    if shared is not None:
        kwargs["shared"] = shared
    t2w = ctx.spec.factories.token2wav(cfg.code2wav, **kwargs)
    # Build the default voice's prompt state now, so "ready" means the first request does not
    # pay for it (it is computed once per prompt id and shared by every request).
    prompt_setup = getattr(t2w, "prompt_setup", None)
    if callable(prompt_setup):
        prompt_setup()
    describe = getattr(t2w, "describe", None)
    options = getattr(t2w, "options", None)  # the parsed stage flags, if the engine keeps them
    if callable(describe):
        ctx.info["code2wav"] = describe()
    elif dataclasses.is_dataclass(options):
        ctx.info["code2wav"] = dataclasses.asdict(options)
    return t2w


def warm_replica(ctx: StageContext, t2w: Any) -> Any:
    """Capture the engine's chunk graphs before the replica reports ready (`warm_graphs`: a
    no-op without device graphs or with `code2wav_graph_warmup: false`); how many and how long
    go into ctx.info["code2wav"]["graph_warmup"]. Returns the engine."""
    warm = getattr(t2w, "warm_graphs", None)
    if callable(warm):
        t0 = time.perf_counter()
        captured = warm(ctx.spec.cfg.runner.max_num_seqs)
        seconds = time.perf_counter() - t0
        if captured:
            ctx.info.setdefault("code2wav", {})["graph_warmup"] = {
                "captured": captured, "seconds": round(seconds, 2),
                "final_shapes": len(getattr(t2w, "final_shapes", ())),  # code2wav_final_chunk_graphs
            }
            log.info("%s: %d chunk graphs captured in %.1f s", ctx.spec.name, captured, seconds)
    return t2w


def voice_stats(engines: list[Any]) -> dict:
    """The voices (prompt setups) these engines hold, for memory reports; engines that share
    their setups (replica threads on one device) are counted once."""
    seen, entries, nbytes = set(), 0, 0
    for t2w in engines:
        cache, key = getattr(t2w, "prompt_cache", None), id(getattr(t2w, "_setups", t2w))
        if callable(cache) and key not in seen:
            seen.add(key)
            held = cache()
            entries, nbytes = entries + held["entries"], nbytes + held["bytes"]
    return {"prompt_cache_entries": entries, "prompt_cache_bytes": nbytes} if seen else {}


def take_batch(pending: deque[Any], max_rows: int, *, first_chunks_first: bool = False,
               shape_of: Callable[[Any], Hashable | None] | None = None) -> list[Any]:
    """Remove and return up to `max_rows` payloads, at most one per request (its oldest): the
    oldest first, or with `first_chunks_first` streams' first chunks (chunk_seq 0) before any
    other, each kind oldest first (`runner.first_chunks_first`). The batch keeps the queue's order.

    With `shape_of` (`runner.one_shape_steps`) the step keeps to one chunk shape: the first payload
    taken fixes it, and a payload of another shape waits for a later step. A payload whose shape is
    None runs alone whatever it is batched with (a final chunk, replayed row by row) and always
    fits. The first payload in the walk's order is always taken, so no request waits forever."""
    queued = list(pending)
    order = range(len(queued))
    if first_chunks_first:  # stable: arrival order within each kind
        order = sorted(order, key=lambda i: queued[i].chunk_seq != 0)
    chosen: set[int] = set()
    seen: set[str] = set()
    step_shape: Hashable | None = None
    for i in order:
        if len(chosen) == max_rows:
            break
        p = queued[i]
        if p.request_id in seen:  # a request's oldest payload decides for it, taken or not
            continue
        seen.add(p.request_id)
        shape = shape_of(p) if shape_of is not None else None
        if shape is not None:
            if step_shape is None:
                step_shape = shape
            elif shape != step_shape:
                continue
        chosen.add(i)
    pending.clear()
    pending.extend(p for i, p in enumerate(queued) if i not in chosen)
    return [p for i, p in enumerate(queued) if i in chosen]


def step_shapes(t2w: Any) -> Callable[[Any], Hashable | None]:
    """`runner.one_shape_steps`' key for `take_batch`: the engine's `step_shape` (the chunk
    shape a payload's group is decoded with; None for a chunk that runs alone anyway)."""
    shape_of = getattr(t2w, "step_shape", None)
    if not callable(shape_of):
        raise TypeError(f"runner.one_shape_steps needs an engine that names its payloads' chunk shapes "
                        f"(step_shape); {type(t2w).__name__} has none")
    return shape_of


@dataclass
class ReplicaLoop:
    ctx: StageContext
    t2w: Any
    pending: deque[Any] = field(default_factory=deque)
    failed: set[str] = field(default_factory=set)  # requests whose decode raised, until Drop
    work: WorkCounters = field(default_factory=WorkCounters)  # rows: payloads in a decode

    def work_snapshot(self) -> dict:
        return self.work.snapshot_with(self.t2w)

    def run(self, inbox: Any) -> None:
        runner = self.ctx.spec.cfg.runner
        max_rows, firsts = runner.max_num_seqs, runner.first_chunks_first
        shape_of = step_shapes(self.t2w) if runner.one_shape_steps else None
        while True:
            stopping = self.ctx.spec.is_stopping()
            for msg in drain(inbox, block=stopping or not self.pending):
                if msg is None:
                    return
                self._handle(msg)
            if stopping or self.ctx.spec.is_stopping():
                # The runner is stopping: decode nothing more, but keep reading. The talker
                # flushes what it queued for us before it exits, and a backlog decoded chunk by
                # chunk between reads made that flush, and so the stop, wait on every decode
                # (seconds each on a loaded CPU: the Ctrl-C test's 10 s flake). Our sentinel
                # comes after the talker is gone.
                self.pending.clear()
                continue
            if self.pending:
                t0 = time.perf_counter()
                ready = len({p.request_id for p in self.pending})  # rows this step could take uncapped
                batch = take_batch(self.pending, max_rows, first_chunks_first=firsts, shape_of=shape_of)
                self._decode(batch)
                # backlog: payloads left waiting (other requests' or later chunks of these)
                self.work.add(len(batch), time.perf_counter() - t0, len(self.pending), ready)

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, list):
            self.pending.extend(p for p in msg if p.request_id not in self.failed)
        elif isinstance(msg, Drop):
            self._drop(msg.request_id)
            self.failed.discard(msg.request_id)
        elif isinstance(msg, StatsQuery):
            self.ctx.report_stats(msg.token, {self.ctx.spec.name: self.work_snapshot()}, voice_stats([self.t2w]))
        else:
            raise TypeError(f"{self.ctx.spec.name} got an unexpected message {type(msg).__name__}")

    def _drop(self, request_id: str) -> None:
        self.pending = deque(p for p in self.pending if p.request_id != request_id)
        self.t2w.drop(request_id)  # unknown ids are a no-op

    def _prepare(self, batch: list[Any]) -> tuple[list[Any], dict[str, dict]]:
        """Set up new streams' voices one request at a time, so a bad reference voice fails
        its own request (kind bad_prompt) and the rest of the batch decodes."""
        kept, prompts = [], {}
        prepare = getattr(self.t2w, "prepare", None)
        for p in batch:
            if p.chunk_seq != 0 or prepare is None:
                kept.append(p)
                continue
            try:
                prompts[p.request_id] = prepare(p)
            except Exception as exc:  # noqa: BLE001 - this request's voice, this request's failure
                kind = BAD_PROMPT if isinstance(exc, PromptError) else STAGE_ERROR
                log.warning("%s: voice of %s refused: %s", self.ctx.spec.name, p.request_id, exc,
                            exc_info=kind == STAGE_ERROR)  # a bad voice is the request's; a stage error is ours
                self._fail(p.request_id, f"{self.ctx.spec.name}: {short_error(exc)}", kind)
                continue
            kept.append(p)
        return kept, prompts

    def _fail(self, request_id: str, message: str, kind: str = STAGE_ERROR) -> None:
        self.failed.add(request_id)
        self._drop(request_id)
        self.ctx.results.send(RequestError(request_id, message, kind))

    def _decode(self, batch: list[Any]) -> None:
        left = self.ctx.spec.cfg.code2wav.codec_left_context_frames
        batch, prompts = self._prepare(batch)
        if not batch:
            return
        try:
            decoded = self.t2w.decode(batch)
        except Exception as exc:
            # The traceback once, here: the requests only carry its last line.
            log.warning("%s: decode of %d rows failed: %s", self.ctx.spec.name, len(batch), exc, exc_info=True)
            message = f"{self.ctx.spec.name}: {short_error(exc)}"
            for p in batch:
                self._fail(p.request_id, message)
            return
        codes = {p.request_id: tuple(int(c) for c in p.codes[left:]) for p in batch}
        for d in decoded:
            audio = np.ascontiguousarray(d.audio, dtype=np.float32).reshape(-1)
            self.ctx.results.send(ChunkReady(d.request_id, d.chunk_seq, audio, codes[d.request_id],
                                             d.last_chunk, prompts.get(d.request_id), d.mel_sha256))
