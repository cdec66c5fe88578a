"""Replica placement over devices (`runner.devices`) and the execution-model choice."""

from __future__ import annotations

import dataclasses

import pytest

from stages.config import RunnerConfig, StageConfig
from stages.runner.placement import place, resolve_devices
from stages.runner.process import ProcessSpec
from stages.runner.runner import resolve_execution
from stages.runner.fakes import fake_factories


def test_talker_on_the_first_device_and_replicas_round_robin():
    plan = place((0, 1, 2, 3), replicas=8)
    assert plan.talker == 0 and plan.replicas == (0, 1, 2, 3, 0, 1, 2, 3)
    assert place((2, 5), replicas=3).replicas == (2, 5, 2)
    assert place((0,), replicas=4).replicas == (0, 0, 0, 0)


def test_one_replica_per_gpu_on_an_eight_gpu_host():
    plan = place(resolve_devices("auto", visible=8), replicas=8)
    assert plan.replicas == tuple(range(8)) and plan.talker == 0


def test_device_lists_resolve_against_the_visible_count():
    assert resolve_devices(None, visible=8) == (0,)
    assert resolve_devices("auto", visible=0) == (0,)  # a CPU machine: everything on "device 0"
    assert resolve_devices((1, 3), visible=4) == (1, 3)
    with pytest.raises(ValueError, match="names device 4 but 4 are visible"):
        resolve_devices((0, 4), visible=4)


def test_each_process_computes_its_engines_devices_from_the_plan(monkeypatch):
    import stages.runner.process as process

    monkeypatch.setattr(process, "device_count", lambda kind: 4)
    cfg = StageConfig(runner=RunnerConfig(devices=(0, 1, 2, 3)))
    spec = lambda ids: ProcessSpec("x", cfg, fake_factories(), 1, ids, 8)  # noqa: E731
    assert spec(()).device_indices() == (0,)  # the talker
    assert spec((5,)).device_indices() == (1,)  # replica 5 of 8 as its own process
    assert spec(tuple(range(8))).device_indices() == (0, 1, 2, 3, 0, 1, 2, 3)  # the threads' host
    # runner.execution=single: the talker's device first (the process's own), then the replicas'
    single = ProcessSpec("stages", cfg, fake_factories(), 1, tuple(range(8)), 8, hosts_talker=True)
    assert single.device_indices() == (0, 0, 1, 2, 3, 0, 1, 2, 3)
    assert single.replica_device_indices() == (0, 1, 2, 3, 0, 1, 2, 3)


def test_runner_config_checks_devices_and_execution():
    with pytest.raises(ValueError, match="runner.devices"):
        RunnerConfig(devices=())
    with pytest.raises(ValueError, match="runner.execution"):
        RunnerConfig(execution="fibers")  # type: ignore[arg-type]


def test_auto_execution_stays_processes_until_measured_otherwise():
    assert resolve_execution(RunnerConfig(device="cpu")) == "processes"
    assert resolve_execution(RunnerConfig(device="cuda")) == "processes"
    assert resolve_execution(dataclasses.replace(RunnerConfig(), execution="threads", device="cuda")) == "threads"


def test_the_runner_keeps_each_replica_host_on_one_device(monkeypatch):
    """What the parent hands `replica_groups`: the children's plan, or None where no host spans
    devices. Only `auto` asks for the device count (here four, forced)."""
    import stages.runner.runner as runner_module
    from stages.runner.runner import StageRunner

    def runner(**cfg):
        return StageRunner(StageConfig(runner=RunnerConfig(device="cpu", **cfg)), replicas=8,
                           factories=fake_factories())

    asked = []
    monkeypatch.setattr(runner_module, "device_count", lambda kind: asked.append(kind) or 4)
    assert runner(devices=(0, 1), replicas_per_process=4)._replica_devices() == (0, 1) * 4
    assert asked == []  # an explicit list is the children's to check
    assert runner(devices="auto", replicas_per_process=2)._replica_devices() == (0, 1, 2, 3) * 2
    assert asked == ["cpu"]
    assert runner(devices=None, replicas_per_process=4)._replica_devices() is None  # all on one
    assert runner(devices=(0, 1), replicas_per_process=1)._replica_devices() is None  # no hosts
    assert runner(devices=(0, 1), execution="threads")._replica_devices() is None
