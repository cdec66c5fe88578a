"""`runner.deterministic` end to end on the tiny stages (CPU), read back through the embedded
backend's describe() (what the run record stores under backends.<arm>): every stage process runs
deterministic kernels with cuDNN pinned and cuBLAS's fixed workspace in its environment, and two
identical requests give identical codes and audio."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from stages.config import RunnerConfig, StageConfig
from stages.runner.fakes import fake_factories
from tests.stages.test_runner_e2e import tiny_cpu_config
from tts_bench.backends.base import SynthesisRequest
from tts_bench.backends.embedded import EmbeddedBackend
from tts_bench.config import BenchConfig

TEXT = "A small boat drifted slowly across the calm grey lake."
PINNED = {"algorithms": True, "warn_only": True, "cudnn_deterministic": True, "cudnn_benchmark": False,
          "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def _bench(stages: StageConfig, **runner) -> BenchConfig:
    stages = dataclasses.replace(stages, runner=dataclasses.replace(stages.runner, torch_threads=1, **runner))
    return dataclasses.replace(BenchConfig(), backend="embedded", stages=stages)


def _run(backend: EmbeddedBackend, requests: list[SynthesisRequest]) -> tuple[list[list], dict]:
    async def scenario():
        await backend.start(replicas=1)
        try:
            # One after the other: the second meets the replica as the first one left it.
            results = [[c async for c in backend.synthesize(r)] for r in requests]
            return results, backend.describe()
        finally:
            await backend.stop()

    return asyncio.run(scenario())


def test_identical_requests_give_identical_audio_under_deterministic_kernels(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # the runner puts it in the children's
    backend = EmbeddedBackend(_bench(tiny_cpu_config(), deterministic=True))
    (first, second), info = _run(backend, [SynthesisRequest("a", TEXT, seed=7), SynthesisRequest("b", TEXT, seed=7)])
    assert [x for c in first for x in c.codes] == [x for c in second for x in c.codes]
    audio = [np.concatenate([c.samples for c in chunks]) for chunks in (first, second)]
    assert len(audio[0]) > 0 and audio[0].tobytes() == audio[1].tobytes()
    assert info["runner"]["deterministic"] is True
    assert set(info["processes"]) == {"talker", "code2wav-0"}
    assert all(p["deterministic"] == PINNED for p in info["processes"].values())
    replica, talker = info["processes"]["code2wav-0"]["code2wav"], info["processes"]["talker"]["talker"]
    assert replica["precision"]["flow"] == replica["precision"]["hift"] == {"cudnn_conv": "fp32", "matmul": "fp32"}
    assert talker["precision"]["matmul"] == "fp32"


def test_without_deterministic_kernels_the_stage_processes_say_so(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    stages = StageConfig(runner=RunnerConfig(device="cpu"))
    backend = EmbeddedBackend(_bench(stages, deterministic=False), factories=fake_factories())
    _, info = _run(backend, [])
    facts = {name: p["deterministic"] for name, p in info["processes"].items()}
    assert facts and all(f["algorithms"] is False and f["CUBLAS_WORKSPACE_CONFIG"] is None for f in facts.values())


def test_the_runner_puts_cublas_fixed_workspace_in_the_stage_environments_before_cuda_starts(monkeypatch):
    from stages.runner import StageRunner

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    on = StageRunner(StageConfig(runner=RunnerConfig(device="cpu")), replicas=1)
    assert ("CUBLAS_WORKSPACE_CONFIG", ":4096:8") in on._spec("talker", 1, ()).env
    off = StageRunner(StageConfig(runner=RunnerConfig(device="cpu", deterministic=False)), replicas=1)
    assert not any(k == "CUBLAS_WORKSPACE_CONFIG" for k, _ in off._spec("code2wav-0", 1, (0,)).env)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own setting is inherited, kept
    assert not any(k == "CUBLAS_WORKSPACE_CONFIG" for k, _ in on._spec("talker", 1, ()).env)
