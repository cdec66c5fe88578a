"""The `embedded` backend: the in-repo MiniCPM-o 4.5 stage runner behind the backend protocol.

`start(R)` spawns the talker process and R code2wav replica processes (`stages.runner`) and
returns once every process has built its model; a process that fails to start raises
BackendError carrying the child's traceback. `synthesize` yields an AudioChunk for every decoded
chunk as it arrives, with the codec tokens behind it (`codes`) so arms can be checked for
identical outputs; a request that fails in a stage raises `RequestFailed("backend_error")`, one
the stages refuse as the request's own fault (a seed outside [0, 2**63), a text too long for
`runner.max_seq_len`) raises `RequestFailed("invalid_request")`: checked here first where that
is possible without the model (random weights), so such a request never reaches a stage.
`health()` says why the runner stopped serving (a stage process died), None while it serves.

Thread hand-off: the runner calls back on its reader thread; each request owns an asyncio.Queue
fed through `loop.call_soon_threadsafe`, so the event loop never blocks on the runner and the
load generator stamps arrival times when the chunk reaches the loop. A request abandoned by the
client (timeout, cancellation) is cancelled in the runner so its codes stop being generated.

    backend = EmbeddedBackend(load_config("configs/ab/default.yaml"))
    await backend.start(replicas=2)
    async for chunk in backend.synthesize(SynthesisRequest("r1", "Hello there.")):
        ...
    backend.memory_snapshot()   # allocator stats of every stage process (the `torch` sampler)
    backend.work_snapshot()     # every stage's loop counters (tts_bench.load.stage_work)
    await backend.stop()
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from stages.admission import MAX_SEED, text_problem
from stages.platform import PlatformError
from stages.runner import (
    BAD_PROMPT,
    INVALID_REQUEST,
    ChunkReady,
    RequestError,
    RunnerError,
    RunnerEvent,
    RunnerRequest,
    StageFactories,
    StageRunner,
)
from tts_bench.backends.base import AudioChunk, RequestFailed, SynthesisRequest
from tts_bench.errors import BackendError
from tts_bench.preflight import check_memory

if TYPE_CHECKING:
    from tts_bench.config import BenchConfig


class EmbeddedBackend:
    """Talker + R code2wav replicas of `cfg.stages`, in child processes of this one."""

    def __init__(self, cfg: BenchConfig, *, factories: StageFactories | None = None) -> None:
        self.cfg = cfg
        self.stages = cfg.stages
        self.factories = factories  # None = the real engines; tests pass stages.runner.fakes
        self.replicas = 0
        self.concurrency: int | None = None  # the tier's C, when told (expect_concurrency)
        self._runner: StageRunner | None = None

    def expect_concurrency(self, concurrency: int) -> None:
        """The requests clients will keep in flight: the replicas size their slot pools for them
        at start (stages.runner.StageRunner), and the memory preflight counts them."""
        self.concurrency = concurrency

    async def start(self, replicas: int) -> None:
        if self._runner is not None:
            raise BackendError("error: embedded backend started twice (start); call stop() first")
        if self.factories is None:  # the real engines: will their memory fit? (exit 2 if not)
            check_memory(self.cfg, replicas=replicas, concurrency=self.concurrency or 1,
                         label=f"the embedded backend with {replicas} replica(s)")
        runner = StageRunner(self.stages, replicas, factories=self.factories, concurrency=self.concurrency)
        try:
            await asyncio.to_thread(runner.start)
        except (RunnerError, PlatformError, ValueError) as exc:
            raise BackendError(str(exc)) from exc
        except asyncio.CancelledError:
            # Ctrl-C while the stages build: the start thread cannot be interrupted, so end
            # what it started from here (at once: nothing is in flight); it then fails and ends.
            runner.stop(timeout_s=0.0)
            raise
        self._runner = runner
        self.replicas = replicas

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await asyncio.to_thread(runner.stop)

    def health(self) -> str | None:
        if self._runner is None:
            return "the embedded backend is not started"
        return self._runner.broken

    def check_request(self, request: SynthesisRequest) -> None:
        """Refuse what the stages would refuse as the request's own fault, before any stage
        sees it (`stages.admission`): RequestFailed("invalid_request")."""
        if not 0 <= request.seed < MAX_SEED:
            raise RequestFailed("invalid_request", f"seed must be in [0, 2**63), got {request.seed}")
        problem = text_problem(request.text, self.stages)
        if problem is not None:
            raise RequestFailed("invalid_request", f"the input {problem}; shorten the input")

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioChunk]:
        runner = self._runner
        if runner is None:
            raise BackendError("error: embedded backend not started (synthesize); call start()")
        self.check_request(request)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[RunnerEvent] = asyncio.Queue()

        def on_event(event: RunnerEvent) -> None:  # runs on the runner's reader thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

        try:
            runner.submit(_runner_request(request), on_event)
        except ValueError as exc:  # duplicate request id in flight
            raise RequestFailed("backend_error", str(exc)) from exc
        done = False
        sample_rate = self.stages.code2wav.sample_rate
        try:
            while True:
                event = await events.get()
                if isinstance(event, RequestError):
                    done = True
                    raise RequestFailed(_KINDS.get(event.kind, "backend_error"), event.message)
                assert isinstance(event, ChunkReady)
                done = event.last_chunk
                if len(event.audio) or event.codes or event.prompt:
                    yield AudioChunk(event.audio, sample_rate, codes=event.codes, prompt=event.prompt,
                                     mel_sha256=event.mel_sha256)
                if done:
                    return
        finally:
            if not done:
                runner.cancel(request.request_id)

    def describe(self) -> dict:
        t, c, r = self.stages.talker, self.stages.code2wav, self.stages.runner
        processes = dict(self._runner.info) if self._runner is not None else {}
        talker_info = processes.get("talker", {})
        return {
            "backend": "embedded",
            "model": "minicpmo45",
            "replicas": self.replicas,
            "device": talker_info.get("device", r.device),
            "dtype": r.dtype,
            "talker": {
                "hidden_size": t.hidden_size, "num_layers": t.num_layers,
                "num_heads": t.num_heads, "num_kv_heads": t.num_kv_heads,
                "intermediate_size": t.intermediate_size, "num_audio_tokens": t.num_audio_tokens,
                "llm_dim": t.llm_dim,
            },
            "code2wav": {
                "flow_input_size": c.flow.input_size, "flow_blocks": c.flow.num_blocks,
                "flow_up_blocks": c.flow.num_up_blocks, "dit_hidden_size": c.dit.hidden_size,
                "dit_depth": c.dit.depth, "hift_base_channels": c.hift.base_channels,
                "n_timesteps": c.n_timesteps, "codec_chunk_frames": c.codec_chunk_frames,
                "first_chunk_frames": c.first_chunk_frames, "sample_rate": c.sample_rate,
            },
            "runner": dataclasses.asdict(r),
            "flags": {"talker": dict(t.extra), "code2wav": dict(c.extra)},
            "processes": processes,
        }

    def memory_snapshot(self) -> list[dict]:
        """One dict per stage process: process, pid, allocated/reserved/peak/rss bytes, source."""
        return self._runner.memory_snapshot() if self._runner is not None else []

    def work_snapshot(self) -> list[dict]:
        """Every stage's loop counters (stages.runner.work), for tts_bench.load.stage_work."""
        return self._runner.work_snapshot() if self._runner is not None else []


# RequestError kinds of the stages -> the harness's failure kinds.
_KINDS = {INVALID_REQUEST: "invalid_request", BAD_PROMPT: "bad_prompt"}


def _runner_request(request: SynthesisRequest) -> RunnerRequest:
    """The stages' request; its reference voice travels as the encoded file (the replica
    caches voices by content hash, so the same wav is set up once)."""
    return RunnerRequest(request.request_id, request.text, seed=request.seed, prompt_audio=request.voice())
