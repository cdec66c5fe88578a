"""The embedded stage runner: one talker process + R code2wav replica processes on one device.

    from stages.runner import StageRunner, RunnerRequest
    runner = StageRunner(stage_cfg, replicas=2)
    runner.start()
    runner.submit(RunnerRequest("r1", "Hello there."), on_event)   # ChunkReady | RequestError
    runner.stop()

See `runner.py` for the topology and failure semantics, `factories.py` for what each process
builds, and `fakes.py` for model-free stand-ins used by the tests.
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
