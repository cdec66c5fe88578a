"""The embedded stage runner: the talker + R code2wav replicas (`runner.execution`: processes,
replica threads, or one process for all), on `runner.devices`, sharing a GPU as `runner.sharing`
says (time slices, or clients of a private CUDA MPS daemon).

    from stages.runner import StageRunner, RunnerRequest
    runner = StageRunner(stage_cfg, replicas=2)
    runner.start()
    runner.submit(RunnerRequest("r1", "Hello there."), on_event)   # ChunkReady | RequestError
    runner.stop()

See `runner.py` for the topology and failure semantics, `factories.py` for what each process
builds, `work.py` for the stages' work counters (`runner.work_snapshot()`), and `fakes.py` for
model-free stand-ins used by the tests.
"""

from stages.runner.factories import StageFactories
from stages.runner.messages import ChunkReady, RequestError, RunnerEvent, RunnerRequest
from stages.runner.runner import RunnerError, StageRunner

__all__ = [
    "ChunkReady",
    "RequestError",
    "RunnerError",
    "RunnerEvent",
    "RunnerRequest",
    "StageFactories",
    "StageRunner",
]
