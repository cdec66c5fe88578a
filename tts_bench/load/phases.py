"""One phase on a fresh backend: the unit `ab`, `mem`, `gate` and `calibrate` repeat.

A phase is one (arm, tier, repeat): build a fresh backend for the arm's config, `start(R)` with
the tier's R replicas, optionally run something first on the started backend (`before`: the
memory run's unsampled warm tier), send the warmup requests (recorded, flagged), then the
measured requests with exactly C in flight (`tts_bench.load.loadgen.run_phase`), record the backend's
`describe()` under run.json `backends.<arm>`, and `stop()` whatever happened (stop also cleans
up after a start that failed half-way). Every finished request goes to `sink` at once (default:
appended to the run's requests.jsonl).

Hooks: `hooks.on_phase(arm, tier, repeat, phase, backend)` is called with phase "warmup" (after
`start`, before the warmup requests), "measure" (before the measured requests) and "end" (after
them, before `stop`). A hooks object may also have `abandon()`: called when the phase raised
after "warmup" (before `stop`), so e.g. memory samplers stop and nothing half-done is recorded.
`tts_bench.mem.hooks.MemoryHooks` and `tts_bench.load.stage_work.StageWorkHooks` are the ones in the
box; `HookChain` runs several.

    warm, measured = plan_jobs(prompts, labels, seed=cfg.bench.seed, warmup=2)
    result = asyncio.run(run_fresh_phase(cfg, Tier(4, 2), labels, (warm, measured), run_dir=run))
    result.records      # the measured requests sent by this call, in completion order

Duration mode (`window`, a `tts_bench.load.windows.WindowPlan`): the measured jobs are a function
from position to job (`tts_bench.load.plan.cycle_jobs`) and the measured phase is ramp, window,
drain (`tts_bench.load.loadwindow`); open loop: `arrivals` (`tts_bench.load.arrivals`). With
`phase_log=True` the phase's `PhaseRecord` (throughput in the window, sub-windows, stability,
validity) is appended to the run's phases.jsonl (`tts_bench.load.windows`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tts_bench.backends import make_backend
from tts_bench.backends.base import SizesForConcurrency
from tts_bench.load.loadgen import run_phase
from tts_bench.load.send import PhaseResult, Sink
from tts_bench.rundir.records import Job, PhaseLabels
from tts_bench.load.windows import WindowPlan, append_phase

if TYPE_CHECKING:
    from tts_bench.backends.base import Backend
    from tts_bench.config import BenchConfig, Tier
    from tts_bench.rundir.results import RunDir

log = logging.getLogger(__name__)


class PhaseHooks(Protocol):
    """Called at each phase boundary (see the module docstring)."""

    def on_phase(self, arm: str, tier: str, repeat: int, phase: str, backend: Any) -> None: ...


async def run_fresh_phase(
    cfg: BenchConfig,
    tier: Tier,
    labels: PhaseLabels,
    jobs: tuple[Sequence[Job], Sequence[Job] | Callable[[int], Job]],
    *,
    run_dir: RunDir,
    sink: Sink | None = None,
    hooks: PhaseHooks | None = None,
    progress: Sink | None = None,
    skip_ids: frozenset[str] | set[str] = frozenset(),
    before: Callable[[Backend], Awaitable[None]] | None = None,
    size_for: int | None = None,
    window: WindowPlan | None = None,
    arrivals: Iterator[float] | None = None,
    phase_log: bool = False,
) -> PhaseResult:
    """Run one phase: `jobs` is (warmup jobs, measured jobs); measured jobs whose id is in
    `skip_ids` (already recorded, on resume) are not sent. Returns the measured phase's result.
    The backend sizes its per-request state for the tier's concurrency, or `size_for` when that
    is larger (requests that `before` sends at a higher concurrency, e.g. mem's warm tier)."""
    warm, measured = jobs
    sink = sink if sink is not None else (lambda rec: run_dir.append_request(rec.to_dict()))
    common = dict(concurrency=tier.concurrency, labels=labels, timeout_s=cfg.bench.timeout_s, sink=sink)
    backend = make_backend(cfg)
    if isinstance(backend, SizesForConcurrency):
        backend.expect_concurrency(max(tier.concurrency, size_for or 0))
    hooked = False  # between the "warmup" and the "end" hook: abandon on the way out
    try:  # stop() also cleans up after a start() that failed half-way (some workers up)
        await backend.start(tier.replicas)
        if before is not None:
            await before(backend)
        hooked = True
        _hook(hooks, labels, "warmup", backend)
        await run_phase(backend, warm, **common)
        _hook(hooks, labels, "measure", backend)
        result = await run_phase(backend, measured, **common, progress=progress, skip_ids=skip_ids,
                                 arrivals=arrivals, window=window)
        _hook(hooks, labels, "end", backend)
        hooked = False
        run_dir.update(backends={**run_dir.doc.get("backends", {}), labels.arm: backend.describe()})
        if phase_log and result.phase is not None:
            append_phase(run_dir, _with_rate(result.phase, arrivals))
        return result
    finally:
        abandon = getattr(hooks, "abandon", None)
        if hooked and callable(abandon):
            abandon()
        await backend.stop()


class HookChain:
    """Several hooks objects as one: each is called in order (and abandoned, if it can be)."""

    def __init__(self, *hooks: PhaseHooks | None) -> None:
        self.hooks = [h for h in hooks if h is not None]

    def on_phase(self, arm: str, tier: str, repeat: int, phase: str, backend: Any) -> None:
        for h in self.hooks:
            h.on_phase(arm, tier, repeat, phase, backend)

    def abandon(self) -> None:
        for h in self.hooks:
            abandon = getattr(h, "abandon", None)
            if callable(abandon):
                abandon()


def _with_rate(phase, arrivals):
    if arrivals is None or phase.request_rate is not None:
        return phase
    return replace(phase, request_rate=arrivals.rate, burstiness=arrivals.burstiness)


def _hook(hooks: PhaseHooks | None, labels: PhaseLabels, phase: str, backend: Any) -> None:
    if hooks is not None:
        hooks.on_phase(labels.arm, labels.tier, labels.repeat, phase, backend)
