"""The embedded stage runner: the talker + R code2wav replicas (`runner.execution`: processes,
replica threads, or one process for all), on `runner.devices`, sharing a GPU as `runner.sharing`
says (time slices, or clients of a private CUDA MPS daemon).

    from stages.runner import StageRunner, RunnerRequest
    runner = StageRunner(stage_cfg, replicas=2)
    runner.start()
    runner.submit(RunnerRequest("r1", "Hello there."), on_event)   # ChunkReady | RequestError
    runner.stop()

This package is what the harness imports of the runner (tests/unit/test_layering.py holds it to
that): the runner and its messages, the failure kinds a RequestError carries, the memory
estimate and device placement its preflight checks before anything starts
(`estimate_stage_memory`, `resolve_devices`, `runs_expandable_segments`), and the arithmetic over
the stages' work counters (`runner.work_snapshot()`: `work_delta`, `per_step`, `eager_groups`,
`eager_label`, `group_kinds`, `kinds_per_step`).
See `runner.py` for the topology and failure semantics, `factories.py` for what each process
builds, and `fakes.py` for model-free stand-ins used by the tests.
"""

from stages.runner.allocator import runs_expandable_segments
from stages.runner.budget import estimate_stage_memory
from stages.runner.factories import StageFactories
from stages.runner.messages import (
    BAD_PROMPT,
    INVALID_REQUEST,
    ChunkReady,
    RequestError,
    RunnerEvent,
    RunnerRequest,
)
from stages.runner.placement import resolve_devices
from stages.runner.runner import RunnerError, StageRunner
from stages.runner.work import (
    GROUP_KIND_KEYS,
    eager_groups,
    eager_label,
    group_kinds,
    kinds_per_step,
    per_step,
    work_delta,
)

__all__ = [
    "BAD_PROMPT",
    "GROUP_KIND_KEYS",
    "INVALID_REQUEST",
    "ChunkReady",
    "RequestError",
    "RunnerError",
    "RunnerEvent",
    "RunnerRequest",
    "StageFactories",
    "StageRunner",
    "eager_groups",
    "eager_label",
    "group_kinds",
    "estimate_stage_memory",
    "kinds_per_step",
    "per_step",
    "resolve_devices",
    "runs_expandable_segments",
    "work_delta",
]
